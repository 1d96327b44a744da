"""Nomad infra stack: GPU instance groups whose boot script carries the pool's rendered client config."""

from __future__ import annotations

import re

import hcl
import pytest

from clusters.derive.pools import derive_gpu_pools
from constructs_lib.nomad_agent_config import AgentJoin, render_client_config
from constructs_lib.nomad_servers import server_tag


@pytest.fixture(scope="module")
def nomad(stack_json):
    return stack_json("prod-nomad")["resource"]


@pytest.fixture(scope="module")
def config(example_configs):
    return {c.name: c for c in example_configs}["prod-nomad"]


def embedded_config(template: dict) -> str:
    match = re.search(r"<<'GPUFLEET_NOMAD_CONFIG'\n(.*?)GPUFLEET_NOMAD_CONFIG", template["metadata_startup_script"], re.S)
    assert match, "startup script embeds no Nomad config"
    return match.group(1)


@pytest.mark.parametrize("pool", ["a100", "l4"])
def test_boot_script_carries_the_pools_rendered_client_config(nomad, config, pool):
    template = nomad["google_compute_instance_template"][f"nomad_client_template_{pool}"]
    spec = {s.name: s for s in derive_gpu_pools(config)}[pool]
    join = AgentJoin.for_cluster(project=config.gcp.project, server_tag=server_tag(config.name), existing_servers=())
    expected = render_client_config(spec=spec, cluster=config.name, datacenter="europe-west4", region="global", join=join)
    assert embedded_config(template) == expected
    parsed = hcl.loads(embedded_config(template))["client"]
    assert (parsed["node_class"], parsed["node_pool"]) == (pool, pool)


def test_gpu_template_is_hardened_and_terminates_on_maintenance(nomad):
    t = nomad["google_compute_instance_template"]["nomad_client_template_a100"]
    assert t["machine_type"] == "a2-highgpu-2g"
    assert t["guest_accelerator"] == [{"type": "nvidia-tesla-a100", "count": 2}]
    assert t["scheduling"]["on_host_maintenance"] == "TERMINATE"
    assert t["shielded_instance_config"] == {"enable_secure_boot": True, "enable_vtpm": True, "enable_integrity_monitoring": True}
    assert t["service_account"]["email"] == "${google_service_account.node_sa.email}"
    assert t["network_interface"] == [{"subnetwork": "${google_compute_subnetwork.subnet.id}"}], "no access_config: no external IP"
    assert t["metadata"]["block-project-ssh-keys"] == "true" and t["metadata"]["serial-port-enable"] == "false"
    assert t["disk"][0]["disk_size_gb"] == 300
    assert t["disk"][0]["source_image"].endswith("ubuntu-accelerator-2204-amd64-with-nvidia-550")
    assert t["tags"] == ["prod-nomad-nomad-client"]
    assert t["lifecycle"] == {"create_before_destroy": True}
    assert t["reservation_affinity"] == {"type": "NO_RESERVATION"}


def test_spot_pool_template_uses_the_spot_model(nomad):
    s = nomad["google_compute_instance_template"]["nomad_client_template_l4"]["scheduling"]
    assert s == {"on_host_maintenance": "TERMINATE", "automatic_restart": False, "provisioning_model": "SPOT",
                 "preemptible": True, "instance_termination_action": "DELETE"}
    assert nomad["google_compute_instance_template"]["nomad_client_template_a100"]["scheduling"]["automatic_restart"] is True


def test_groups_are_regional_protected_and_sized_by_the_nomad_autoscaler(nomad):
    group = nomad["google_compute_region_instance_group_manager"]["nomad_pool_a100"]
    assert group["distribution_policy_zones"] == ["europe-west4-a", "europe-west4-b"]
    assert group["version"] == [{"name": "primary", "instance_template": "${google_compute_instance_template.nomad_client_template_a100.self_link_unique}"}]
    assert group["lifecycle"] == {"prevent_destroy": True, "ignore_changes": ["target_size"]}, "the Nomad Autoscaler owns the size"
    assert group["update_policy"]["type"] == "OPPORTUNISTIC"
    assert group["target_size"] == 1, "created at the pool's minimum"
    assert "google_compute_region_autoscaler" not in nomad, "CPU-only ONLY_SCALE_OUT never scaled in and never left zero"


def test_three_servers_in_three_zones_with_raft_on_stateful_disks(nomad):
    t = nomad["google_compute_instance_template"]["nomad_server_template"]
    assert "guest_accelerator" not in t and t["machine_type"] == "e2-standard-4"
    assert t["scheduling"]["on_host_maintenance"] == "MIGRATE"
    assert t["service_account"]["email"] == "${google_service_account.nomad_server_sa.email}", "servers do not share the clients' identity"
    server = hcl.loads(embedded_config(t))["server"]
    assert server["bootstrap_expect"] == 3
    assert server["server_join"]["retry_join"] == ["provider=gce project_name=ml-finetune-prod tag_value=prod-nomad-nomad-server"]
    (data,) = [d for d in t["disk"] if not d.get("boot")]
    assert (data["device_name"], data["auto_delete"]) == ("nomad-data", False)
    assert "mount -o discard,defaults /dev/disk/by-id/google-nomad-data /opt/nomad/data" in t["metadata_startup_script"]
    assert "printf '[Service]\\nUser=nomad\\nGroup=nomad\\n'" in t["metadata_startup_script"], "servers do not run as root"
    groups = nomad["google_compute_instance_group_manager"]
    assert sorted((g["zone"], g["target_size"]) for g in groups.values()) == [
        ("europe-west4-a", 1), ("europe-west4-b", 1), ("europe-west4-c", 1)], "losing any zone leaves 2 of 3"
    for group in groups.values():
        assert group["stateful_disk"] == [{"device_name": "nomad-data", "delete_rule": "NEVER"}]
        assert group["update_policy"] == {"type": "OPPORTUNISTIC", "minimal_action": "REPLACE", "replacement_method": "RECREATE",
                                          "max_surge_fixed": 0, "max_unavailable_fixed": 1}
        assert "auto_healing_policies" not in group and group["lifecycle"] == {"prevent_destroy": True}
    assert "nomad_servers" not in nomad.get("google_compute_region_instance_group_manager", {})
    rule = nomad["google_compute_forwarding_rule"]["nomad_api"]
    assert (rule["load_balancing_scheme"], rule["ports"], rule["allow_global_access"]) == ("INTERNAL", ["4646"], True)
    backend = nomad["google_compute_region_backend_service"]["nomad_api_backend"]
    assert sorted(b["group"] for b in backend["backend"]) == [
        f"${{google_compute_instance_group_manager.nomad_servers_{z}.instance_group}}" for z in "abc"]
    assert nomad["google_compute_region_health_check"]["nomad_api_health"]["tcp_health_check"] == {"port": 4646}
    assert nomad["google_project_iam_member"]["nomad_autojoin_compute_viewer"]["role"] == "roles/compute.viewer"


def test_secrets_exist_empty_and_only_the_right_role_reads_each(nomad, stack_json):
    secrets = nomad["google_secret_manager_secret"]
    assert sorted(s["secret_id"] for s in secrets.values()) == [f"prod-nomad-nomad-{n}" for n in (
        "autoscaler-cert", "autoscaler-key", "autoscaler-token", "ca-cert", "client-cert", "client-key", "gossip-key", "gpu-health-token",
        "prometheus-ca", "server-cert", "server-key")]
    assert "google_secret_manager_secret_version" not in nomad, "values are added by the bootstrap, never through state"
    assert all(s["lifecycle"] == {"prevent_destroy": True} for s in secrets.values()), "prod: losing a secret loses the cluster identity"
    readers = {(g["secret_id"].split(".")[1], g["member"]) for g in nomad["google_secret_manager_secret_iam_member"].values()}
    server, client = "serviceAccount:${google_service_account.nomad_server_sa.email}", "serviceAccount:${google_service_account.node_sa.email}"
    assert {s for s, m in readers if m == client} == {"nomad_secret_ca_cert", "nomad_secret_client_cert", "nomad_secret_client_key",
                                                     "nomad_secret_gpu_health_token"}
    assert {s for s, m in readers if m == server} == {"nomad_secret_ca_cert", "nomad_secret_server_cert", "nomad_secret_server_key",
                                                     "nomad_secret_gossip_key", "nomad_secret_autoscaler_token", "nomad_secret_autoscaler_cert",
                                                     "nomad_secret_autoscaler_key", "nomad_secret_prometheus_ca"}, "the clients never read the autoscaler's key"
    assert all(g["role"] == "roles/secretmanager.secretAccessor" for g in nomad["google_secret_manager_secret_iam_member"].values())


def test_api_is_open_to_the_declared_ranges_and_health_checks_to_its_port_only(nomad):
    api = nomad["google_compute_firewall"]["fw_allow_nomad_api"]
    assert api["source_ranges"] == ["198.51.100.0/24", "203.0.113.16/28"]
    assert api["allow"] == [{"protocol": "tcp", "ports": ["4646"]}] and api["target_tags"] == ["prod-nomad-nomad-server"]
    health = nomad["google_compute_firewall"]["fw_allow_health_checks"]
    assert health["allow"] == [{"protocol": "tcp", "ports": ["4646"]}] and health["target_tags"] == ["prod-nomad-nomad-server"]


def test_nomad_ports_are_open_from_the_node_subnet_only(nomad):
    fw = nomad["google_compute_firewall"]["fw_allow_nomad"]
    assert fw["source_ranges"] == ["10.50.0.0/20"]
    assert fw["allow"] == [{"protocol": "tcp", "ports": ["4646-4648"]}, {"protocol": "udp", "ports": ["4648"]}]
    assert fw["target_tags"] == ["prod-nomad-nomad-client", "prod-nomad-nomad-server"]
    assert fw["direction"] == "INGRESS"


def test_gke_clusters_get_no_nomad_resources(stack_json):
    resources = stack_json("prod-gke")["resource"]
    assert "google_compute_instance_template" not in resources
    assert "fw_allow_nomad" not in resources["google_compute_firewall"]


def test_a3_and_a4_templates_get_the_gvnic_they_require(nomad):
    from constructs_lib.nomad_instance_template import _nic

    assert _nic("a3-highgpu-8g") == _nic("a4-highgpu-8g") == {"nic_type": "GVNIC"}
    assert _nic("a2-highgpu-2g") == {}
    assert "nic_type" not in nomad["google_compute_instance_template"]["nomad_client_template_a100"]["network_interface"][0]
