"""The synthesis-wide backstop: Terraform evaluates only the ``${...}`` gpufleet generated.

The threat is shown with real terraform (only the built-in ``terraform_data`` resource can plan
here): an unescaped user string in a resource input prints the plan runner's environment,
base64-encoded past log masking. The same JSON is refused by ``stacks.interpolation``; the
escaped form (``$${``) plans to the literal text and leaks nothing.
"""

from __future__ import annotations

import base64
import json
import os
import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import clusters
from clusters.errors import UserError
from clusters.schema import StaticIp
from stacks import interpolation
from stacks.interpolation import TEMPLATES, allowed, check_outdir, find, sequences
from stacks.synth import synthesize
from tests.conftest import load_fleet

PAYLOAD = '${base64encode(file("/proc/self/environ"))}'
CANARY = "gpufleet-canary-7f3a9c"


def test_every_interpolation_of_the_example_fleet_is_allowed(fleet_out: Path) -> None:
    """The allow-list is the example fleet's own output: references and base64decode of one."""
    found = []
    for file in sorted(fleet_out.glob("stacks/*/cdk.tf.json")):
        found += [s for s in _all_strings(json.loads(file.read_text())) for s in sequences(s)]
    assert len(found) > 50, "the example fleet should hold many cross-resource references"
    assert all(marker == "${" and allowed(expr) for marker, expr in found), [f for f in found if not allowed(f[1])]
    # base64decode only appears when a GKE scheduler stack pins the IP endpoint's CA (gke.dns_endpoint: false);
    # the reserved pools' precondition is a whole template of its own (clusters.reservation).
    templates = [expr for _, expr in found if any(t.fullmatch(expr) for t in TEMPLATES)]
    assert templates, "the example fleet has reserved pools"
    assert {expr.split("(")[0] for _, expr in found if "(" in expr and expr not in templates} <= {"base64decode"}
    check_outdir(fleet_out)


def _all_strings(node: object) -> list[str]:
    if isinstance(node, dict):
        return [s for k, v in node.items() for s in (k, *_all_strings(v))]
    if isinstance(node, list):
        return [s for v in node for s in _all_strings(v)]
    return [node] if isinstance(node, str) else []


@pytest.mark.parametrize("value", [
    PAYLOAD,
    "prefix ${file(\"/etc/passwd\")} suffix",
    "%{ if true }x%{ endif }",
    "${var.x}${file(\"/x\")}",
    "$$$${file(\"/x\")}",  # terraform console: any run of 2+ '$' before '{' is an escape, nothing is evaluated
    "${google_x.y.name} ${jsonencode(google_x.y)}",
    "${base64decode(file(\"/x\"))}",
])
def test_fails_when_synthesized_json_holds_a_sequence_gpufleet_did_not_generate(value: str) -> None:
    stack = {"resource": {"terraform_data": {"x": {"input": {"labels": {"a": value}}}}}}
    hits = list(find(stack, "cdk.tf.json"))
    if value.startswith("$$$$"):
        assert hits == [], "'$$$${' is literal text to terraform (checked with terraform console)"
        return
    assert hits and hits[0].path == "$.resource.terraform_data.x.input.labels.a"
    assert "\n" not in str(hits[0]) and "did not generate" in str(hits[0])


@pytest.mark.parametrize("value", [
    PAYLOAD, "%{ if true }x%{ endif }", "${var.x}${file(\"/x\")}", "$$$${file(\"/x\")}", "$${file(\"/x\")}",
    "a$%{x}", "%%%{x}", "$$${file(\"/x\")}", "${var.x", "${\"}\"}${file(\"/x\")}", "${google_x.y.name}", "{}$", "x{$}",
])
def test_check_outdir_reports_what_the_walk_reports(tmp_path: Path, value: str) -> None:
    """check_outdir skips the path-building walk for a stack its quick test finds clean: that test must agree with
    ``find`` on values and on keys (a skipped finding would let Terraform evaluate user text)."""
    for stack in ({"resource": {"x": {"labels": [{"a": value}]}}}, {"resource": {"x": {value: "v"}}}):
        (tmp_path / "stacks" / "s").mkdir(parents=True, exist_ok=True)
        (tmp_path / "stacks" / "s" / "cdk.tf.json").write_text(json.dumps(stack))
        expected = [str(hit) for hit in find(stack, str(tmp_path / "stacks" / "s" / "cdk.tf.json"))]
        if expected:
            with pytest.raises(UserError) as caught:
                check_outdir(tmp_path)
            assert str(caught.value) == "\n".join(expected)
        else:
            check_outdir(tmp_path)


def _scan_char_by_char(text: str) -> list[tuple[str, str]]:
    """The scanner before the mark-to-mark jump (main before issue 28's fast path), kept as this file's oracle."""
    found, i = [], 0
    while i < len(text):
        if text.startswith(("$${", "%%{"), i):
            i += 3
        elif text.startswith(("${", "%{"), i):
            end = interpolation._closing(text, i + 2)
            found.append((text[i:i + 2], text[i + 2:end] if end >= 0 else text[i + 2:]))
            i = end + 1 if end >= 0 else len(text)
        else:
            i += 1
    return found


_PIECES = ("$", "%", "{", "}", '"', "\\", "a", ".", "(", ")", " ", "\n", "é", "＄", "\x00", "$${", "%%{", "${", "%{",
           "var.x", "google_x.y.z", "base64decode(", "file(", "${var.x}", "${var.x()}", "${google_x.y.z}")


def _fuzz_string(rng: random.Random) -> str:
    return "".join(rng.choice(_PIECES) for _ in range(rng.randint(0, 40)))


def _fuzz_tree(rng: random.Random, depth: int = 0) -> object:
    roll = rng.random()
    if depth > 3 or roll < 0.4:
        return _fuzz_string(rng) if rng.random() < 0.8 else rng.choice([1, 2.5, None, True])
    if roll < 0.7:
        return [_fuzz_tree(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {_fuzz_string(rng): _fuzz_tree(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def _refused_by_oracle(node: object) -> bool:
    if isinstance(node, dict):
        return any(_refused_by_oracle(k) or _refused_by_oracle(v) for k, v in node.items())
    if isinstance(node, list):
        return any(_refused_by_oracle(v) for v in node)
    return isinstance(node, str) and any(m == "%{" or not allowed(e) for m, e in _scan_char_by_char(node))


def test_the_fast_template_check_refuses_what_the_char_by_char_scan_refused(tmp_path: Path) -> None:
    """Differential fuzz (fixed seed) of the security boundary's fast path against the scanner it replaced:
    every string's sequences, and every stack's verdict through ``check_outdir`` (several stacks per output,
    keys and values, nested lists and maps, repeated expressions across stacks for the per-stack verdict cache)."""
    rng = random.Random(28)
    for _ in range(20000):
        text = _fuzz_string(rng)
        assert list(sequences(text)) == _scan_char_by_char(text), repr(text)
    for round_ in range(300):
        trees = [{"resource": {"x": _fuzz_tree(rng)}} for _ in range(3)]
        out = tmp_path / str(round_)
        for index, tree in enumerate(trees):
            (out / "stacks" / f"s{index}").mkdir(parents=True)
            # odd rounds as JSON.stringify writes (no ASCII escaping): the text scan decides; even rounds
            # escaped (\u00e9 and the like): the parsed tree decides
            (out / "stacks" / f"s{index}" / "cdk.tf.json").write_text(json.dumps(tree, ensure_ascii=round_ % 2 == 0),
                                                                      encoding="utf-8")
        refused = [index for index, tree in enumerate(trees) if _refused_by_oracle(tree)]
        hits = [[str(hit) for hit in find(tree, str(out / "stacks" / f"s{index}" / "cdk.tf.json"))]
                for index, tree in enumerate(trees)]
        assert [index for index, found in enumerate(hits) if found] == refused
        if not refused:
            check_outdir(out)
            continue
        with pytest.raises(UserError) as caught:
            check_outdir(out)
        assert str(caught.value) == "\n".join(line for found in hits for line in found)


def test_the_text_scan_gives_the_parsed_trees_verdict() -> None:
    """``findings`` tests a stack's text without parsing it (``_text_suspect``): over fuzzed trees written as cdktf's
    JSON.stringify writes them (no ASCII escaping, so quotes, backslashes and markers meet in the raw text; compact and
    indented, keys and values), its verdict is ``_suspect``'s of the parsed tree, with the per-literal and
    per-expression memories shared across stacks as in one ``findings``; a text holding a ``\\u`` escape is left to
    the parse. Invalid JSON around a marker is left to the parse too."""
    rng = random.Random(2806)
    literals: dict[str, bool] = {}
    verdicts: dict[str, bool] = {}
    scanned = refused = 0
    for _ in range(4000):
        tree = {"resource": {"x": _fuzz_tree(rng)}}
        for text in (json.dumps(tree, ensure_ascii=False), json.dumps(tree, ensure_ascii=False, indent=2)):
            verdict = interpolation._text_suspect(text, literals, verdicts)
            if "\\u" in text:
                assert verdict is None
                continue
            assert verdict is interpolation._suspect(tree), text
            scanned += 1
            refused += verdict
    assert scanned > 3000 and 500 < refused < scanned - 500
    assert interpolation._text_suspect('{"a": "x"} ${var.x}', {}, {}) is None
    assert interpolation._text_suspect('{"a": "${var.x', {}, {}) is None
    assert interpolation._text_suspect('["\\\\", "${file(\\"/x\\")}"]', {}, {}) is True
    assert interpolation._text_suspect('["\\\\\\"${var.x}"]', {}, {}) is False
    spelled = '["\\u0024{file(\\"/x\\")}"]'  # JSON for "${file(...)}" with its "$" escaped: no "${" in the text
    assert interpolation._text_suspect(spelled, {}, {}) is None and interpolation._suspect(json.loads(spelled))


@pytest.mark.parametrize("text", [
    '{"output": {"leak": {"value": "${file(\\"/etc/hostname\\")}"}}, "output": {}}',
    '{"output": {"leak": {"value": "${file(\\"/etc/hostname\\")}"}}, "output": {"ok": {"value": "\\u00e9"}}}',
], ids=["text scan", "parsed"])
def test_a_repeated_key_is_refused_where_a_parser_would_drop_a_sequence(tmp_path: Path, text: str) -> None:
    """A red team's case: json.loads keeps the last of two ``output`` keys, so the walk saw no sequence, while
    Terraform keeps both blocks and evaluated ``file()`` in the first (``terraform plan`` printed the file). cdktf
    never writes a key twice; a stack that does and holds a sequence is refused, on either path of ``findings``."""
    stack = tmp_path / "stacks" / "s"
    stack.mkdir(parents=True)
    (stack / "cdk.tf.json").write_text(text)
    assert not interpolation._suspect(json.loads(text))
    with pytest.raises(UserError, match="'output' appears twice in one object"):
        check_outdir(tmp_path)


def test_fails_when_a_map_key_holds_an_interpolation() -> None:
    """In JSON syntax object keys inside an expression are templates too."""
    hits = list(find({"resource": {"terraform_data": {"x": {"input": {PAYLOAD: "v"}}}}}, "f"))
    assert [h.path for h in hits] == [f"$.resource.terraform_data.x.input[{json.dumps(PAYLOAD)}] (key)"]


def test_escaped_and_generated_sequences_pass() -> None:
    stack = {"a": "$${file(\"/x\")} and %%{ if true }", "b": "${google_container_cluster.gke.endpoint}",
             "c": "${base64decode(google_container_cluster.gke.master_auth[0].cluster_ca_certificate)}",
             "d": "${data.terraform_remote_state.cross-stack-reference-input-prod-gke.outputs.x}", "e": "${var.nomad_address}"}
    assert list(find(stack, "f")) == []


def _terraform(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("terraform")
    if binary is None:
        pytest.fail("terraform is not on PATH; the injection test needs terraform 1.11 (no provider download)")
    env = dict(os.environ, TF_IN_AUTOMATION="1", TF_INPUT="0", GPUFLEET_TEST_CANARY=CANARY)
    return subprocess.run([binary, *args, "-no-color"], cwd=directory, env=env, capture_output=True, text=True, check=False, timeout=120)


def _leaked(plan_output: str) -> bool:
    """Any base64 run in the plan that decodes to text holding the canary."""
    for run in re.findall(r"[A-Za-z0-9+/=]{40,}", plan_output):
        try:
            if CANARY in base64.b64decode(run).decode("utf-8", "replace"):
                return True
        except ValueError:
            continue
    return False


def test_real_terraform_evaluates_an_unescaped_user_string_and_the_check_refuses_it(tmp_path: Path) -> None:
    if not Path("/proc/self/environ").exists():
        pytest.fail("/proc/self/environ is missing; this test needs Linux procfs to show what the payload reads")
    leaky = tmp_path / "stacks" / "leaky"
    leaky.mkdir(parents=True)
    (leaky / "cdk.tf.json").write_text(json.dumps({"resource": {"terraform_data": {"ip": {"input": {"description": PAYLOAD}}}}}))
    assert _terraform(leaky, "init", "-input=false").returncode == 0
    plan = _terraform(leaky, "plan", "-input=false")
    assert plan.returncode == 0, plan.stderr
    assert _leaked(plan.stdout), "terraform should have printed the environment (holding the canary) base64-encoded"
    with pytest.raises(UserError, match=r"stacks/leaky/cdk.tf.json: \$\.resource\.terraform_data\.ip\.input\.description: .*did not generate"):
        check_outdir(tmp_path)

    escaped = tmp_path / "escaped"
    (escaped / "stacks" / "safe").mkdir(parents=True)
    (escaped / "stacks" / "safe" / "cdk.tf.json").write_text(
        json.dumps({"resource": {"terraform_data": {"ip": {"input": {"description": "$" + PAYLOAD}}}}}))
    check_outdir(escaped)
    assert _terraform(escaped / "stacks" / "safe", "init", "-input=false").returncode == 0
    plan = _terraform(escaped / "stacks" / "safe", "plan", "-input=false")
    assert plan.returncode == 0, plan.stderr
    assert 'base64encode(file(\\"/proc/self/environ\\"))' in plan.stdout and not _leaked(plan.stdout)


def test_fails_when_a_config_that_bypassed_the_schema_is_synthesized_and_keeps_the_old_output(tmp_path: Path) -> None:
    """A ClusterConfig built without validation (model_copy) still cannot put a payload into cdk.tf.json."""
    config = next(c for c in load_fleet() if c.name == "prod-nomad")
    bad_ip = StaticIp.model_construct(name="nomad-ui", description=PAYLOAD)
    bad = config.model_copy(update={"gcp": config.gcp.model_copy(update={"static_ips": (bad_ip,)})})
    out = tmp_path / "cdktf.out"
    out.mkdir()
    (out / ".gpufleet-output").write_text("gpufleet made this directory\n")
    (out / "previous").write_text("kept")
    with pytest.raises(UserError, match=r"google_compute_address\.ip_nomad_ui\.description: .*did not generate"):
        synthesize((bad,), out, only=("prod-nomad",))
    assert (out / "previous").read_text() == "kept" and not (out / "stacks").exists()


@pytest.mark.parametrize("bad_clusters", [("prod-nomad",), ("prod-nomad", "prod-gke", "dev-gke")], ids=["one share", "both shares"])
def test_a_parallel_synthesis_refuses_as_one_process_does(tmp_path: Path, bad_clusters: tuple[str, ...]) -> None:
    """Over 2 processes each checks the stacks it wrote (stacks.parallel ``_findings``) and the parent merges them:
    the same one error, the same lines in the same order, as one check over the tree after one process."""
    from stacks import parallel
    from stacks.layout import plan_stacks

    def bad(config):
        ip = StaticIp.model_construct(name="ui", description=PAYLOAD)
        return config.model_copy(update={"gcp": config.gcp.model_copy(update={"static_ips": (*config.gcp.static_ips, ip)})})

    configs = tuple(bad(c) if c.name in bad_clusters else c for c in load_fleet())
    shares = [{s.cluster for s in plan_stacks(configs) if s.name in group} for group in parallel.partition(plan_stacks(configs), 2)]
    assert all(any(name in share for name in bad_clusters) for share in shares) == (len(bad_clusters) > 1)
    errors = []
    for jobs in (1, 2):
        out = tmp_path / f"out{jobs}" / "cdktf.out"
        out.parent.mkdir()
        with pytest.raises(UserError) as caught:
            synthesize(configs, out, jobs=jobs)
        errors.append(str(caught.value).replace(str(out), "<out>"))
        assert not out.exists() and [p.name for p in out.parent.iterdir()] == []
    assert errors[0] == errors[1] and errors[0].count("did not generate") >= len(bad_clusters)
