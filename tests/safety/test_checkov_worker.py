"""The checkov worker (one warm process, rendering remembered, libyaml) finds exactly what the plain CLI finds.

Both ways run real checkov 3.3.30, unskipped, on real synthesized stacks (the example fleet and a
generated one, bench/fleetgen.py) and on a stack with known failures of each kind: a Python
check on a literal value, a Python check on a value only rendering computes (``format()``), a
graph (YAML) attribute check on a rendered local, and a graph connection check across two
resources. The per-stack results (passed count, every failed check id, name, resource and line,
exemptions, errors) must be equal.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

from safety import checkov_cache, checkov_scan

FLEETGEN = Path(__file__).resolve().parents[2] / "bench" / "fleetgen.py"

KNOWN = {
    "locals": {"open": "0.0.0.0/0", "everyone": "allUsers"},
    "resource": {
        "google_compute_network": {"vpc": {"name": "vpc", "auto_create_subnetworks": False}},
        "google_compute_firewall": {
            "all": {"name": "all", "network": "${google_compute_network.vpc.id}", "allow": [{"protocol": "all"}],
                    "source_ranges": ["${local.open}"]},
            "ssh": {"name": "ssh", "network": "default", "allow": [{"protocol": "tcp", "ports": ["22"]}], "source_ranges": ["0.0.0.0/0"]},
        },
        "google_kms_crypto_key": {"key": {"name": "k", "key_ring": "r", "rotation_period": '${format("%ds", 100000000)}'}},
        "google_kms_crypto_key_iam_member": {"public": {"crypto_key_id": "${google_kms_crypto_key.key.id}",
                                                        "role": "roles/cloudkms.cryptoKeyEncrypter", "member": "${local.everyone}"}},
    },
}
# (check id, resource) that must fail on KNOWN, one of each kind (checkov 3.3.30):
EXPECTED = {
    ("CKV_GCP_2", "google_compute_firewall.ssh"),  # Python check, literal 0.0.0.0/0 and port 22
    ("CKV_GCP_43", "google_kms_crypto_key.key"),  # Python check, rotation_period only known once format() is rendered
    ("CKV2_GCP_12", "google_compute_firewall.all"),  # graph attribute check, source_ranges from a rendered local
    ("CKV2_GCP_6", "google_kms_crypto_key.key"),  # graph connection check, key <- iam member "allUsers" (rendered)
}

# Terraform JSON shapes the example stacks do not have, for the comparisons below: for_each, count, a dynamic
# block, a module, variables and locals rendered into other blocks, strings that look like JSON or HCL, keys
# with dots whose paths meet (``a.b`` and ``a`` > ``b``), an empty key, numeric-looking keys, lists of lists,
# empty lists and dicts, None, a one-item list of blocks next to a two-item one, and nesting six deep.
EDGES = {
    "variable": {"ranges": {"default": ["0.0.0.0/0", "10.0.0.0/8"]},
                 "cfg": {"default": {"a.b": {"c": [1, [2, {"d": None}]]}, "": 1, "x": []}}},
    "locals": {"open": "0.0.0.0/0", "tags": {"a": "b", "a.b": "c", "list": [[1], [[2]], {}]}, "js": '{"a": [1, {"b": 2}]}',
               "hcl": "${jsonencode({a = [1, 2]})}", "deep": {"l1": {"l2": {"l3": {"l4": [{"l5": {"l6": ["x"]}}]}}}}},
    "module": {"m": {"source": "./nowhere", "count": 2, "x": "${var.cfg}"}},
    "data": {"google_client_config": {"c": {}}},
    "resource": {
        "google_compute_firewall": {
            "fe": {"for_each": "${toset(var.ranges)}", "name": "fw-${each.key}", "network": "default", "source_ranges": ["${each.value}"],
                   "allow": [{"protocol": "tcp", "ports": ["22", "80"]}, {"protocol": "udp"}],
                   "dynamic": {"deny": {"for_each": "${var.ranges}", "content": {"protocol": "${deny.value}"}}}},
            "cnt": {"count": 3, "name": "fw-${count.index}", "network": "default", "source_ranges": "${var.ranges}", "allow": {"protocol": "all"}},
            "weird": {"name": "w", "network": "default", "allow": [[{"protocol": "all"}]], "source_ranges": [["0.0.0.0/0"]], "log_config": [{}],
                      "target_tags": "${local.tags}", "description": "${local.js}", "priority": "${local.hcl}", "a.b": {"c": 1}, "a": {"b": {"c": 2}}}},
        "google_storage_bucket": {"b": {"name": "b", "location": "EU", "labels": {"a": "${local.open}", "b.c": "${var.cfg}"}, "versioning": [{"enabled": "${true}"}],
                                        "lifecycle_rule": "${local.deep}", "cors": [{"origin": [], "method": [[]]}],
                                        "uniform_bucket_level_access": None, "logging": {"log_bucket": "${google_storage_bucket.b.name}"}}},
        "google_container_cluster": {"c": {"name": "c", "location": "eu", "node_config": [{"metadata": {"disable-legacy-endpoints": "true"}}],
                                           "master_authorized_networks_config": {"cidr_blocks": [{"cidr_block": "${local.open}"}]},
                                           "private_cluster_config": [{"enable_private_nodes": True}, {"enable_private_nodes": False}],
                                           "resource_labels": {"0": "zero", "1.2": "x"}}},
        "google_sql_database_instance": {"s": {
            "name": "s", "database_version": '${upper("postgres_15")}',
            "settings": [{"tier": "t", "database_flags": [{"name": "log_statement_stats", "value": "on"}, {"name": "x", "value": "${var.cfg}"}],
                          "ip_configuration": {"authorized_networks": "${[for r in var.ranges : {value = r}]}"}}]}},
    },
}


def cli(directories: list[Path]) -> list[checkov_scan.StackResult]:
    """The plain ``checkov`` CLI over every stack file in one process (how checkov_scan ran before the worker)."""
    args = [checkov_scan.checkov_binary(), *checkov_scan.checkov_args(())]
    for directory in directories:
        args += ["-f", str((directory / "cdk.tf.json").resolve())]
    done = subprocess.run(args, capture_output=True, text=True, env=checkov_scan.checkov_env(), check=False)
    assert done.returncode in (0, 1), done.stderr[-2000:]
    data = json.loads(done.stdout)
    return checkov_scan.split_reports(tuple(directories), data if isinstance(data, list) else [data])


@pytest.fixture(scope="module")
def stacks(fleet_out: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """The example fleet's stacks, three generated clusters' stacks, the known-failures stack and ``EDGES``."""
    from clusters import load_all
    from stacks.synth import synthesize

    spec = importlib.util.spec_from_file_location("bench_fleetgen", FLEETGEN)
    assert spec is not None and spec.loader is not None
    fleetgen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fleetgen)
    root = tmp_path_factory.mktemp("worker")
    generated = root / "out"
    synthesize(load_all(fleetgen.generated_fleet(root / "fleet", range(3))), generated)
    known = root / "known" / "known-failures"
    known.mkdir(parents=True)
    (known / "cdk.tf.json").write_text(json.dumps(KNOWN, indent=2))
    edges = root / "edges" / "edge-shapes"
    edges.mkdir(parents=True)
    (edges / "cdk.tf.json").write_text(json.dumps(EDGES, indent=2))
    found = sorted((fleet_out / "stacks").iterdir()) + sorted((generated / "stacks").iterdir()) + [known, edges]
    assert len(found) > 12, found
    return found


@pytest.fixture(scope="module")
def both_ways(stacks: list[Path]) -> tuple[list[checkov_scan.StackResult], list[checkov_scan.StackResult]]:
    """(plain CLI, workers): two worker processes, chunks of 3, so rendering is remembered across chunks."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(checkov_cache.CACHE_ENV, "off")
        patch.setattr(checkov_scan, "STACKS_PER_CHUNK", 3)
        workers = checkov_scan.run(stacks, skip_ids=(), workers=2)
    return sorted(cli(stacks), key=lambda r: r.stack), list(workers.stacks)


def test_the_workers_report_what_the_cli_reports_on_every_stack(both_ways) -> None:
    plain, workers = both_ways
    assert all(r.error is None for r in plain + workers), [r.error for r in plain + workers if r.error]
    assert [r.stack for r in workers] == [r.stack for r in plain]
    for old, new in zip(plain, workers):
        assert new == old, f"{old.stack}: CLI {old} != workers {new}"
    assert sum(len(r.failures) for r in plain) > len(EXPECTED)  # the generated stacks fail unskipped checks too


def test_each_kind_of_check_still_fires(both_ways) -> None:
    plain, workers = both_ways
    for results in (plain, workers):
        known = next(r for r in results if r.stack == "known-failures")
        assert EXPECTED <= {(f.check_id, f.resource) for f in known.failures}, known.failures


def test_a_crashed_worker_is_an_error_for_its_stacks_not_a_pass(stacks: list[Path], monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    monkeypatch.setenv(checkov_cache.CACHE_ENV, "off")
    broken = tmp_path / "worker.py"
    broken.write_text("import sys\nsys.stderr.write('worker fell over\\n')\nsys.exit(3)\n")
    monkeypatch.setattr(checkov_scan, "WORKER", broken)
    summary = checkov_scan.run(stacks[:2], skip_ids=())
    assert not summary.ok
    assert [s.error for s in summary.stacks] == ["worker fell over", "worker fell over"]


def _stack(root: Path, name: str, text: str) -> Path:
    directory = root / name
    directory.mkdir(parents=True)
    (directory / "cdk.tf.json").write_text(text, encoding="utf-8")
    return directory


def _workers_one_stack_per_chunk(stacks: list[Path]) -> list[checkov_scan.StackResult]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(checkov_cache.CACHE_ENV, "off")
        patch.setattr(checkov_scan, "STACKS_PER_CHUNK", 1)
        return list(checkov_scan.run(stacks, skip_ids=(), workers=1).stacks)


def test_files_libyaml_and_the_pure_loader_read_differently_get_the_clis_result(tmp_path: Path) -> None:
    """libyaml accepts tabs between JSON tokens and some text that is not JSON, and rejects ``\\ud83d``-style
    surrogate escapes (what ``json.dumps`` writes for an emoji); checkov's pure-Python loader does the
    opposite. The CLI reports the tab-indented and the malformed stack as unparsable (an error): the
    worker must not scan them into a pass, nor turn a stack the CLI reads into an error."""
    tabbed = _stack(tmp_path, "tabbed", json.dumps(KNOWN, indent="\t"))
    emoji = dict(KNOWN, locals={**KNOWN["locals"], "note": "\N{ROCKET} launch"})
    escaped = _stack(tmp_path, "escaped", json.dumps(emoji, indent=2))
    assert "\\ud83d" in (escaped / "cdk.tf.json").read_text()
    # not JSON: a plain ``?`` inside a flow mapping, which libyaml 0.2.6 reads and PyYAML's pure loader rejects
    malformed = _stack(tmp_path, "malformed", json.dumps(KNOWN, indent=2).replace('"ssh": {', '"ssh": {a?b: 1,', 1))
    plain = [cli([tabbed])[0], cli([escaped])[0], cli([malformed])[0]]
    assert plain[0].error is not None and plain[1].error is None and plain[2].error is not None  # checkov 3.3.30's CLI
    assert sorted(_workers_one_stack_per_chunk([tabbed, escaped, malformed]), key=lambda r: r.stack) == \
        sorted(plain, key=lambda r: r.stack)


def _reads_both_reads(tmp_path: Path) -> list[Path]:
    """Three stacks: ``a-reads`` and ``c-reads`` read ``${everyone}``; ``b-both`` between them also assigns it."""
    resources = {
        "google_kms_crypto_key": {"key": {"name": "k", "key_ring": "r", "rotation_period": "7776000s", "purpose": "${local.set}"}},
        "google_kms_crypto_key_iam_member": {"m": {"crypto_key_id": "${google_kms_crypto_key.key.id}",
                                                   "role": "roles/cloudkms.cryptoKeyEncrypter", "member": "${local.who}"}},
    }
    reads = json.dumps({"locals": {"set": "ENCRYPT_DECRYPT", "who": "${everyone}"}, "resource": resources}, indent=2)
    both = json.dumps({"locals": {"set": "everyone = 'allUsers'", "who": "${everyone}"}, "resource": resources}, indent=2)
    stacks = [_stack(tmp_path, "a-reads", reads), _stack(tmp_path, "b-both", both), _stack(tmp_path, "c-reads", reads)]
    return stacks


def test_an_assignment_rendered_in_one_stack_does_not_leak_into_another(tmp_path: Path) -> None:
    """checkov renders with asteval over one module-level symbol table (safe_eval_functions.SAFE_EVAL_DICT,
    checkov 3.3.30), so rendering is not a function of the string alone: rendering ``everyone = 'allUsers'``
    defines ``everyone`` for every later rendering in that process, and ``${everyone}`` then renders to
    ``allUsers``. Alone, the CLI fails ``both`` (it assigns and reads) on CKV2_GCP_6 and passes ``reads``.
    The worker must do the same with ``reads`` scanned before ``both`` (a remembered rendering of
    ``${everyone}`` must not hide the failure) and after it (each chunk starts from checkov's own symbols)."""
    stacks = _reads_both_reads(tmp_path)
    plain = [cli([s])[0] for s in stacks]
    assert ("CKV2_GCP_6", "google_kms_crypto_key.key") in {(f.check_id, f.resource) for f in plain[1].failures}
    assert not any(f.check_id == "CKV2_GCP_6" for f in plain[0].failures + plain[2].failures)
    assert _workers_one_stack_per_chunk(stacks) == plain


def test_a_stacks_result_is_its_own_whichever_stacks_share_its_chunk(tmp_path: Path) -> None:
    """The checkov cache keys a result on the stack's own bytes, so the result must not depend on the
    stacks scanned with it. One checkov run over several files renders them over one asteval symbol
    table: ``b-both`` assigns ``everyone``, and ``c-reads`` scanned after it in the same run failed
    CKV2_GCP_6 although alone (and in a one-cluster re-scan) it passes. In one chunk, every stack
    must get the result ``checkov -f <that stack>`` gives."""
    stacks = _reads_both_reads(tmp_path)
    alone = [cli([s])[0] for s in stacks]
    assert not any(f.check_id == "CKV2_GCP_6" for f in alone[2].failures)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(checkov_cache.CACHE_ENV, "off")
        patch.setattr(checkov_scan, "STACKS_PER_CHUNK", 10)
        together = list(checkov_scan.run(stacks, skip_ids=(), workers=1).stacks)
    assert together == alone


def test_a_rendering_is_remembered_only_while_checkovs_symbols_are_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """In process, with checkov's real renderer counted: a repeated string is rendered once (asteval
    rebinding its own ``print`` at every call does not count as a change), an assignment turns the
    memory off, and the reset a chunk starts with brings checkov's own symbols back."""
    from checkov.terraform.graph_builder.variable_rendering import evaluate_terraform as module

    from safety import checkov_worker

    rendered: list[str] = []
    real = module.evaluate_terraform

    def counted(input_str, keep_interpolations=True):
        rendered.append(input_str)
        return real(input_str, keep_interpolations)

    monkeypatch.setattr(module, "evaluate_terraform", counted)  # restores checkov's own after the test
    reset = checkov_worker.remember_rendering()
    try:
        assert module.evaluate_terraform('${lower("ALL")}') == module.evaluate_terraform('${lower("ALL")}') == "all"
        assert rendered.count('${lower("ALL")}') == 1
        assert module.evaluate_terraform("${everyone}") != "allUsers"
        module.evaluate_terraform("everyone = 'allUsers'")
        assert module.evaluate_terraform("${everyone}") == "allUsers"  # what checkov itself renders now
        reset()
        assert module.evaluate_terraform("${everyone}") != "allUsers"
    finally:
        reset()


def test_a_worker_killed_mid_chunk_fails_every_stack_it_had_left_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker killed by a signal after taking a chunk (no answer): that chunk and every later one it would
    have taken are errors naming the signal, not the last line checkov happened to log."""
    monkeypatch.setenv(checkov_cache.CACHE_ENV, "off")
    killed = tmp_path / "worker.py"
    killed.write_text("import os, signal, sys\nsys.stdin.readline()\nsys.stderr.write('WARNING some checkov log line\\n')\n"
                      "sys.stderr.flush()\nos.kill(os.getpid(), signal.SIGKILL)\n")
    monkeypatch.setattr(checkov_scan, "WORKER", killed)
    monkeypatch.setattr(checkov_scan, "STACKS_PER_CHUNK", 1)
    stacks = [_stack(tmp_path, name, "{}") for name in ("a", "b", "c")]
    summary = checkov_scan.run(stacks, skip_ids=(), workers=1)
    assert not summary.ok
    assert [(s.stack, s.passed, s.error) for s in summary.stacks] == [(name, 0, "checkov worker killed by signal 9") for name in "abc"]


LIGHTEN = """
import importlib.util, logging, sys
spec = importlib.util.spec_from_file_location("checkov_worker", sys.argv[1])
worker = importlib.util.module_from_spec(spec)
spec.loader.exec_module(worker)
import gc
gc.disable()  # as ``main`` imports checkov
import checkov.main
from checkov import logging_init
worker.lighten()
before = len(logging_init.log_stream.getvalue())
log = logging.getLogger("checkov.terraform.runner")
log.debug("a debug record")
log.warning("a warning record")
print(len(logging_init.log_stream.getvalue()) - before)
print(gc.isenabled(), gc.get_threshold())
"""


@pytest.mark.parametrize("level", ["WARNING", "DEBUG"])
def test_lighten_stops_the_debug_buffer_and_keeps_checkovs_stderr(level: str) -> None:
    """In the interpreter checkov runs in: after ``lighten`` nothing is formatted into checkov's in-memory
    support log, and stderr still gets exactly what ``LOG_LEVEL`` lets through (checkov's own handler); the
    collector ``main`` turned off for checkov's imports is on again."""
    python = checkov_scan.checkov_python(checkov_scan.checkov_binary())
    env = dict(checkov_scan.checkov_env(), LOG_LEVEL=level)
    done = subprocess.run([python, "-c", LIGHTEN, str(checkov_scan.WORKER)], capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["0", "True (50000, 20, 100)"]  # the collector back on, at lighten's thresholds
    assert "a warning record" in done.stderr
    assert ("a debug record" in done.stderr) == (level == "DEBUG")


SHORTCUTS = r'''
import contextlib, copy, importlib.util, io, json, sys
spec = importlib.util.spec_from_file_location("checkov_worker", sys.argv[1])
worker = importlib.util.module_from_spec(spec)
spec.loader.exec_module(worker)
from checkov.common.graph.checks_infra.registry import BaseRegistry
from checkov.main import Checkov
from checkov.terraform.graph_builder import local_graph, utils
from checkov.terraform.graph_builder.graph_components.blocks import TerraformBlock
from checkov.terraform.graph_builder.variable_rendering import renderer

class Own(TerraformBlock):  # checkov's own method at every level it recurses into (it looks itself up on cls)
    get_inner_attributes = TerraformBlock.__dict__["get_inner_attributes"]

import dpath
from checkov.terraform.checks.resource import base_resource_negative_value_check, base_resource_value_check

original = {"nested": utils.attribute_has_nested_attributes, "inner": Own.get_inner_attributes,
            "run_checks": BaseRegistry.run_checks, "dpath.search": dpath.search, "dpath.get": dpath.get}
assert base_resource_value_check.dpath is base_resource_negative_value_check.dpath is dpath
assert worker.equivalent_shortcuts(), "not the reviewed checkov: see test_the_shortcuts_apply_only_to_the_checkov_whose_source_was_read"
shortcut = {"nested": utils.attribute_has_nested_attributes, "inner": TerraformBlock.get_inner_attributes,
            "run_checks": BaseRegistry.run_checks, "dpath.search": base_resource_value_check.dpath.search,
            "dpath.get": base_resource_value_check.dpath.get}
assert local_graph.attribute_has_nested_attributes is renderer.attribute_has_nested_attributes is shortcut["nested"]
assert type(base_resource_negative_value_check.dpath) is type(base_resource_value_check.dpath) is worker._Dpath
compared = dict.fromkeys(original, 0)
mismatches = []

def ordered(value):
    """A value with every dict's key order made part of it (dict equality ignores order)."""
    if isinstance(value, dict):
        return [type(value).__name__, [(repr(k), ordered(v)) for k, v in value.items()]]
    if isinstance(value, list):
        return [ordered(v) for v in value]
    return [type(value).__name__, repr(value)]

def outcome(function, *args):
    try:
        return ("returned", ordered(function(*args)))
    except Exception as error:
        return ("raised", type(error).__name__)

def nested(attribute_key, attributes, attribute_is_leaf=None):
    compared["nested"] += 1
    old = outcome(original["nested"], attribute_key, attributes, attribute_is_leaf)
    if outcome(shortcut["nested"], attribute_key, attributes, attribute_is_leaf) != old:
        mismatches.append(["nested", attribute_key])
    return original["nested"](attribute_key, attributes, attribute_is_leaf)

def inner(cls, attribute_key, attribute_value, strip_list=True):
    compared["inner"] += 1
    mine, theirs = copy.deepcopy(attribute_value), copy.deepcopy(attribute_value)
    old = (outcome(original["inner"], attribute_key, theirs, strip_list), ordered(theirs))
    if (outcome(shortcut["inner"], attribute_key, mine, strip_list), ordered(mine)) != old:
        mismatches.append(["inner", attribute_key])
    return original["inner"](attribute_key, attribute_value, strip_list)

def results(found):
    return sorted((check.id, str(r["result"]), r["entity"].get("id"), sorted(r["evaluated_keys"]))
                  for check, rows in found.items() for r in rows)

def run_checks(self, graph_connector, runner_filter, report_type):
    compared["run_checks"] += 1
    old = original["run_checks"](self, graph_connector, runner_filter, report_type)
    if results(shortcut["run_checks"](self, graph_connector, runner_filter, report_type)) != results(old):
        mismatches.append(["run_checks", report_type])
    return old

class Compared:
    """dpath for the value checks: each search and get answered by dpath and by the worker's ``_Dpath``, compared
    (the value, its type, dict key order; or the exception's type and message), and the conf left unchanged by both."""

    def __getattr__(self, name):
        return getattr(dpath, name)

    def _both(self, name, obj, glob, *args, **kwargs):
        compared["dpath." + name] += 1
        before = ordered(obj)
        old, new = (outcome_text(f, obj, glob, *args, **kwargs) for f in (original["dpath." + name], shortcut["dpath." + name]))
        if old != new or ordered(obj) != before:
            mismatches.append(["dpath." + name, repr(glob), repr(obj)[:300], old, new])
        return original["dpath." + name](obj, glob, *args, **kwargs)

    def search(self, obj, glob, *args, **kwargs):
        return self._both("search", obj, glob, *args, **kwargs)

    def get(self, obj, glob, *args, **kwargs):
        return self._both("get", obj, glob, *args, **kwargs)

def outcome_text(function, *args, **kwargs):
    try:
        return ("returned", ordered(function(*args, **kwargs)))
    except Exception as error:
        return ("raised", type(error).__name__, str(error))

utils.attribute_has_nested_attributes = local_graph.attribute_has_nested_attributes = nested
renderer.attribute_has_nested_attributes = nested
TerraformBlock.get_inner_attributes = classmethod(inner)
BaseRegistry.run_checks = run_checks
base_resource_value_check.dpath = base_resource_negative_value_check.dpath = Compared()

# confs and globs real stacks do not have: list positions counted from the end or spelled as int() reads them,
# keys int() would read, empty and non-string keys (dpath raises or matches by their text), bytes, tuples, globs
# with wildcards, a glob that is "/", a list glob, extra arguments
confs = [{"a": [{"b": 1}, {"b": [2]}], "0": "zero", "x y": {"[0]": 3}}, {"a": [[1, 2], []], "b": None}, [{"a": 1}],
         {"a": {"": 1}}, {"a": {1: "one", "1": "two"}}, {"a": (1, 2)}, {"a": b"bytes", "b": {"c": [None]}}, "scalar", {}, []]
globs = ["a", "a/0", "a/[0]", "a/-1", "a/-2", "a/-3", "a/1/b", "a/[1]/b/[0]", "a/+1", "a/ 1", "a/01", "a/1_0", "/a/0",
         "a//b", "", "/", "0", "[0]", "x y/[0]", "a/*", "**/b", "a/[01]", "a/?", ["a", "0"], "b/c/0", "a/1", "a/2"]
for conf in confs:
    for name, glob, more in [(name, glob, ()) for glob in globs for name in ("search", "get")] + [("search", "a", (True,)), ("get", "a", ("/", None))]:
        with contextlib.suppress(Exception):  # compared inside; what dpath raises is the outcome compared
            Compared()._both(name, conf, glob, *more)

# values real stacks do not have: keys that make two paths meet, non-string and empty keys, deep nesting
deep = "leaf"
for _ in range(240):
    deep = {"d": [deep, 1]}
unusual = [{"a.b": 1, "a": {"b": 2}}, {"a": {"b": 2}, "a.b": 1}, {"x": {"a": {"b": {"c": 1}}, "a.b": [2]}}, {"": {"x": 1}, "y": [{"": 2, "z": [3]}]}, {1: "one", "1": "two"},
           [[{"k": "v"}]], [], {}, [1], [[1]], {"list": [{"q": 1}], "x.0": 2}, deep, "scalar", None,
           {"e": [[], [[]], {}], "n": [None, True, 1.5]}]
for value in unusual:
    for strip in (True, False):
        inner(TerraformBlock, "attr", value, strip)
for attributes in ({"a": [1], "a.0": 1}, {"a": [1, 2], "a.x": 1}, {"a": {"b": 1}, "a.b": 1}, {"a": "s", "ab.1": 2}, {"a": [1, 2], "ab.1": 2},
                   {"a": [{"b": 1}], "a.0": {"b": 1}, "a.0.b": 1}, {"a": 1}, {"a": [], "a.1x": 0}):
    for key in attributes:
        for leaf in (None, {}, utils.get_attribute_is_leaf(type("V", (), {"attributes": attributes})())):
            nested(key, attributes, leaf)

for path in sys.argv[2:]:
    with contextlib.redirect_stdout(io.StringIO()):
        Checkov(["-f", path, "--framework", "terraform_json", "--output", "json", "--compact", "--skip-download"]).run()
print(json.dumps({"compared": compared, "mismatches": mismatches[:20]}))
'''


def test_the_shortcuts_return_what_checkovs_own_functions_return(stacks: list[Path]) -> None:
    """``equivalent_shortcuts`` replaces three checkov functions and dpath's search and get as checkov's value checks
    see them (docs/checkov-workers.md). In the interpreter
    checkov runs in, a real checkov run over every stack (the example fleet, generated clusters, the
    known failures) calls checkov's original and the replacement with the same arguments at every call
    and requires the same return value (dict key order included), the same exception, and the same
    changes to the arguments; the same for values real stacks do not hold (keys whose paths meet, empty and
    non-string keys, nesting too deep for the replacement's own walk)."""
    python = checkov_scan.checkov_python(checkov_scan.checkov_binary())
    files = [str((d / "cdk.tf.json").resolve()) for d in stacks]
    done = subprocess.run([python, "-c", SHORTCUTS, str(checkov_scan.WORKER), *files], capture_output=True, text=True,
                          env=checkov_scan.checkov_env(), check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["mismatches"] == []
    assert found["compared"]["run_checks"] == len(files)
    assert found["compared"]["inner"] > 1000 and found["compared"]["nested"] > 1000, found["compared"]
    # 280 of each are the unusual calls; the stacks' value checks make about 270 searches and 220 gets
    assert found["compared"]["dpath.search"] > 280 + 200 and found["compared"]["dpath.get"] > 280 + 150, found["compared"]


# CKV2_GCP_17's first condition is ``database_version not_contains POSTGRES`` (checkov 3.3.30,
# terraform/checks/graph_checks/gcp/GCPPostgreSQLDatabaseFlaglog_statement_statsIsSetToOFF.json): on a
# number it raises TypeError (``in`` on an int) out of the complex solver, which has no try
# (common/checks_infra/solvers/complex_solvers/base_complex_solver.py:35-50).
RAISES = {"resource": {"google_sql_database_instance": {
    "a": {"name": "a", "database_version": "POSTGRES_15",
          "settings": {"tier": "db-f1-micro", "database_flags": [{"name": "log_statement_stats", "value": "on"}]}},
    "b": {"name": "b", "database_version": 15, "settings": {"tier": "db-f1-micro"}},
}}}


def test_a_graph_check_that_raises_is_dropped_as_the_cli_drops_it(tmp_path: Path) -> None:
    """checkov runs each graph check as a future and only waits for them (common/graph/checks_infra/registry.py:31-35):
    a check that raises leaves no result and the others still report. Run one after another, the exception must
    not end the stack's run (an error where the CLI reports findings) nor stop the checks after it."""
    stack = _stack(tmp_path, "raises", json.dumps(RAISES, indent=2))
    plain = cli([stack])[0]
    assert plain.error is None and plain.passed > 0  # the CLI reports the other checks
    assert not any(f.check_id == "CKV2_GCP_17" for f in plain.failures)  # a.database_flags fails it, but the check raised
    assert _workers_one_stack_per_chunk([stack]) == [plain]


GATED = r'''
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("checkov_worker", sys.argv[1])
worker = importlib.util.module_from_spec(spec)
spec.loader.exec_module(worker)
import checkov.version
from checkov.common.graph.checks_infra.registry import BaseRegistry
from checkov.terraform.graph_builder import local_graph, utils
from checkov.terraform.graph_builder.graph_components.blocks import TerraformBlock
from checkov.terraform.graph_builder.variable_rendering import renderer
from checkov.terraform.graph_builder.variable_rendering import evaluate_terraform
from checkov.common.parsers.yaml import loader
from checkov.terraform.checks.resource import base_resource_negative_value_check, base_resource_value_check
functions = lambda: [utils.attribute_has_nested_attributes, local_graph.attribute_has_nested_attributes,
                     renderer.attribute_has_nested_attributes, TerraformBlock.__dict__["get_inner_attributes"],
                     BaseRegistry.run_checks, evaluate_terraform.evaluate_terraform, loader.SafeLineLoader,
                     base_resource_value_check.dpath, base_resource_negative_value_check.dpath]
if sys.argv[2] != "installed":
    checkov.version.version = sys.argv[2]
before = functions()
worker.remember_rendering()
worker.parse_with_libyaml()
applied = worker.equivalent_shortcuts()
after = functions()
from checkov.common.runners import runner_registry
kept = worker.keep_reports()
print(json.dumps({"applied": applied, "installed": checkov.version.version,
                  "replaced": [a is not b for a, b in zip(before, after)],
                  "reports kept": [kept, type(runner_registry.json).__name__]}))
'''


@pytest.mark.parametrize("version", ["installed", "3.3.31", "3.3.3"])
def test_the_shortcuts_apply_only_to_the_checkov_whose_source_was_read(version: str) -> None:
    """The three replacements (and the remembered renderings and libyaml loader of earlier rounds) are equal to
    checkov 3.3.30's own functions, read line by line (docs/checkov-workers.md); another checkov may change those
    functions or their callers, so there the worker must run checkov's own code. The pinned checkov must be the reviewed one: an upgrade fails
    here until someone re-reads the new source and names its version in ``REVIEWED_CHECKOV``."""
    from safety import checkov_worker

    python = checkov_scan.checkov_python(checkov_scan.checkov_binary())
    done = subprocess.run([python, "-c", GATED, str(checkov_scan.WORKER), version], capture_output=True, text=True,
                          env=checkov_scan.checkov_env(), check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    if version == "installed":
        assert found["installed"] == checkov_worker.REVIEWED_CHECKOV, (
            f"checkov {found['installed']} is not the version whose source equivalent_shortcuts() was checked against "
            f"({checkov_worker.REVIEWED_CHECKOV}): re-read terraform/graph_builder/utils.py attribute_has_nested_attributes "
            "and its callers, both get_inner_attributes, common/graph/checks_infra/registry.py run_checks, "
            "variable_rendering/evaluate_terraform.py with safe_eval_functions.py, common/parsers/yaml/loader.py, and the "
            "value checks' dpath calls (terraform/checks/resource/base_resource_value_check.py, "
            "base_resource_negative_value_check.py) with the dpath it pins at the new version, then name it in "
            "REVIEWED_CHECKOV (and the dpath in REVIEWED_DPATH) (safety/checkov_worker.py)")
        assert found == {"applied": True, "installed": checkov_worker.REVIEWED_CHECKOV, "replaced": [True] * 9,
                         "reports kept": [True, "_ReportJson"]}
    else:
        assert found == {"applied": False, "installed": version, "replaced": [False] * 9, "reports kept": [False, "module"]}


KEPT = r"""
import importlib.util, json, os, sys
spec = importlib.util.spec_from_file_location("checkov_worker", sys.argv[1])
worker = importlib.util.module_from_spec(spec)
spec.loader.exec_module(worker)
args, home, files = json.loads(sys.argv[2]), sys.argv[3], sys.argv[4:]
worker.remember_rendering()
worker.parse_with_libyaml()
worker.equivalent_shortcuts()
text = [worker.run_one(args, f) for f in files]
assert worker.keep_reports()
shim = worker._report_json[0]
real_dumps, taken = shim.dumps, []
def counting(obj, *a, **k):
    out = real_dumps(obj, *a, **k)
    taken.append(out == worker._KEPT and k.get("indent") == 4)
    return out
shim.dumps = counting
def run(f):
    taken.clear()
    answer = worker.run_one(args, f)
    return answer, any(taken)
kept = [run(f) for f in files]
# options a .checkov.yaml in $HOME adds (checkov reads it at every run): a file written, external checks loaded
os.environ["HOME"] = home
results = os.path.join(home, "results")
configs = {"output file": f"output-file-path: {results}\n", "external checks": f"external-checks-dir:\n  - {home}/none\n"}
os.makedirs(os.path.join(home, "none"))
configured = {}
for name, config in configs.items():
    with open(os.path.join(home, ".checkov.yaml"), "w") as out:
        out.write(config)
    configured[name] = run(files[0])
os.remove(os.path.join(home, ".checkov.yaml"))
written = json.load(open(os.path.join(results, "results_json.json")))
from checkov.common.runners import runner_registry
real = runner_registry.RunnerRegistry.print_reports
def noisy(self, *a, **k):  # a report printed beside another line: the text path, whose bytes are checkov's
    print("a line besides the report")
    return real(self, *a, **k)
runner_registry.RunnerRegistry.print_reports = noisy
noisy_kept = run(files[0])
runner_registry.RunnerRegistry.print_reports = real
alone = run(files[0])
print(json.dumps({"same": [k[0] for k in kept] == text, "taken": [k[1] for k in kept],
                  "configured": {n: [a == text[0], t] for n, (a, t) in configured.items()},
                  "written": sorted(written) if isinstance(written, dict) else type(written).__name__,
                  "noisy": [noisy_kept[0], noisy_kept[1]], "alone": [alone[0] == text[0], alone[1]]}))
"""


def test_a_report_taken_as_the_object_is_the_report_read_from_the_text(stacks: list[Path], tmp_path: Path) -> None:
    """``keep_reports``: checkov's JSON report taken as the object ``print_reports`` would encode (twice) gives each
    stack's report exactly as reading the printed text does. A run whose options (from argv or a ``.checkov.yaml``:
    a red team's find) write the report to a file or load external checks keeps checkov's own encoding, and anything
    printed beside the report falls back to the text."""
    python = checkov_scan.checkov_python(checkov_scan.checkov_binary())
    args = checkov_scan.checkov_args(("CKV_GCP_61",))
    files = [str(d / "cdk.tf.json") for d in stacks]
    (tmp_path / "home").mkdir()
    done = subprocess.run([python, "-c", KEPT, str(checkov_scan.WORKER), json.dumps(args), str(tmp_path / "home"), *files],
                          capture_output=True, text=True, env=checkov_scan.checkov_env(), check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["same"] and found["taken"] == [True] * len(files)
    assert found["configured"] == {"output file": [True, False], "external checks": [True, False]}
    assert found["written"] == ["check_type", "results", "summary", "url"]  # the report itself, not the placeholder
    assert found["noisy"] == [{"error": "checkov printed no JSON report"}, True]  # the text path's verdict, as before
    assert found["alone"] == [True, True]
