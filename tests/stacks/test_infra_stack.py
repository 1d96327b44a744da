"""What the infrastructure stack of each example cluster declares, property by property."""

from __future__ import annotations

import json

import pytest


def res(stack: dict, rtype: str, name: str) -> dict:
    return stack["resource"][rtype][name]


def test_gke_cluster_has_the_secure_defaults(stack_json):
    gke = res(stack_json("prod-gke"), "google_container_cluster", "gke")
    assert gke["private_cluster_config"]["enable_private_nodes"] is True
    assert gke["private_cluster_config"]["master_ipv4_cidr_block"] == "172.16.0.0/28"
    assert gke["enable_shielded_nodes"] is True
    assert gke["workload_identity_config"] == {"workload_pool": "ml-train-prod.svc.id.goog"}
    assert gke["release_channel"] == {"channel": "REGULAR"}
    assert gke["remove_default_node_pool"] is True
    assert gke["deletion_protection"] is True
    assert gke["datapath_provider"] == "ADVANCED_DATAPATH"
    assert gke["master_authorized_networks_config"]["cidr_blocks"] == [{"cidr_block": "198.51.100.0/24", "display_name": "corp-vpn"}]
    assert gke["lifecycle"]["prevent_destroy"] is True
    assert gke["node_config"]["workload_metadata_config"] == {"mode": "GKE_METADATA"}


def test_gke_clusters_turn_on_google_groups_for_rbac_from_the_file(stack_json, example_configs):
    """Without it the tenant RoleBindings to Group subjects match nobody."""
    for config in example_configs:
        if config.gke is None:
            continue
        gke = res(stack_json(config.name), "google_container_cluster", "gke")
        assert gke["authenticator_groups_config"] == {"security_group": config.gke.rbac_security_group}
        assert config.gke.rbac_security_group == "gke-security-groups@example.com"
    dev = res(stack_json("dev-gke"), "google_container_cluster", "gke")
    assert dev["master_authorized_networks_config"]["cidr_blocks"] == [{"cidr_block": "198.51.100.0/24", "display_name": "corp-vpn"}]


def test_reserved_h100_pool_is_protected_and_tainted_without_its_own_compact_policy(stack_json):
    pool = res(stack_json("prod-gke"), "google_container_node_pool", "pool_h100")
    node = pool["node_config"]
    assert node["machine_type"] == "a3-highgpu-8g"
    assert node["guest_accelerator"] == [{"type": "nvidia-h100-80gb", "count": 8,
                                          "gpu_driver_installation_config": {"gpu_driver_version": "DEFAULT"}}]
    assert node["reservation_affinity"] == {"consume_reservation_type": "SPECIFIC_RESERVATION",
                                            "key": "compute.googleapis.com/reservation-name", "values": ["projects/ml-train-prod/reservations/h100-reservation-2026"]}
    assert node["taint"][0] == {"key": "nvidia.com/gpu", "value": "present", "effect": "NO_SCHEDULE"}
    assert node["shielded_instance_config"] == {"enable_secure_boot": True, "enable_integrity_monitoring": True}
    assert node["workload_metadata_config"] == {"mode": "GKE_METADATA"}
    assert node["spot"] is False
    assert "placement_policy" not in pool, "review B10: the reservation brings its own placement"
    assert pool["node_locations"] == ["us-central1-a"]
    assert pool["autoscaling"]["total_max_node_count"] == 4
    assert pool["management"] == {"auto_repair": True, "auto_upgrade": True}
    assert pool["lifecycle"]["prevent_destroy"] is True
    assert pool["cluster"] == "${google_container_cluster.gke.id}"
    assert node["resource_labels"] == {"gpufleet-cluster": "prod-gke", "environment": "prod", "gpufleet-pool": "h100"}


def test_spot_pool_uses_no_reservation_and_any_location(stack_json):
    pool = res(stack_json("prod-gke"), "google_container_node_pool", "pool_l4_spot")
    assert pool["node_config"]["spot"] is True
    assert pool["node_config"]["reservation_affinity"] == {"consume_reservation_type": "NO_RESERVATION"}
    assert pool["autoscaling"]["location_policy"] == "ANY"
    assert pool["node_config"]["guest_accelerator"][0]["count"] == 2


def test_dev_pools_and_cluster_are_not_protected(stack_json):
    dev = stack_json("dev-gke")
    assert res(dev, "google_container_node_pool", "pool_t4")["lifecycle"]["prevent_destroy"] is False
    assert res(dev, "google_container_cluster", "gke")["deletion_protection"] is False


def test_network_has_private_access_flow_logs_nat_and_a_deny_by_default_firewall(stack_json):
    stack = stack_json("prod-gke")
    subnet = res(stack, "google_compute_subnetwork", "subnet")
    assert subnet["private_ip_google_access"] is True
    assert "log_config" in subnet
    assert [r["range_name"] for r in subnet["secondary_ip_range"]] == ["pods", "services"]
    assert res(stack, "google_compute_network", "vpc")["auto_create_subnetworks"] is False
    assert res(stack, "google_compute_router_nat", "nat")["router"] == "${google_compute_router.router.name}"
    deny = res(stack, "google_compute_firewall", "fw_deny_all_ingress")
    assert (deny["deny"], deny["source_ranges"], deny["priority"]) == ([{"protocol": "all"}], ["0.0.0.0/0"], 65534)
    assert res(stack, "google_compute_firewall", "fw_allow_iap_ssh")["source_ranges"] == ["35.235.240.0/20"]


def test_nodes_run_as_a_dedicated_least_privilege_service_account(stack_json):
    stack = stack_json("prod-gke")
    roles = {m["role"] for m in stack["resource"]["google_project_iam_member"].values()
             if m["member"] == "serviceAccount:${google_service_account.node_sa.email}"}
    assert roles == {"roles/artifactregistry.reader", "roles/logging.logWriter", "roles/monitoring.metricWriter",
                     "roles/monitoring.viewer", "roles/stackdriver.resourceMetadata.writer", "roles/storage.objectViewer"}
    pool = res(stack, "google_container_node_pool", "pool_h100")
    assert pool["node_config"]["service_account"] == "${google_service_account.node_sa.email}"


def test_reviewed_grants_become_project_iam_members(stack_json):
    grant = res(stack_json("prod-gke"), "google_project_iam_member", "grant_container_developer_group_ml_platform_example_com")
    assert (grant["role"], grant["member"]) == ("roles/container.developer", "group:ml-platform@example.com")


def test_grants_of_one_local_part_in_two_domains_synthesize_as_two_resources(example_configs):
    from cdktf import Testing

    from stacks.infra import ClusterStack

    prod = {c.name: c for c in example_configs}["prod-gke"]
    grant = prod.iam.grants[0].model_copy(update={"members": ("group:ml@a.example.com", "group:ml@b.example.com")})
    config = prod.model_copy(update={"iam": prod.iam.model_copy(update={"grants": (grant,)})})
    stack = json.loads(Testing.synth(ClusterStack(Testing.app(), config)))
    grants = {n: m["member"] for n, m in stack["resource"]["google_project_iam_member"].items() if n.startswith("grant_")}
    assert grants == {"grant_container_developer_group_ml_a_example_com": "group:ml@a.example.com",
                      "grant_container_developer_group_ml_b_example_com": "group:ml@b.example.com"}


def test_static_gke_pool_sets_node_count_per_zone(example_configs):
    from cdktf import Testing

    from stacks.infra import ClusterStack

    prod = {c.name: c for c in example_configs}["prod-gke"]
    pool = prod.gpu_pools[1].model_copy(update={"node_count": 3, "min_nodes": None, "max_nodes": None})
    stack = json.loads(Testing.synth(ClusterStack(Testing.app(), prod.model_copy(update={"gpu_pools": (pool,)}))))
    l4 = res(stack, "google_container_node_pool", "pool_l4_spot")
    assert (l4["node_count"], l4["node_locations"]) == (3, ["us-central1-a", "us-central1-b"])
    assert "autoscaling" not in l4


def test_static_ips_are_protected_outside_dev(stack_json):
    ip = res(stack_json("prod-gke"), "google_compute_global_address", "ip_ingress")
    assert (ip["name"], ip["lifecycle"]["prevent_destroy"]) == ("prod-gke-ingress", True)


def test_an_ingress_address_is_global_and_a_load_balancer_address_regional(stack_json, example_configs):
    """Review C11: GKE Ingress (global external Application LB) cannot take a regional address."""
    from cdktf import Testing

    from clusters.schema import StaticIpUse
    from stacks.infra import ClusterStack

    assert "google_compute_address" not in stack_json("prod-gke")["resource"]
    ip = res(stack_json("prod-gke"), "google_compute_global_address", "ip_ingress")
    assert (ip["address_type"], ip["ip_version"]) == ("EXTERNAL", "IPV4") and "region" not in ip
    prod = {c.name: c for c in example_configs}["prod-gke"]
    l4 = prod.gcp.static_ips[0].model_copy(update={"use": StaticIpUse.LOAD_BALANCER})
    stack = json.loads(Testing.synth(ClusterStack(Testing.app(), prod.model_copy(update={"gcp": prod.gcp.model_copy(update={"static_ips": (l4,)})}))))
    regional = res(stack, "google_compute_address", "ip_ingress")
    assert (regional["region"], regional["address_type"], regional["network_tier"]) == ("us-central1", "EXTERNAL", "PREMIUM")
    assert "google_compute_global_address" not in stack["resource"]
    assert stack["resource"]["cloudflare_dns_record"]["dns_tensorboard_prod"]["content"] == "${google_compute_address.ip_ingress.address}"


def test_backends_follow_the_state_section(stack_json):
    assert stack_json("prod-gke")["terraform"]["backend"] == {"gcs": {"bucket": "gpufleet-tfstate-prod", "prefix": "gpufleet/prod-gke"}}
    assert stack_json("dev-gke")["terraform"]["backend"] == {"local": {"path": "../../../.gpufleet/state/terraform.dev-gke.tfstate"}}
    cloud = stack_json("prod-nomad")["terraform"]["cloud"]
    assert cloud == {"organization": "gpufleet", "workspaces": {"name": "gpufleet-prod-nomad"}}


def test_outputs_give_the_scheduler_layer_what_it_needs(stack_json):
    outputs = stack_json("prod-gke")["output"]
    assert outputs["cluster_endpoint"]["value"] == "${google_container_cluster.gke.endpoint}"
    assert "master_auth[0].cluster_ca_certificate" in outputs["cluster_ca_certificate"]["value"]
    assert outputs["gpu_pools"]["value"] == ["h100", "l4-spot"]


def test_provider_credentials_are_not_in_the_json(stack_json):
    provider = stack_json("prod-gke")["provider"]["google"][0]
    assert set(provider) == {"project", "region", "default_labels"}


@pytest.mark.parametrize("stack", ["prod-gke", "dev-gke", "train-a3mega"])
def test_gke_clusters_open_nothing_to_the_health_checkers(stack_json, stack):
    """Review C10: GKE's Ingress and service controllers create the per-load-balancer rules they need;
    an extra rule from the checkers' ranges opened every TCP port of every node."""
    from constructs_lib.network import HEALTH_CHECK_RANGES

    firewalls = stack_json(stack)["resource"]["google_compute_firewall"]
    assert not [name for name, fw in firewalls.items() if set(fw.get("source_ranges", ())) & set(HEALTH_CHECK_RANGES)]
    nomad = stack_json("prod-nomad")["resource"]["google_compute_firewall"]["fw_allow_health_checks"]
    assert (nomad["allow"], nomad["target_tags"]) == ([{"protocol": "tcp", "ports": ["4646"]}], ["prod-nomad-nomad-server"])
