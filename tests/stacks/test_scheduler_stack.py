"""Scheduler stacks: providers configured from the infra stack's outputs, Nomad objects, stack list."""

from __future__ import annotations

import json
import re

import pytest
from ruamel.yaml import YAML

import clusters
from clusters.schema import ClusterConfig
from stacks.layout import plan_stacks
from tests.conftest import FLEET_CLUSTERS

REMOTE = re.compile(r"data\.terraform_remote_state\.([\w-]+)\.outputs\.([\w-]+)")


def remote_refs(value: str) -> list[tuple[str, str]]:
    return REMOTE.findall(value)


def resolve(stack_json, scheduler: str, infra: str, value: str) -> list[str]:
    """Follow each remote-state reference in ``value`` to the infra output it reads; return those outputs' values."""
    sched = stack_json(scheduler)
    outputs = stack_json(infra)["output"]
    values = []
    for data_name, output in remote_refs(value):
        remote = sched["data"]["terraform_remote_state"][data_name]
        assert output in outputs, f"{scheduler} reads output {output!r} that {infra} does not declare"
        values.append((remote, outputs[output]["value"]))
    assert values, f"{value!r} reads nothing from {infra}"
    return values


def test_each_cluster_has_infra_then_scheduler_and_tfc_clusters_need_their_workspaces(example_configs, fleet_out):
    info = plan_stacks(example_configs)
    assert [(s.name, s.kind, s.depends_on) for s in info] == [
        ("tfc-workspaces", "tfc-workspaces", ()),
        ("dev-gke", "infra", ()), ("dev-gke-scheduler", "scheduler", ("dev-gke",)),
        ("prod-gke", "infra", ()), ("prod-gke-scheduler", "scheduler", ("prod-gke",)),
        ("prod-nomad", "infra", ("tfc-workspaces",)), ("prod-nomad-scheduler", "scheduler", ("tfc-workspaces", "prod-nomad")),
        ("train-a3mega", "infra", ()), ("train-a3mega-scheduler", "scheduler", ("train-a3mega",)),
    ]
    assert sorted(p.name for p in (fleet_out / "stacks").iterdir()) == sorted(s.name for s in info)
    manifest = json.loads((fleet_out / "manifest.json").read_text())["stacks"]
    assert {n: m["dependencies"] for n, m in manifest.items() if n.endswith("-scheduler")} == {
        "dev-gke-scheduler": ["dev-gke"], "prod-gke-scheduler": ["prod-gke"], "prod-nomad-scheduler": ["prod-nomad"],
        "train-a3mega-scheduler": ["train-a3mega"]}


def test_kubernetes_provider_reaches_the_dns_endpoint_read_from_the_infra_stack(stack_json):
    """Review A2: CI runners are in no authorized network; the DNS endpoint admits them by IAM, so plans reach the API."""
    (provider,) = stack_json("prod-gke-scheduler")["provider"]["kubernetes"]
    [(remote, host)] = resolve(stack_json, "prod-gke-scheduler", "prod-gke", provider["host"])
    assert provider["host"].startswith("https://")
    assert host == "${google_container_cluster.gke.control_plane_endpoints_config[0].dns_endpoint_config[0].endpoint}"
    assert remote["backend"] == "gcs"
    assert remote["config"] == {"bucket": "gpufleet-tfstate-prod", "prefix": "gpufleet/prod-gke"}
    assert stack_json("prod-gke")["terraform"]["backend"]["gcs"] == remote["config"], "remote state must read the infra stack's own state"
    gke = stack_json("prod-gke")["resource"]["google_container_cluster"]["gke"]
    assert gke["control_plane_endpoints_config"] == {"dns_endpoint_config": {"allow_external_traffic": True}}
    assert "cluster_ca_certificate" not in provider, "the DNS endpoint serves a publicly trusted certificate, not the cluster CA"


def test_without_the_dns_endpoint_the_provider_pins_the_ip_endpoint_and_its_ca(example_configs):
    from cdktf import Testing

    from stacks.fleet import build_fleet

    prod = {c.name: c for c in example_configs}["prod-gke"]
    config = prod.model_copy(update={"gke": prod.gke.model_copy(update={"dns_endpoint": False})})
    fleet = build_fleet(Testing.app(), (config,))
    sched = json.loads(Testing.synth(fleet.stacks["prod-gke-scheduler"]))
    (provider,) = sched["provider"]["kubernetes"]
    assert set(provider) == {"host", "cluster_ca_certificate", "exec"}
    assert provider["cluster_ca_certificate"].startswith("${base64decode(")
    infra = json.loads(Testing.synth(fleet.stacks["prod-gke"]))
    assert infra["resource"]["google_container_cluster"]["gke"]["control_plane_endpoints_config"] == {
        "dns_endpoint_config": {"allow_external_traffic": False}}


def test_nomad_provider_reads_the_server_address_from_the_infra_stack_and_no_token(stack_json):
    (provider,) = stack_json("prod-nomad-scheduler")["provider"]["nomad"]
    [(remote, ip)] = resolve(stack_json, "prod-nomad-scheduler", "prod-nomad", provider["address"])
    assert re.fullmatch(r"https://\$\{data\.terraform_remote_state\.[\w-]+\.outputs\.[\w-]+\}:4646", provider["address"])
    assert ip == "${google_compute_forwarding_rule.nomad_api.ip_address}"
    assert remote["backend"] == "remote"
    assert remote["config"] == {"organization": "gpufleet", "workspaces": {"name": stack_json("prod-nomad")["terraform"]["cloud"]["workspaces"]["name"]}}
    assert "secret_id" not in provider and "token" not in json.dumps(provider)


def test_nomad_node_pool_per_gpu_pool_with_accelerator_meta(stack_json):
    pools = stack_json("prod-nomad-scheduler")["resource"]["nomad_node_pool"]
    assert sorted(p["name"] for p in pools.values()) == ["a100", "l4"]
    meta = pools["nomad_node_pool_a100"]["meta"]
    assert (meta["accelerator"], meta["gpus_per_node"], meta["gpu_memory_gib"]) == ("nvidia-tesla-a100", "2", "40")
    assert pools["nomad_node_pool_l4"]["meta"]["accelerator"] == "nvidia-l4"


def test_nomad_tenant_namespace_and_acl_policy_limited_to_it(stack_json):
    import hcl

    resources = stack_json("prod-nomad-scheduler")["resource"]
    assert sorted(n["name"] for n in resources["nomad_namespace"].values()) == ["eval", "finetune"]
    policy = resources["nomad_acl_policy"]["nomad_acl_finetune"]
    rules = hcl.loads(policy["rules_hcl"])
    assert list(rules) == ["namespace"], "a tenant policy grants nothing outside its namespace"
    assert list(rules["namespace"]) == ["finetune"]
    caps = set(rules["namespace"]["finetune"]["capabilities"])
    assert {"read-job", "list-jobs", "read-logs"} <= caps
    assert not caps & {"submit-job", "dispatch-job"}, "on Nomad CE only the dispatcher, which checks the GPU quota, may start jobs"
    assert not caps & {"alloc-exec", "alloc-node-exec", "csi-write-volume", "host-volume-write", "sentinel-override", "scale-job"}
    assert policy["depends_on"] == ["nomad_namespace.nomad_ns_finetune"]
    dispatcher = hcl.loads(resources["nomad_acl_policy"]["nomad_acl_dispatcher"]["rules_hcl"])
    assert sorted(dispatcher["namespace"]) == ["eval", "finetune"]
    assert {"submit-job", "dispatch-job"} <= set(dispatcher["namespace"]["eval"]["capabilities"])
    # Read-only beyond the namespaces: /v1/agent/members (which servers answer) needs node:read.
    assert sorted(dispatcher) == ["namespace", "node"] and dispatcher["node"]["policy"] == "read"


def test_scheduler_stacks_keep_their_own_state(stack_json):
    assert stack_json("prod-gke-scheduler")["terraform"]["backend"]["gcs"]["prefix"] == "gpufleet/prod-gke-scheduler"
    assert stack_json("prod-nomad-scheduler")["terraform"]["cloud"]["workspaces"]["name"] == "gpufleet-prod-nomad-scheduler"
    assert stack_json("dev-gke-scheduler")["terraform"]["backend"]["local"]["path"] == "../../../.gpufleet/state/terraform.dev-gke-scheduler.tfstate"


@pytest.fixture(scope="module")
def existing_servers_fleet(fleet_out):
    """prod-nomad pointed at existing servers, built in-process (the providers are already loaded)."""
    from cdktf import Testing

    from stacks.fleet import build_fleet

    data = YAML(typ="safe").load((FLEET_CLUSTERS / "prod-nomad.yaml").read_text())
    data["nomad"]["existing_servers"] = ["10.50.0.10", "10.50.0.11:4647"]
    config = ClusterConfig.model_validate(data)
    fleet = build_fleet(Testing.app(), (config,))
    return {name: json.loads(Testing.synth(stack)) for name, stack in fleet.stacks.items()}


def test_existing_servers_replace_the_server_group_and_feed_client_join(existing_servers_fleet):
    import hcl

    infra = existing_servers_fleet["prod-nomad"]["resource"]
    assert "nomad_servers" not in infra["google_compute_region_instance_group_manager"]
    assert "google_compute_forwarding_rule" not in infra
    assert "nomad_autojoin_compute_viewer" not in infra["google_project_iam_member"]
    script = infra["google_compute_instance_template"]["nomad_client_template_a100"]["metadata_startup_script"]
    config = hcl.loads(script.split("<<'GPUFLEET_NOMAD_CONFIG'\n", 1)[1].split("GPUFLEET_NOMAD_CONFIG", 1)[0])
    assert config["client"]["server_join"]["retry_join"] == ["10.50.0.10", "10.50.0.11:4647"]


def test_existing_servers_address_is_a_variable_defaulting_to_the_first_server(existing_servers_fleet):
    sched = existing_servers_fleet["prod-nomad-scheduler"]
    assert sched["variable"]["nomad_address"]["default"] == "https://10.50.0.10:4646"
    assert sched["provider"]["nomad"][0]["address"] == "${var.nomad_address}"
    assert "data" not in sched, "nothing to read from the infra stack"


def test_local_state_read_by_the_scheduler_is_the_infra_state_and_lives_outside_cdktf_out(stack_json, fleet_out):
    """Relative local paths resolve per stack dir; both must name one file that synthesis never deletes."""
    written = stack_json("dev-gke")["terraform"]["backend"]["local"]["path"]
    reads = stack_json("dev-gke-scheduler")["data"]["terraform_remote_state"]
    (read,) = [r["config"]["path"] for r in reads.values() if r["backend"] == "local"]
    infra_file = (fleet_out / "stacks" / "dev-gke" / written).resolve()
    assert (fleet_out / "stacks" / "dev-gke-scheduler" / read).resolve() == infra_file
    assert fleet_out.resolve() not in infra_file.parents
