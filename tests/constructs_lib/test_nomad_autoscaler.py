"""Nomad Autoscaler config and per-pool gce-mig policies, parsed back and checked key by key
against the autoscaler's own decode structs (vendored extract, hashicorp/nomad-autoscaler v0.4.9:
agent/config/config.go, sdk/policy.go, sdk/target.go, gce-mig plugin.go)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import hcl
import pytest

from clusters.derive.pools import derive_gpu_pools
from constructs_lib.nomad_autoscaler import demand_query, render_agent_config, render_policy
from jobs.loader import load_all
from jobs.nomad.render import render

KEYS = json.loads((Path(__file__).parent / "vendor" / "nomad_autoscaler_keys.json").read_text())


def keys(struct: str) -> set[str]:
    return {k for k, kind in KEYS[struct].items() if kind != "label"}


@pytest.fixture(scope="module")
def prod(example_configs):
    return {c.name: c for c in example_configs}["prod-nomad"]


@pytest.fixture(scope="module")
def pools(prod):
    return {p.name: p for p in derive_gpu_pools(prod)}


@pytest.fixture(scope="module")
def server_script(stack_json):
    return stack_json("prod-nomad")["resource"]["google_compute_instance_template"]["nomad_server_template"]["metadata_startup_script"]


def policy(pools, name):
    return hcl.loads(render_policy(spec=pools[name], cluster="prod-nomad", project="ml-finetune-prod", region="europe-west4"))


@pytest.mark.parametrize("name", ["a100", "l4"])
def test_policy_uses_only_keys_the_autoscaler_decodes(pools, name):
    doc = policy(pools, name)
    assert set(doc) <= keys("FileDecodeScalingPolicies")
    (scaling,) = doc["scaling"].values()
    assert set(scaling) <= keys("FileDecodeScalingPolicy") and "max" in scaling
    assert set(scaling["policy"]) <= keys("FileDecodePolicyDoc")
    (check,) = scaling["policy"]["check"].values()
    assert set(check) <= keys("FileDecodePolicyCheckDoc")
    (target,) = scaling["policy"]["target"].values()
    assert set(target) <= set(KEYS["gce_mig_target_keys"])
    assert all(isinstance(v, str) for v in target.values()), "target config decodes into map[string]string"
    assert target["node_selector_strategy"] in KEYS["node_selector_strategies"]


def test_pools_follow_the_queue_within_the_file_bounds_and_never_drop_busy_nodes(pools):
    a100, l4 = policy(pools, "a100")["scaling"]["prod-nomad-a100"], policy(pools, "l4")["scaling"]["prod-nomad-l4"]
    assert (a100["type"], a100["min"], a100["max"]) == ("cluster", 1, 6)
    assert (l4["min"], l4["max"]) == (0, 10), "a pool at zero is scaled by its queue, not by node metrics"
    check = l4["policy"]["check"]["gpu_demand"]
    assert check["source"] == "prometheus" and list(check["strategy"]) == ["pass-through"]
    target = l4["policy"]["target"]["gce-mig"]
    assert target == {"project": "ml-finetune-prod", "region": "europe-west4", "mig_name": "prod-nomad-l4", "node_pool": "l4",
                      "node_class": "l4", "node_drain_deadline": "15m", "node_drain_ignore_system_jobs": "true",
                      "node_selector_strategy": "empty_ignore_system", "node_purge": "true"}


def test_demand_query_counts_the_task_groups_jobs_actually_render(pools):
    query = demand_query(pools["a100"])
    groups = set(re.findall(r'task_group="([^"]+)"', query))
    assert groups == {"gpu-a100-x1", "gpu-a100-x2"}
    assert query.startswith("ceil((1 * (") and query.endswith(") / 2)") and "2 * (" in query
    for spec in (s for s in load_all() if s.scheduler.value == "nomad"):  # GKE jobs render Kubernetes manifests
        group = render(spec)["Job"]["TaskGroups"][0]["Name"]
        assert group in set(re.findall(r'task_group="([^"]+)"', demand_query(pools[spec.pool.name]))), spec.name
    assert all(f"nomad_nomad_job_summary_{s}" in query for s in ("queued", "starting", "running"))


def test_agent_config_keys_tls_and_no_token():
    text = render_agent_config(nomad_region="global", prometheus_address="https://prom.example.com:9090", ca_file="/ca.pem",
                               cert_file="/c.pem", key_file="/k.pem")
    doc = hcl.loads(text)
    assert set(doc) <= keys("Agent")
    assert set(doc["nomad"]) <= keys("Nomad") and "token" not in doc["nomad"], "the token comes from NOMAD_TOKEN, never a file"
    assert doc["nomad"]["address"].startswith("https://") and doc["nomad"]["tls_server_name"] == "server.global.nomad"
    assert doc["high_availability"] == {"enabled": True}
    assert set(doc["policy"]) <= keys("Policy")
    for kind in ("apm", "target", "strategy"):
        for plugin in doc[kind].values():
            assert set(plugin) <= keys("Plugin")
    assert doc["apm"]["prometheus"]["config"] == {"address": "https://prom.example.com:9090"}
    assert re.search(r"^  config = \{ address = ", text, re.M), "config is an attribute (map[string]string), not a block"


def test_servers_run_the_autoscaler_and_groups_leave_their_size_to_it(stack_json, server_script, tmp_path):
    resources = stack_json("prod-nomad")["resource"]
    assert "google_compute_region_autoscaler" not in resources, "no CPU-driven GCE autoscaler on GPU groups"
    for name, size in (("a100", 1), ("l4", 0)):
        group = resources["google_compute_region_instance_group_manager"][f"nomad_pool_{name}"]
        assert group["target_size"] == size and group["lifecycle"]["ignore_changes"] == ["target_size"]
    assert "/etc/nomad-autoscaler.d/policies/prod-nomad-l4.hcl" in server_script
    assert "gpufleet_secret prod-nomad-nomad-autoscaler-token /etc/nomad-autoscaler.d/token.env.raw" in server_script
    assert "grep -Eq '^[0-9a-f-]{36}$'" in server_script, "the token is checked before it goes into the environment file"
    client = resources["google_compute_instance_template"]["nomad_client_template_l4"]["metadata_startup_script"]
    assert "autoscaler" not in client
    roles = {m["role"] for m in resources["google_project_iam_member"].values() if "nomad_server_sa" in m["member"]}
    assert "roles/compute.instanceAdmin.v1" in roles
    (tmp_path / "server.sh").write_text(server_script)
    assert subprocess.run(["bash", "-n", str(tmp_path / "server.sh")], capture_output=True, check=False).returncode == 0


def test_autoscaler_acl_policy_can_drain_nodes_and_hold_its_lock(stack_json):
    rules = hcl.loads(stack_json("prod-nomad-scheduler")["resource"]["nomad_acl_policy"]["nomad_acl_autoscaler"]["rules_hcl"])
    assert rules["node"] == {"policy": "write"}
    assert rules["namespace"]["default"]["variables"]["path"]["nomad-autoscaler/lock"]["capabilities"] == ["read", "write", "destroy"]


# Go's time.ParseDuration grammar (src/time/format.go): a sequence of decimal numbers, each with a
# unit; "0" alone is allowed.
GO_DURATION = re.compile(r"^(0|([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+$")
GO_BOOLS = {"1", "t", "T", "TRUE", "true", "True", "0", "f", "F", "FALSE", "false", "False"}  # strconv.ParseBool


def policy_errors(doc: dict) -> list[str]:
    """What hashicorp/nomad-autoscaler v0.4.9 refuses in a file policy, from the vendored extract:
    decodePolicyDoc (policy/file/parse.go: durations via time.ParseDuration, empty type -> cluster),
    ScalingPolicy.Validate (sdk/policy.go: type, on_check_error/on_error in fail|ignore, at least one
    check, every check a strategy, no app-sizing strategy on cluster policies) and the gce-mig
    target's parsing (sdk/helper/scaleutils: drain deadline a duration, purge/ignore flags booleans)."""
    errors = []
    for name, scaling in doc["scaling"].items():
        kind = scaling.get("type") or "cluster"
        if kind not in KEYS["policy_types"]:
            errors.append(f"{name}: type {kind!r}")
        if not isinstance(scaling.get("max"), int) or scaling.get("min", 0) > scaling["max"]:
            errors.append(f"{name}: min/max")
        body = scaling["policy"]
        if body.get("on_check_error", "") not in ("", *KEYS["on_error_values"]):
            errors.append(f"{name}: on_check_error {body['on_check_error']!r}")
        checks = body.get("check", {})
        if not checks:
            errors.append(f"{name}: no checks")
        for field in KEYS["duration_fields"]:
            for where in [body, *checks.values()]:
                if field in where and not GO_DURATION.match(where[field]):
                    errors.append(f"{name}: {field} {where[field]!r}")
        for check_name, check in checks.items():
            strategies = check.get("strategy", {})
            if len(strategies) != 1 or not next(iter(strategies)):
                errors.append(f"{name}/{check_name}: strategy")
            elif kind in ("cluster", "horizontal") and next(iter(strategies)).startswith("app-sizing"):
                errors.append(f"{name}/{check_name}: app-sizing strategy")
            if check.get("on_error", "") not in ("", *KEYS["on_error_values"]):
                errors.append(f"{name}/{check_name}: on_error {check['on_error']!r}")
        for target in body.get("target", {}).values():
            errors += [f"{name}: target {k} {target[k]!r}" for k in KEYS["target_duration_keys"] if k in target and not GO_DURATION.match(target[k])]
            errors += [f"{name}: target {k} {target[k]!r}" for k in KEYS["target_bool_keys"] if k in target and target[k] not in GO_BOOLS]
    return errors


@pytest.mark.parametrize("name", ["a100", "l4"])
def test_policy_values_pass_the_autoscalers_own_validation(pools, name):
    assert policy_errors(policy(pools, name)) == []


@pytest.mark.parametrize(("path", "value"), [
    (("policy", "on_check_error"), "error"),
    (("policy", "cooldown"), "5 minutes"),
    (("policy", "evaluation_interval"), "1"),
    (("policy", "target", "gce-mig", "node_drain_deadline"), "15"),
    (("policy", "target", "gce-mig", "node_purge"), "yes"),
    (("type",), "gce"),
])
def test_the_validator_refuses_what_the_autoscaler_refuses(pools, path, value):
    doc = policy(pools, "l4")
    (scaling,) = doc["scaling"].values()
    where = scaling
    for key in path[:-1]:
        where = where[key]
    where[path[-1]] = value
    assert policy_errors(doc), f"{path}={value!r} should be refused"


def test_vendored_value_rules_name_their_source():
    assert KEYS["_provenance"]["tag"] == "v0.4.9" and "policy/file/parse.go" in KEYS["_provenance"]["files"]
    assert KEYS["on_error_values"] == ["fail", "ignore"]
