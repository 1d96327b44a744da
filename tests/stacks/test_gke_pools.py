"""GKE clusters an expert would apply: a system pool, safe upgrades, DWS wiring, disks and telemetry (review A1-A4, B5, B7, B8)."""

from __future__ import annotations

import json
from dataclasses import astuple
from pathlib import Path

import pytest

from clusters import clock
from clusters.derive.gke import derive_exclusion
from clusters.derive.pools import derive_gpu_pools
from clusters.derive.upgrades import derive_upgrade


def res(stack: dict, rtype: str, name: str) -> dict:
    return stack["resource"][rtype][name]


@pytest.mark.parametrize("stack", ["prod-gke", "dev-gke"])
def test_every_gke_cluster_has_an_untainted_hardened_system_pool(stack_json, stack):
    """Review A1: without an untainted node Kueue's controller never runs and its Fail-closed webhooks block every apply."""
    pools = stack_json(stack)["resource"]["google_container_node_pool"]
    system = pools["system_pool"]
    node = system["node_config"]
    assert "taint" not in node and "guest_accelerator" not in node
    assert node["workload_metadata_config"] == {"mode": "GKE_METADATA"}
    assert node["shielded_instance_config"] == {"enable_secure_boot": True, "enable_integrity_monitoring": True}
    assert node["metadata"] == {"disable-legacy-endpoints": "true"}
    assert system["autoscaling"]["total_min_node_count"] >= 1
    assert system["cluster"] == "${google_container_cluster.gke.id}"
    gpu_pools = [p for name, p in pools.items() if name != "system_pool"]
    assert gpu_pools and all(p["node_config"]["taint"] for p in gpu_pools), "every other pool is a tainted GPU pool"


def test_system_pool_is_sized_from_the_file_with_a_default(stack_json, example_configs):
    prod = res(stack_json("prod-gke"), "google_container_node_pool", "system_pool")
    assert (prod["node_config"]["machine_type"], prod["autoscaling"]["total_min_node_count"]) == ("e2-standard-4", 2)
    dev_config = {c.name: c for c in example_configs}["dev-gke"]
    dev = res(stack_json("dev-gke"), "google_container_node_pool", "system_pool")
    assert dev["autoscaling"]["total_min_node_count"] == dev_config.gke.system_pool.min_nodes == 1
    assert dev["lifecycle"]["prevent_destroy"] is False and prod["lifecycle"]["prevent_destroy"] is True


def test_reserved_pool_upgrades_without_a_surge_node_and_spot_pools_surge(stack_json):
    """Review B5: a surge node needs a VM beyond a full reservation, so the upgrade stalls and retries."""
    prod = stack_json("prod-gke")["resource"]["google_container_node_pool"]
    assert prod["pool_h100"]["upgrade_settings"] == {"max_surge": 0, "max_unavailable": 1}
    assert prod["pool_l4_spot"]["upgrade_settings"] == {"max_surge": 1, "max_unavailable": 0}


def test_upgrade_settings_per_kind_of_pool():
    assert astuple(derive_upgrade(reserved=True, queued_provisioning=False)) == (0, 1, True, True)
    assert astuple(derive_upgrade(reserved=False, queued_provisioning=False)) == (1, 0, True, True)
    dws = derive_upgrade(reserved=False, queued_provisioning=True)
    assert (dws.auto_upgrade, dws.auto_repair) == (False, False), "toolkit DWS example: queued provisioning requirement"


def test_cluster_has_a_maintenance_window_and_the_files_upgrade_exclusion(stack_json, example_configs):
    prod = {c.name: c for c in example_configs}["prod-gke"]
    policy = res(stack_json("prod-gke"), "google_container_cluster", "gke")["maintenance_policy"]
    assert policy["daily_maintenance_window"] == {"start_time": prod.gke.maintenance_start_time}
    (exclusion,) = policy["maintenance_exclusion"]
    assert exclusion["exclusion_options"] == {"scope": "NO_MINOR_OR_NODE_UPGRADES"}
    assert (exclusion["exclusion_name"], exclusion["start_time"], exclusion["end_time"]) == derive_exclusion(prod.gke.upgrade_exclusion, clock.today())[:3]
    dev = res(stack_json("dev-gke"), "google_container_cluster", "gke")["maintenance_policy"]
    assert "maintenance_exclusion" not in dev and dev["daily_maintenance_window"]["start_time"] == "09:00"


def test_gpu_telemetry_and_cost_allocation_are_on(stack_json):
    """Review B8 and D3: DCGM through Managed Prometheus, GKE cost allocation, per-pool VM labels."""
    gke = res(stack_json("prod-gke"), "google_container_cluster", "gke")
    assert "DCGM" in gke["monitoring_config"]["enable_components"]
    assert gke["monitoring_config"]["managed_prometheus"] == {"enabled": True}
    assert gke["cost_management_config"] == {"enabled": True}
    assert gke["master_authorized_networks_config"]["gcp_public_cidrs_access_enabled"] is False
    assert gke["private_cluster_config"]["master_global_access_config"] == {"enabled": True}


def test_a3_pools_use_their_bundled_local_ssds_and_a_chosen_driver(stack_json):
    """Review B7 and D1: 16 local NVMe SSDs back ephemeral storage on a3-highgpu-8g; driver DEFAULT, not LATEST."""
    prod = stack_json("prod-gke")["resource"]["google_container_node_pool"]
    assert prod["pool_h100"]["node_config"]["ephemeral_storage_local_ssd_config"] == {"local_ssd_count": 16}
    assert "ephemeral_storage_local_ssd_config" not in prod["pool_l4_spot"]["node_config"]
    drivers = {n: p["node_config"]["guest_accelerator"][0]["gpu_driver_installation_config"]["gpu_driver_version"]
               for n, p in prod.items() if n != "system_pool"}
    assert set(drivers.values()) == {"DEFAULT"}


@pytest.fixture(scope="module")
def dws_fleet(example_configs):
    """prod-gke with its spot pool turned into a DWS (queued provisioning) pool, built in-process."""
    from cdktf import Testing

    from stacks.fleet import build_fleet

    prod = {c.name: c for c in example_configs}["prod-gke"]
    pools = (prod.gpu_pools[0], prod.gpu_pools[1].model_copy(update={"spot": False, "queued_provisioning": True}))
    config = prod.model_copy(update={"gpu_pools": pools})
    fleet = build_fleet(Testing.app(), (config,))
    return {name: json.loads(Testing.synth(stack)) for name, stack in fleet.stacks.items() if name.startswith("prod-gke")}


def test_dws_pool_never_auto_upgrades_or_repairs_and_is_labelled_queued(dws_fleet):
    """Review A4: DWS nodes come only through ProvisioningRequests; GKE taints them cloud.google.com/gke-queued."""
    pool = dws_fleet["prod-gke"]["resource"]["google_container_node_pool"]["pool_l4_spot"]
    assert pool["queued_provisioning"] == {"enabled": True}
    assert pool["management"] == {"auto_repair": False, "auto_upgrade": False}
    assert pool["node_config"]["labels"]["cloud.google.com/gke-queued"] == "true"


def test_dws_pool_is_flex_start_as_the_toolkits_queued_provisioning_example(dws_fleet, stack_json):
    """cluster-toolkit v1.95.0 examples/gke-consumption-options/dws-flex-start-queued-provisioning/gke-a3-ultragpu.yaml:163
    sets enable_flex_start with queued provisioning, which gke-node-pool/main.tf:165 passes as node_config.flex_start;
    main.tf:416-429 require no auto-repair, no static node count, NO_RESERVATION and no spot with it. The attribute is
    a bool in node_config at google 6.50.0 (tests/schemas/google-6.50.0.json; node_config.go:1020-1024, ForceNew)."""
    schema = json.loads((Path(__file__).resolve().parents[1] / "schemas" / "google-6.50.0.json").read_text())
    assert "flex_start" in schema["google_container_node_pool"]["node_config"]
    pools = dws_fleet["prod-gke"]["resource"]["google_container_node_pool"]
    dws = pools["pool_l4_spot"]
    assert dws["node_config"]["flex_start"] is True and dws["queued_provisioning"] == {"enabled": True}
    assert dws["management"]["auto_repair"] is False and "node_count" not in dws and dws["node_config"]["spot"] is False
    assert dws["node_config"]["reservation_affinity"] == {"consume_reservation_type": "NO_RESERVATION"}
    assert "flex_start" not in pools["pool_h100"]["node_config"]  # only queued pools


def test_flex_start_replaces_only_the_unprotected_dev_pool(stack_json):
    """flex_start is ForceNew (preview/forcenew/google.json): adding it replaces dev-gke's l4-flex pool, a dev pool
    without prevent_destroy; no protected pool is queued."""
    forcenew = json.loads((Path(__file__).resolve().parents[2] / "preview" / "forcenew" / "google.json").read_text())
    assert "node_config.flex_start" in forcenew["resources"]["google_container_node_pool"]
    flex = {name: pool for stack in ("dev-gke", "prod-gke", "train-a3mega")
            for name, pool in stack_json(stack)["resource"]["google_container_node_pool"].items() if pool["node_config"].get("flex_start")}
    assert sorted(flex) == ["pool_l4_flex"]
    assert all(pool["lifecycle"]["prevent_destroy"] is False for pool in flex.values())


def test_dws_queues_carry_the_provisioning_admission_check(dws_fleet):
    manifests = {k: v["manifest"] for k, v in dws_fleet["prod-gke-scheduler"]["resource"]["kubernetes_manifest"].items()}
    check = manifests["kueue_admission_check_dws"]
    config = manifests["kueue_provisioning_config_dws"]
    assert check["spec"]["parameters"]["name"] == config["metadata"]["name"]
    for tenant in ("research", "applied"):
        spec = manifests[f"kueue_cluster_queue_{tenant}__l4_spot"]["spec"]
        assert spec["admissionChecksStrategy"]["admissionChecks"] == [{"name": check["metadata"]["name"], "onFlavors": ["l4-spot"]}]
        assert "admissionChecksStrategy" not in manifests[f"kueue_cluster_queue_{tenant}__h100"]["spec"]
    raw = dws_fleet["prod-gke-scheduler"]["resource"]["kubernetes_manifest"]["kueue_cluster_queue_research__l4_spot"]
    assert "kubernetes_manifest.kueue_admission_check_dws" in raw["depends_on"]


def test_boot_disk_follows_the_machine_family(example_configs):
    prod = {c.name: c for c in example_configs}["prod-gke"]
    assert [p.boot_disk_type for p in derive_gpu_pools(prod)] == ["pd-ssd", "pd-ssd"]
    ultra = prod.model_copy(update={"gpu_pools": (prod.gpu_pools[0].model_copy(update={"machine_type": "a4-highgpu-8g", "reservation": None}),)})
    (spec,) = derive_gpu_pools(ultra)
    assert (spec.boot_disk_type, spec.local_ssd_count) == ("hyperdisk-balanced", 32)
