"""GKE tuning derived from the cluster file (review C6, D3-D5, D7-D9), checked on the example fleet.

Attribute names and nesting are walked against provider 6.50.0 by tests/stacks/test_google_schema.py;
the enum values used here were read in its source (resource_container_cluster.go autoscaling_profile
BALANCED|OPTIMIZE_UTILIZATION, node_config.go host_maintenance_policy AS_NEEDED|PERIODIC).
"""

from __future__ import annotations

import json

import pytest

from clusters.derive.gke import NODE_POOL_TIMEOUTS, derive_control_plane


def res(stack: dict, rtype: str, name: str) -> dict:
    return stack["resource"][rtype][name]


def gpu_pools(stack: dict) -> dict:
    return {n: p for n, p in stack["resource"]["google_container_node_pool"].items() if n != "system_pool"}


@pytest.mark.parametrize("stack", ["prod-gke", "dev-gke", "train-a3mega"])
def test_gpu_pools_stream_images_tune_tcp_and_wait_45_minutes(stack_json, stack):
    """D4 gcfs_config, D5 the toolkit's sysctls, D9 TGKE's 45 min timeouts (provider default 30)."""
    pools = stack_json(stack)["resource"]["google_container_node_pool"]
    for name, pool in gpu_pools(stack_json(stack)).items():
        node = pool["node_config"]
        assert node["gcfs_config"] == {"enabled": True}, name
        assert node["linux_node_config"] == {"sysctls": {"net.ipv4.tcp_rmem": "4096 87380 16777216",
                                                         "net.ipv4.tcp_wmem": "4096 16384 16777216"}}, name
        assert pool["timeouts"] == {"create": "45m", "update": "45m", "delete": "45m"}, name
        assert "host_maintenance_policy" not in node, "unset unless the file asks (toolkit default)"
    assert pools["system_pool"]["timeouts"] == NODE_POOL_TIMEOUTS


@pytest.mark.parametrize("stack", ["prod-gke", "dev-gke", "train-a3mega"])
def test_cluster_mounts_buckets_scales_down_idle_nodes_and_logs_no_intranode_flows(stack_json, stack):
    """D4 GCS FUSE CSI add-on; D3 OPTIMIZE_UTILIZATION without node auto-provisioning; D7 intranode visibility off."""
    gke = res(stack_json(stack), "google_container_cluster", "gke")
    assert gke["addons_config"] == {"gcs_fuse_csi_driver_config": {"enabled": True}}
    assert gke["cluster_autoscaling"] == {"enabled": False, "autoscaling_profile": "OPTIMIZE_UTILIZATION"}
    assert gke["enable_intranode_visibility"] is False


def test_flow_logs_sample_cheaply_by_default(stack_json, example_configs):
    """D7: 0.5 of every flow at 5 s was the old default; the file's sampling is used."""
    for config in example_configs:
        subnet = res(stack_json(config.name), "google_compute_subnetwork", "subnet")
        assert subnet["log_config"]["flow_sampling"] == config.gcp.flow_log_sampling == 0.1


def test_dev_cluster_is_zonal_and_production_regional(stack_json, example_configs):
    """D8: a dev cluster in one zone gets a zonal control plane (GKE free-tier credit); prod stays regional."""
    configs = {c.name: c for c in example_configs}
    dev = res(stack_json("dev-gke"), "google_container_cluster", "gke")
    assert dev["location"] == "us-central1-a" and "node_locations" not in dev
    assert {p["location"] for p in stack_json("dev-gke")["resource"]["google_container_node_pool"].values()} == {"us-central1-a"}
    prod = res(stack_json("prod-gke"), "google_container_cluster", "gke")
    assert (prod["location"], prod["node_locations"]) == ("us-central1", ["us-central1-a", "us-central1-b"])
    assert {p["location"] for p in stack_json("prod-gke")["resource"]["google_container_node_pool"].values()} == {"us-central1"}
    two_zones = configs["dev-gke"].model_copy(update={"gcp": configs["dev-gke"].gcp.model_copy(update={"zones": ("us-central1-a", "us-central1-b")})})
    assert derive_control_plane(two_zones).location == "us-central1"
    explicit = configs["dev-gke"].model_copy(update={"gke": configs["dev-gke"].gke.model_copy(update={"zonal": False})})
    assert derive_control_plane(explicit).location == "us-central1"
    zonal_prod = configs["prod-gke"].model_copy(update={"gke": configs["prod-gke"].gke.model_copy(update={"zonal": True})})
    plane = derive_control_plane(zonal_prod)
    assert (plane.location, plane.node_locations) == ("us-central1-a", ("us-central1-b",))


def test_gpudirect_clusters_raise_the_primary_vpc_mtu(stack_json):
    """D5: the toolkit's A3 blueprints set mtu 8244 on the primary VPC as on the GPUDirect VPCs."""
    assert res(stack_json("train-a3mega"), "google_compute_network", "vpc")["mtu"] == 8244
    assert res(stack_json("prod-gke"), "google_compute_network", "vpc")["mtu"] == 8244  # its a3-highgpu-8g pool uses TCPX
    assert "mtu" not in res(stack_json("dev-gke"), "google_compute_network", "vpc")
    assert "mtu" not in res(stack_json("prod-nomad"), "google_compute_network", "vpc")


def test_host_maintenance_interval_and_flow_sampling_come_from_the_file(example_configs):
    from cdktf import Testing

    from stacks.infra import ClusterStack

    prod = {c.name: c for c in example_configs}["prod-gke"]
    pool = prod.gpu_pools[0].model_copy(update={"host_maintenance_interval": "PERIODIC"})
    config = prod.model_copy(update={"gpu_pools": (pool, prod.gpu_pools[1]), "gcp": prod.gcp.model_copy(update={"flow_log_sampling": 0.5}),
                                     "gke": prod.gke.model_copy(update={"intranode_visibility": True})})
    stack = json.loads(Testing.synth(ClusterStack(Testing.app(), config)))
    assert res(stack, "google_container_node_pool", "pool_h100")["node_config"]["host_maintenance_policy"] == {"maintenance_interval": "PERIODIC"}
    assert "host_maintenance_policy" not in res(stack, "google_container_node_pool", "pool_l4_spot")["node_config"]
    assert res(stack, "google_compute_subnetwork", "subnet")["log_config"]["flow_sampling"] == 0.5
    assert res(stack, "google_container_cluster", "gke")["enable_intranode_visibility"] is True


def test_controller_account_mounts_no_token_by_default(stack_json):
    """C6: a pod naming gpufleet-controller gets no Job-writing token unless its spec opts in."""
    accounts = stack_json("prod-gke-scheduler")["resource"]["kubernetes_service_account_v1"]
    controllers = {n: a for n, a in accounts.items() if a["metadata"]["name"] == "gpufleet-controller"}
    assert controllers and all(a["automount_service_account_token"] is False for a in controllers.values())
