"""Cluster-file rules for GKE pools and control planes that would otherwise fail at apply time."""

from __future__ import annotations

import pytest

import clusters
from clusters.derive.gke import derive_control_plane
from tests.clusters.conftest import assert_rejected


def pool(d: dict, i: int = 0) -> dict:
    return d["gpu_pools"][i]


def a3_ultra(d: dict) -> None:
    pool(d).update(machine_type="a3-ultragpu-8g", reservation=None, boot_disk_type="pd-ssd")
    pool(d).pop("reservation")


def colliding_queues(d: dict) -> None:
    """(research, l4--spot) and (research--l4, spot) both read as research__l4__spot."""
    pool(d, 1)["name"] = "l4--spot"
    for t in d["tenants"]:
        t["gpu_quota"]["l4--spot"] = t["gpu_quota"].pop("l4-spot")
    d["gpu_pools"].append({**pool(d, 1), "name": "spot"})
    d["tenants"].append({"name": "research--l4"})


CASES = [
    ("pd-boot-disk-on-a3-ultra", "prod-gke", a3_ultra, "gpu_pools[0].boot_disk_type",
     "pd-ssd is not offered on a3-ultragpu-8g; allowed: hyperdisk-balanced"),
    ("hyperdisk-on-n1", "dev-gke", lambda d: pool(d).update(boot_disk_type="hyperdisk-balanced"), "gpu_pools[0].boot_disk_type",
     "allowed: pd-ssd, pd-balanced"),
    ("dws-with-compact-placement", "prod-gke", lambda d: pool(d, 1).update(spot=False, queued_provisioning=True, placement="COMPACT",
                                                                          zones=["us-central1-a"]),
     "gpu_pools[1].placement", "queued provisioning (DWS) cannot use COMPACT placement"),
    ("reserved-pool-with-a-new-compact-policy", "prod-gke", lambda d: pool(d).update(placement="COMPACT"), "gpu_pools[0].placement",
     "remove placement, or set placement_policy_name to the compact policy the reservation was created with"),
    ("policy-name-without-compact", "prod-gke", lambda d: pool(d).update(placement_policy_name="h100-compact"), "gpu_pools[0].placement_policy_name",
     "set placement: COMPACT or remove placement_policy_name"),
    ("reservation-block-without-a-name", "prod-gke", lambda d: pool(d).update(reservation="h100-res/reservationBlocks/"), "gpu_pools[0].reservation",
     "optionally ending /reservationBlocks/<block>"),
    ("reservation-not-a-name", "prod-gke", lambda d: pool(d).update(reservation="zones/us-central1-a/h100"), "gpu_pools[0].reservation",
     "is not a GCE reservation name (optionally projects/<project>/reservations/<name>"),
    ("gpu-pool-named-like-the-system-pool", "prod-gke", lambda d: pool(d, 1).update(name="gpufleet-system"), "gpu_pools[1].name",
     "name of the cluster's system pool"),
    ("system-pool-min-above-max", "prod-gke", lambda d: d["gke"].update(system_pool={"min_nodes": 5, "max_nodes": 3}),
     "gke.system_pool.min_nodes", "lower min_nodes or raise max_nodes"),
    ("system-pool-min-zero", "prod-gke", lambda d: d["gke"].update(system_pool={"min_nodes": 0}),
     "gke.system_pool.min_nodes", "too small; allowed: >= 1; raise the value"),
    ("exclusion-ends-before-it-starts", "prod-gke", lambda d: d["gke"].update(
        upgrade_exclusion={"start_time": "2026-06-01T00:00:00Z", "end_time": "2026-01-01T00:00:00Z"}),
     "gke.upgrade_exclusion.end_time", "set an end_time after the start"),
    ("exclusion-not-rfc3339", "prod-gke", lambda d: d["gke"].update(
        upgrade_exclusion={"start_time": "June 1st", "end_time": "2026-01-01T00:00:00Z"}),
     "gke.upgrade_exclusion.start_time", "is not an RFC 3339 time such as"),
    ("maintenance-window-not-hh-mm", "prod-gke", lambda d: d["gke"].update(maintenance_start_time="9am"),
     "gke.maintenance_start_time", "is not a UTC time of day as HH:MM"),
    ("gpudirect-range-overlaps-pods", "train-a3mega", lambda d: d["gcp"].update(gpudirect_cidr="10.128.0.0/16"), "gcp.gpudirect_cidr",
     "overlaps pods_cidr '10.128.0.0/14'"),
    ("gpudirect-range-too-small", "train-a3mega", lambda d: d["gcp"].update(gpudirect_cidr="192.168.0.0/18"), "gcp.gpudirect_cidr",
     "too small for 16 /20 GPUDirect subnets"),
    ("rdma-pool-across-zones", "prod-gke", lambda d: pool(d, 1).update(machine_type="a4-highgpu-8g", spot=False) or pool(d, 1).pop("spot"),
     "gpu_pools[1].zones", "RoCE network profile is zonal; set zones: [us-central1-a]"),
    ("tenant-queue-addresses-collide", "prod-gke", colliding_queues, "tenants[2].name", "would share one Kueue queue address"),
    ("tcpxo-below-its-minor-minimum", "train-a3mega", lambda d: d["gke"].update(min_master_version="1.32.11-gke.1173999"),
     "gke.min_master_version", "set min_master_version: 1.32.11-gke.1174000 or later"),
    ("tcpx-below-the-first-supported-minor", "prod-gke", lambda d: d["gke"].update(min_master_version="1.26.15-gke.1000000"),
     "gke.min_master_version", "set min_master_version: 1.27.16-gke.2874000 or later"),
    ("min-master-version-not-a-gke-version", "prod-gke", lambda d: d["gke"].update(min_master_version="1.33"),
     "gke.min_master_version", "'1.33' is not a GKE version (1.X.Y-gke.Z); write e.g. '1.33.5-gke.1080000'"),
]


@pytest.mark.parametrize(("base", "mutate", "field", "fix"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_fails_when_a_gke_pool_or_control_plane_would_fail_at_apply(write_cluster, base, mutate, field, fix):
    assert_rejected(write_cluster(base, mutate), field, fix)


def test_dns_endpoint_makes_authorized_networks_optional(write_cluster):
    """CI reaches the control plane over the IAM-authorized DNS endpoint: no IP allow-list is needed."""
    config = clusters.load(write_cluster("dev-gke", lambda d: d["gcp"].pop("master_authorized_networks")))
    spec = derive_control_plane(config)
    assert spec.dns_endpoint and spec.authorized_networks == () and spec.reachable_from_ci


def test_a3_ultra_without_a_disk_type_gets_hyperdisk(write_cluster):
    def ultra(d):
        a3_ultra(d)
        pool(d).pop("boot_disk_type")

    from clusters.derive.pools import derive_gpu_pools

    config = clusters.load(write_cluster("prod-gke", ultra))
    assert derive_gpu_pools(config)[0].boot_disk_type == "hyperdisk-balanced"


def test_a_supported_pinned_version_is_accepted_and_set_on_the_cluster(write_cluster):
    """Minors above the toolkit's table are accepted; the pin reaches google_container_cluster.min_master_version."""
    import json

    from cdktf import Testing

    from stacks.fleet import build_fleet

    config = clusters.load(write_cluster("train-a3mega", lambda d: d["gke"].update(min_master_version="1.33.5-gke.1080000")))
    infra = json.loads(Testing.synth(build_fleet(Testing.app(), (config,)).stacks["train-a3mega"]))["resource"]
    assert infra["google_container_cluster"]["gke"]["min_master_version"] == "1.33.5-gke.1080000"
