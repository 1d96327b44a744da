"""The planted-secret matrix: every format in every position is caught, masked; real output has no findings.

One detector (``clusters.secrets``) serves the cluster/job/roles loaders, dispatch meta and
the scanner, so the matrix plants each format into each position and requires 100%: cluster
fields (values and map keys), job fields (env, args, command, gpu.model, image, env keys), dispatch
meta (values and keys), synthesized JSON (values, keys, argv lists, text files) and Terraform
state (show -json and state file layout). Every message is checked not to contain the value.

Every fake secret is assembled at run time from a seeded draw; none is committed. Formats that only
mean "secret" next to a name (W&B's 40-hex keys look like git shas) are planted with their name,
as they occur: ``--wandb-key=<hex>``, ``aws_secret_access_key=<key>``, ``VAULT_TOKEN=s.<24>``.
"""

from __future__ import annotations

import base64
import copy
import functools
import json
import random
import string
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

import clusters
import jobs.loader
from clusters.errors import ConfigError, UserError
from safety.secret_scan import scan_paths
from jobs.meta import validate_meta
from jobs.vault_refs import load_vault_view
from tests.safety.conftest import tf
from tests.conftest import FLEET_CLUSTERS, load_fleet

ALNUM = string.ascii_letters + string.digits
HEX = "0123456789abcdef"
REPO = Path(__file__).resolve().parents[2]


def _r(rng: random.Random, n: int, alphabet: str = ALNUM) -> str:
    return "".join(rng.choices(alphabet, k=n))


def _block(kind: str, rng: random.Random) -> str:
    body = base64.b64encode(rng.randbytes(120)).decode()
    return f"-----BEGIN {kind}-----\n{body[:64]}\n{body[64:]}\n-----END {kind}-----\n"


def _formats() -> dict[str, str]:
    rng = random.Random(20261203)
    jwt = lambda: ".".join(base64.urlsafe_b64encode(json.dumps(p).encode()).decode().rstrip("=") for p in ({"alg": "HS256"}, {"sub": _r(rng, 12)})) + "." + _r(rng, 43, ALNUM + "_-")  # noqa: E731
    values = {
        "wandb-hex-in-flag": "--wandb-key=" + _r(rng, 40, HEX),
        "wandb-env-assignment": "WANDB_API_KEY=" + _r(rng, 40, HEX),
        "jwt": jwt(),
        "aws-secret-access-key": "aws_secret_access_key=" + _r(rng, 30, ALNUM) + "/+" + _r(rng, 8, ALNUM),
        "aws-access-key-id": "AK" + "IA" + _r(rng, 16, string.ascii_uppercase + string.digits),
        "google-api-key": "AI" + "za" + _r(rng, 35, ALNUM + "_-"),
        "google-oauth": "ya" + "29." + _r(rng, 60, ALNUM + "_-"),
        "vault-hvs": "hv" + "s." + _r(rng, 90, ALNUM + "_-"),
        "vault-hvb": "hv" + "b." + _r(rng, 120, ALNUM + "_-"),
        "vault-legacy-s": "VAULT_TOKEN=s." + _r(rng, 24),
        "stripe": "sk" + "_live_" + _r(rng, 24),
        "gitlab": "gl" + "pat-" + _r(rng, 20, ALNUM + "_-"),
        "npm": "np" + "m_" + _r(rng, 36),
        "github-pat": "github" + "_pat_" + _r(rng, 22) + "_" + _r(rng, 59),
        "github-classic": "gh" + "p_" + _r(rng, 36),
        "huggingface": "h" + "f_" + _r(rng, 34),
        "hf-bearer": "Authorization: Bearer h" + "f_" + _r(rng, 34),
        "openai": "s" + "k-proj-" + _r(rng, 48),
        "slack-token": "xo" + "xb-" + _r(rng, 12, string.digits) + "-" + _r(rng, 24),
        "slack-webhook": "https://hooks.slack" + ".com/services/T" + _r(rng, 8, string.ascii_uppercase) + "/B" + _r(rng, 8, string.ascii_uppercase) + "/" + _r(rng, 24),
        "url-password": "https://trainer:" + _r(rng, 14) + "@models.example.com/base",
        "pem-private-key": _block("RSA " + "PRIVATE KEY", rng),
        "openssh-private-key": _block("OPENSSH " + "PRIVATE KEY", rng),
        "pgp-private-key": _block("PGP " + "PRIVATE KEY BLOCK", rng),
    }
    values["base64-wrapped"] = base64.b64encode(("token " + "gh" + "p_" + _r(rng, 36)).encode()).decode()
    values.update(NEW_FORMATS(rng))
    return values


UPPER_DIGITS = string.ascii_uppercase + string.digits
BECH32 = "QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L"
URL62 = ALNUM + "_-"


def _aws_secret(rng: random.Random) -> str:
    """40 base64 characters shaped like a real key (a '/', both cases, digits): drawn until one is."""
    while True:
        key = _r(rng, 19, ALNUM + "+/") + "/" + _r(rng, 20, ALNUM + "+/")
        if any(c.isupper() for c in key) and any(c.islower() for c in key) and any(c.isdigit() for c in key):
            return key


def NEW_FORMATS(rng: random.Random) -> dict[str, str]:  # noqa: N802 - a table, built at run time
    """Issue 22's twelve, then the further ones taken from gitleaks/trufflehog (clusters/secrets.py cites each).

    Built from parts so no literal in the repository has a vendor's shape."""
    values = {
        "nvidia-ngc": "nv" + "api-" + _r(rng, 64, URL62),
        "terraform-cloud": _r(rng, 14) + ".atlas" + "v1." + _r(rng, 67),
        "pypi": "py" + "pi-AgEIcHlwaS5vcmc" + _r(rng, 120, URL62),
        "dockerhub-pat": "dckr" + "_pat_" + _r(rng, 27, URL62),
        "databricks": "da" + "pi" + _r(rng, 32, HEX),
        "google-oauth-client-secret": "GOC" + "SPX-" + _r(rng, 28, URL62),
        "sendgrid": "S" + "G." + _r(rng, 22, URL62) + "." + _r(rng, 43, URL62),
        "slack-app": "xa" + "pp-1-A" + _r(rng, 10, UPPER_DIGITS) + "-" + _r(rng, 13, string.digits) + "-" + _r(rng, 64, HEX),
        "groq": "gs" + "k_" + _r(rng, 52),
        "replicate": "r" + "8_" + _r(rng, 37),
        "age-secret-key": "AGE-SECRET" + "-KEY-1" + _r(rng, 58, BECH32),
        "aws-secret-bare": _aws_secret(rng),
        "aws-secret-near-context": "aws s3 sync s3://acme-ckpt . # " + _r(rng, 40),
        "xai": "x" + "ai-" + _r(rng, 80, ALNUM + "_"),
        "langsmith": "lsv" + "2_pt_" + _r(rng, 32, HEX) + "_" + _r(rng, 10, HEX),
        "perplexity": "pp" + "lx-" + _r(rng, 48),
        "pinecone": "pc" + "sk_" + _r(rng, 5) + "_" + _r(rng, 63),
        "huggingface-org": "api" + "_org_" + _r(rng, 34, string.ascii_letters),
        "aws-bedrock": "AB" + "SK" + _r(rng, 140, ALNUM + "+/"),
        "gitlab-runner": "gl" + "rt-" + _r(rng, 20, URL62),
        "pulumi": "pu" + "l-" + _r(rng, 40, HEX),
        "digitalocean": "do" + "p_v1_" + _r(rng, 64, HEX),
        "grafana-sa": "gl" + "sa_" + _r(rng, 32) + "_" + _r(rng, 8, HEX),
        "sentry-user": "snt" + "ryu_" + _r(rng, 64, HEX),
        "heroku": "HR" + "KU-AA" + _r(rng, 58, URL62),
        "1password-sa": "op" + "s_eyJ" + _r(rng, 260, ALNUM + "+/"),
    }
    values["percent-encoded-hf"] = "".join(f"%{b:02X}" for b in ("h" + "f_" + _r(rng, 34)).encode())
    return values


FORMATS = _formats()


def _core(value: str) -> str:
    """The part of a planted value that must never be printed: its random tail."""
    line = [ln for ln in value.splitlines() if ln and not ln.startswith("-----")]
    return (line[0] if len(line) > 1 else value)[-12:]


def _write_yaml(path: Path, data: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))  # JSON is YAML, and dumps far faster than ruamel
    return path


def _example(name: str, directory: Path) -> dict[str, Any]:
    return copy.deepcopy(_parsed(directory / name))


@functools.cache
def _parsed(path: Path) -> dict[str, Any]:
    return YAML(typ="safe").load(path.read_text())


# ---- positions: each takes (tmp_path, value) and returns the error/finding text, or None if not caught.

def _cluster(mutate: Callable[[dict[str, Any], str], None]) -> Callable[[Path, str], str | None]:
    def run(tmp: Path, value: str) -> str | None:
        data = copy.deepcopy(_example("prod-gke.yaml", FLEET_CLUSTERS))
        mutate(data, value)
        try:
            clusters.load(_write_yaml(tmp / "prod-gke.yaml", data))
        except ConfigError as err:
            text = str(err)
            return text if "credential" in text else None
        return None
    return run


def _job(mutate: Callable[[dict[str, Any], str], None]) -> Callable[[Path, str], str | None]:
    def run(tmp: Path, value: str) -> str | None:
        data = copy.deepcopy(_example("finetune-llama.yaml", REPO / "jobs"))
        mutate(data, value)
        path = _write_yaml(tmp / "jobs" / "finetune-llama.yaml", data)
        try:
            jobs.loader.load(path, cluster_configs=_CONFIGS(), vault=_VAULT())
        except ConfigError as err:
            text = str(err)
            return text if "credential" in text or "secret itself" in text else None
        return None
    return run


def _meta(key_position: bool) -> Callable[[Path, str], str | None]:
    def run(tmp: Path, value: str) -> str | None:
        spec = next(s for s in _SPECS() if s.name == "finetune-llama")
        meta = {"dataset_uri": "hf://datasets/acme/chat@v3", "run_id": "r-1"}
        meta |= {value: "x"} if key_position else {"base_model": value}
        try:
            validate_meta(spec, meta)
        except UserError as err:
            text = str(err)
            return text if "credential" in text else None
        return None
    return run


def _scan(build: Callable[[str], Any], suffix: str = ".json") -> Callable[[Path, str], str | None]:
    def run(tmp: Path, value: str) -> str | None:
        file = tmp / "out" / f"planted{suffix}"
        file.parent.mkdir(parents=True, exist_ok=True)
        content = build(value)
        file.write_text(content if isinstance(content, str) else json.dumps(content, indent=2))
        findings = scan_paths([file])
        return "\n".join(str(f) for f in findings) or None
    return run


def _set_label(d: dict[str, Any], v: str) -> None:
    d["gpu_pools"][0]["labels"]["workload"] = v


def _set_label_key(d: dict[str, Any], v: str) -> None:
    d["gpu_pools"][0]["labels"][v] = "x"


@functools.cache
def _CONFIGS() -> tuple[Any, ...]:  # noqa: N802 - lazily loaded constants
    return load_fleet()


@functools.cache
def _VAULT() -> Any:  # noqa: N802
    return load_vault_view()


@functools.cache
def _SPECS() -> tuple[Any, ...]:  # noqa: N802
    return jobs.loader.load_all(cluster_configs=_CONFIGS(), vault=_VAULT())


def _tf_resource(v: str) -> dict[str, Any]:
    return {"resource": {"google_compute_address": {"ip": {"name": "ip", "description": v}}}}


POSITIONS: dict[str, Callable[[Path, str], str | None]] = {
    "cluster.static_ip.description": _cluster(lambda d, v: d["gcp"]["static_ips"][0].update(description=v)),
    "cluster.pool.label_value": _cluster(_set_label),
    "cluster.pool.label_key": _cluster(_set_label_key),
    "cluster.pool.reservation": _cluster(lambda d, v: d["gpu_pools"][0].update(reservation=v)),
    "cluster.state.bucket": _cluster(lambda d, v: d["state"].update(bucket=v)),
    "job.env.value": _job(lambda d, v: d["env"].update(HF_HOME=v)),
    "job.env.key": _job(lambda d, v: d["env"].update({v: "x"})),
    "job.args.item": _job(lambda d, v: d["args"].append(v)),
    "job.command": _job(lambda d, v: d.update(command=v)),
    "job.gpu.model": _job(lambda d, v: d["gpu"].update(model=v)),
    "job.image": _job(lambda d, v: d.update(image=v)),
    "job.secrets.env.value": _job(lambda d, v: d["secrets"]["env"].update(HF_TOKEN=v)),
    "meta.value": _meta(key_position=False),
    "meta.key": _meta(key_position=True),
    "synth.attribute": _scan(_tf_resource),
    "synth.map_key": _scan(lambda v: {"resource": {"google_compute_instance": {"i": {"labels": {v: "x"}}}}}),
    "synth.argv_list": _scan(lambda v: {"Job": {"TaskGroups": [{"Tasks": [{"Config": {"args": ["train.py", v]}}]}]}}),
    "synth.text_file": _scan(lambda v: "#!/bin/sh\nexport X=1\n" + v + "\n", suffix=".sh"),
    "state.show_json": _scan(lambda v: {"format_version": "1.0", "values": {"root_module": {"resources": [
        {"address": "terraform_data.x", "values": {"input": {"note": v}}, "sensitive_values": {}}]}}}),
    "state.tfstate": _scan(lambda v: {"version": 4, "resources": [{"type": "terraform_data", "name": "x", "instances": [
        {"attributes": {"input": {"value": {"note": v}, "type": ["object", {"note": "string"}]}}, "sensitive_attributes": []}]}]}),
}


def test_planted_secret_matrix_is_caught_everywhere_and_never_printed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missed, leaked = [], []
    for position, run in POSITIONS.items():
        for name, value in FORMATS.items():
            work = tmp_path / f"{position}-{name}"
            text = run(work, value)
            if text is None:
                missed.append((position, name))
            elif _core(value) in text:
                leaked.append((position, name))
    total = len(POSITIONS) * len(FORMATS)
    print(f"secret matrix: {total - len(missed)}/{total} caught ({len(FORMATS)} formats x {len(POSITIONS)} positions), {len(leaked)} messages leaked a value")
    assert not missed, f"{len(missed)} of {total} planted secrets were not caught: {missed}"
    assert not leaked, f"messages printed the planted value: {leaked}"


def test_state_attribute_terraform_marks_sensitive_is_a_finding_even_when_it_looks_harmless(tmp_path: Path) -> None:
    """A low-entropy password ('correct horse ...') is no format at all; terraform's own marking is the evidence."""
    (tmp_path / "main.tf.json").write_text(json.dumps({
        "variable": {"pw": {"type": "string", "sensitive": True}},
        "resource": {"terraform_data": {"db": {"input": {"user": "app", "note": "${var.pw}"}}}},
    }))
    tf(tmp_path, "init", "-input=false")
    tf(tmp_path, "apply", "-auto-approve", "-input=false", "-var", "pw=correct horse battery staple")
    shown = tmp_path / "show.json"
    shown.write_text(tf(tmp_path, "show", "-json"))
    paths = {(f.path, f.kind) for f in scan_paths([shown])}
    assert ("$.values.root_module.resources[0].values.input.note", "terraform-sensitive") in paths
    raw = {(f.path, f.kind) for f in scan_paths([tmp_path / "terraform.tfstate"])}
    assert ("$.resources[0].instances[0].attributes.input.value.note", "terraform-sensitive") in raw
    assert all("correct horse" not in str(f) for f in scan_paths([shown, tmp_path / "terraform.tfstate"]))


def test_example_fleet_rendered_jobs_and_repo_json_have_zero_findings(fleet_out: Path, tmp_path: Path) -> None:
    from jobs.nomad.render import write_job

    for spec in _SPECS():
        write_job(spec, tmp_path / "jobs")
    tracked = subprocess.run(["git", "ls-files", "*.json"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    assert tracked, "the repo tracks JSON files (goldens, package.json): they are scanned too"
    findings = scan_paths([fleet_out, tmp_path / "jobs", *(REPO / t for t in tracked)])
    assert findings == [], [str(f) for f in findings]


WRAPPERS = {
    "bold": lambda v: f"\x1b[1m{v}\x1b[0m",
    "clear-line-green": lambda v: f"\x1b[2K\r\x1b[32m{v}\x1b[0m",
    "json-newline": lambda v: '{"level":"debug","msg":"login:\\n' + v + '"}',
    "json-tab": lambda v: '{"msg":"key\\t' + v + '"}',
    "json-unicode-space": lambda v: '{"msg":"key\\u0020' + v + '"}',
}


@pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
def test_a_secret_behind_colour_codes_or_json_escapes_is_caught_and_masked_in_logs(wrapper: str) -> None:
    """Red team 22: the edge lookbehind read the 'm' of ESC[1m or the 'n' of a literal \\n as part of the token."""
    from clusters.secrets import detect
    from jobs.logs import masked

    self_identifying = {k: v for k, v in NEW_FORMATS(random.Random(7)).items()
                        if k not in ("aws-secret-bare", "aws-secret-near-context", "percent-encoded-hf")}
    missed = [kind for kind, value in self_identifying.items() if detect(WRAPPERS[wrapper](value)) is None]
    assert not missed
    log = "".join(WRAPPERS[wrapper](value) + "\n" for value in self_identifying.values())
    shown = masked(log)
    assert not any(_core(value) in shown for value in self_identifying.values())
    assert shown.count("[masked: ") == len(self_identifying)
