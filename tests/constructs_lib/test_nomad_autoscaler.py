"""Nomad Autoscaler config and per-pool gce-mig policies, parsed back and checked key by key
against the autoscaler's own decode structs (vendored extract, hashicorp/nomad-autoscaler v0.4.9:
agent/config/config.go, sdk/policy.go, sdk/target.go, gce-mig plugin.go)."""

from __future__ import annotations

import fnmatch
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
from tests.constructs_lib.autoscaler_rules import agent_errors, go_parse_duration, policy_errors, strategy_errors

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


@pytest.fixture(scope="module")
def agent():
    return hcl.loads(render_agent_config(nomad_region="global", prometheus_address="https://prom.example.com:9090", ca_file="/ca.pem",
                                         cert_file="/c.pem", key_file="/k.pem"))


@pytest.mark.parametrize("name", ["a100", "l4"])
def test_policy_values_pass_the_autoscalers_own_validation(pools, agent, name):
    assert policy_errors(policy(pools, name), agent) == []


def test_agent_config_values_pass_the_autoscalers_own_parsing(agent):
    assert agent_errors(agent) == []


@pytest.mark.parametrize(("path", "value"), [
    (("policy", "on_check_error"), "error"),
    (("policy", "cooldown"), "5 minutes"),
    (("policy", "evaluation_interval"), "1"),
    (("policy", "target", "gce-mig", "node_drain_deadline"), "15"),
    (("policy", "target", "gce-mig", "node_purge"), "yes"),
    (("policy", "target", "gce-mig", "node_selector_strategy"), "emptiest"),
    (("policy", "target", "gce-mig", "retry_attempts"), "1_0"),
    (("policy", "check", "gpu_demand", "strategy", "pass-through", "max_scale_up"), "2.5"),
    (("policy", "check", "gpu_demand", "source"), "prom"),
    (("type",), "gce"),
    (("min",), -1),
    (("min",), 11),
])
def test_the_validator_refuses_what_the_autoscaler_refuses(pools, agent, path, value):
    doc = policy(pools, "l4")
    (scaling,) = doc["scaling"].values()
    where = scaling
    for key in path[:-1]:
        where = where[key]
    where[path[-1]] = value
    assert policy_errors(doc, agent), f"{path}={value!r} should be refused"


@pytest.mark.parametrize("key", ["project", "mig_name", "region"])
def test_the_validator_refuses_a_target_missing_what_gce_mig_requires(pools, agent, key):
    doc = policy(pools, "l4")
    del doc["scaling"]["prod-nomad-l4"]["policy"]["target"]["gce-mig"][key]
    assert any("needs one of" in e for e in policy_errors(doc, agent))


def test_the_validator_refuses_a_target_with_no_node_pool_identifier(pools, agent):
    doc = policy(pools, "l4")
    target = doc["scaling"]["prod-nomad-l4"]["policy"]["target"]["gce-mig"]
    del target["node_pool"], target["node_class"]
    assert policy_errors(doc, agent) == ["prod-nomad-l4/target gce-mig: needs one of ['datacenter', 'node_class', 'node_pool']"]


def test_the_validator_refuses_strategy_configs_the_plugins_refuse():
    assert strategy_errors("c", "target-value", {}) == ["c: needs any of ['target']"]
    assert strategy_errors("c", "target-value", {"target": "0.8"}) == []
    assert strategy_errors("c", "threshold", {"upper_bound": "10", "delta": "1", "value": "2"})
    assert strategy_errors("c", "threshold", {"lower_bound": "x", "delta": "1"})


def test_the_validator_refuses_prometheus_apm_config_the_plugin_refuses(agent):
    bad = {**agent, "apm": {"prometheus": {"driver": "prometheus", "config": {"skip_verify": "yes", "client_cert": "/c.pem"}}}}
    assert agent_errors(bad) == ["apm prometheus: address required", "apm prometheus: skip_verify 'yes' is not a Go bool",
                                 "apm prometheus: client_cert is not a key the prometheus APM reads"]


# Cases from go/src/time/time_test.go (parseDurationTests / parseDurationErrorTests).
@pytest.mark.parametrize(("text", "ns"), [
    ("0", 0), ("5s", 5 * 10**9), ("-5s", -5 * 10**9), ("+5s", 5 * 10**9), ("-0", 0), ("5.s", 5 * 10**9), (".5s", 5 * 10**8),
    ("1.004s", 1_004_000_000), ("10ns", 10), ("11us", 11_000), ("12\u00b5s", 12_000), ("12\u03bcs", 12_000), ("15m", 15 * 60 * 10**9),
    ("3h30m", 12_600 * 10**9), ("10.5s4m", 250_500_000_000), ("1h2m3s4ms5us6ns", 3_723_004_005_006),
    ("9223372036854775807ns", (1 << 63) - 1), ("9223372036854775.807us", (1 << 63) - 1), ("-9223372036854775808ns", -(1 << 63)),
])
def test_go_duration_port_accepts_what_go_accepts(text, ns):
    assert go_parse_duration(text) == ns


@pytest.mark.parametrize("text", ["", "3", "-", "s", ".", "-.", ".s", "+.s", "1d", "5 m", "1.5 h", "15", "9223372036854775808ns",
                                  "-9223372036854775809ns", "hello \xffff world"])
def test_go_duration_port_refuses_what_go_refuses(text):
    with pytest.raises(ValueError):
        go_parse_duration(text)


def test_vendored_value_rules_name_their_source():
    assert KEYS["_provenance"]["tag"] == "v0.4.9" and KEYS["_provenance"]["commit"] == "82611d2f97df7736a8dbffeda55dfc715fe9cc72"
    assert KEYS["on_error_values"] == ["fail", "ignore"]
    tables = {k for k in KEYS if not k.startswith("_")} | {"strategy_required.target-value", "strategy_required.threshold"}
    assert all(re.fullmatch(r"[a-z0-9/_.-]+\.go:[0-9]+", w) for w in KEYS["_where"].values())
    assert {t for t in tables if t not in ("strategy_config", "strategy_required")} <= set(KEYS["_where"])


def test_every_policy_the_server_boot_script_writes_passes_with_the_config_it_writes(server_script):
    """What the synthesized stack ships, not a re-render: each heredoc the boot script writes."""
    config = hcl.loads(re.search(r"<<'GPUFLEET_AUTOSCALER_CONFIG'\n(.*?)GPUFLEET_AUTOSCALER_CONFIG", server_script, re.S).group(1))
    policies = re.findall(r"<<'GPUFLEET_AUTOSCALER_POLICY'\n(.*?)GPUFLEET_AUTOSCALER_POLICY", server_script, re.S)
    assert len(policies) == 2 and agent_errors(config) == []
    for text in policies:
        assert policy_errors(hcl.loads(text), config) == []


def test_the_autoscaler_authenticates_with_its_own_certificate_and_verifies_the_https_prometheus(server_script):
    """Issue 23: not the servers' certificate and key; ``ca_cert`` (a path, nomad-autoscaler v0.4.9
    plugins/builtin/apm/prometheus/plugin/plugin.go:45-47,173-187) because the example's Prometheus is https."""
    from clusters.derive.nomad import AUTOSCALER_CERT_FILE, AUTOSCALER_KEY_FILE, PROMETHEUS_CA_FILE
    from constructs_lib.nomad_agent_config import CERT_FILE, KEY_FILE

    script = server_script
    config = script.split("<<'GPUFLEET_AUTOSCALER_CONFIG'\n", 1)[1].split("GPUFLEET_AUTOSCALER_CONFIG", 1)[0]
    assert f'client_cert = "{AUTOSCALER_CERT_FILE}"' in config and f'client_key = "{AUTOSCALER_KEY_FILE}"' in config
    assert CERT_FILE not in config and KEY_FILE not in config, "the servers' own key is not lent to the autoscaler"
    assert f'ca_cert = "{PROMETHEUS_CA_FILE}"' in config
    for path, secret in ((AUTOSCALER_CERT_FILE, "autoscaler-cert"), (AUTOSCALER_KEY_FILE, "autoscaler-key"), (PROMETHEUS_CA_FILE, "prometheus-ca")):
        assert f"gpufleet_secret prod-nomad-nomad-{secret} {path}" in script


def test_the_autoscaler_acl_policy_grants_what_v0_4_9_calls_and_nothing_more():
    """Derived in constructs_lib/nomad_tenancy.py from the autoscaler's and Nomad's source (cited there)."""
    import hcl

    from constructs_lib.nomad_tenancy import AUTOSCALER_RULES

    rules = hcl.loads(AUTOSCALER_RULES)
    assert rules["node"] == {"policy": "write"}
    assert rules["namespace"]["*"] == {"capabilities": ["read-job", "list-scaling-policies", "read-scaling-policy"]}
    assert rules["namespace"]["default"] == {"capabilities": ["read-job", "list-scaling-policies", "read-scaling-policy"],
                                             "variables": {"path": {"nomad-autoscaler/lock": {"capabilities": ["read", "write", "destroy"]}}}}
    assert set(rules) == {"node", "namespace"}, "no agent, operator or plugin access"


def _namespace_capabilities(rules: dict, namespace: str) -> set[str]:
    """The capabilities Nomad v1.10.5 grants a token in ``namespace``: acl/acl.go NewACL (:106-170) keeps one set per
    namespace block, a block with only ``variables`` an empty one, and matchingNamespaceCapabilitySet (:572-581)
    takes the exact namespace's set when there is one, a glob's only otherwise (never the union)."""
    blocks = rules["namespace"]
    chosen = blocks.get(namespace)
    if chosen is None:
        chosen = next((blocks[name] for name in blocks if fnmatch.fnmatchcase(namespace, name)), {})
    return set(chosen.get("capabilities", ()))


@pytest.mark.parametrize("namespace", ["default", "team-a"])
def test_the_autoscaler_reads_jobs_and_scaling_policies_in_every_namespace_including_default(namespace):
    """A job without a tenant runs in "default" (jobs/nomad/dispatch.py); without read-job there, Nomad hides its
    allocations from Node.GetAllocs, the empty-node selector takes its busy node for empty and scale-in drains it."""
    import hcl

    from constructs_lib.nomad_tenancy import AUTOSCALER_RULES

    granted = _namespace_capabilities(hcl.loads(AUTOSCALER_RULES), namespace)
    assert {"read-job", "list-scaling-policies", "read-scaling-policy"} <= granted
