"""clusters.derive.pools: pure functions of the cluster file, called without cdktf."""

from __future__ import annotations

import pytest

import clusters
from clusters.derive.pools import GPU_TAINT, derive_gpu_pools, machine_accelerator, total_gpus
from clusters.machines import MACHINE_GPUS
from tests.conftest import load_fleet


@pytest.fixture(scope="module")
def by_name():
    return {c.name: c for c in load_fleet()}


@pytest.mark.parametrize(("machine", "accelerator", "gpus"), [
    ("a3-highgpu-8g", "nvidia-h100-80gb", 8),
    ("a3-megagpu-8g", "nvidia-h100-mega-80gb", 8),
    ("a2-megagpu-16g", "nvidia-tesla-a100", 16),
    ("a2-ultragpu-4g", "nvidia-a100-80gb", 4),
    ("g2-standard-24", "nvidia-l4", 2),
    ("g2-standard-32", "nvidia-l4", 1),
    ("g2-standard-96", "nvidia-l4", 8),
    ("a3-ultragpu-8g", "nvidia-h200-141gb", 8),
    ("a4-highgpu-8g", "nvidia-b200", 8),
])
def test_accelerator_and_count_come_from_the_machine_table(machine, accelerator, gpus):
    assert machine_accelerator(machine, None, None) == (accelerator, gpus)


def test_n1_takes_the_users_t4_count():
    assert machine_accelerator("n1-standard-16", None, 4) == ("nvidia-tesla-t4", 4)


def test_unknown_machine_derives_nothing():
    assert machine_accelerator("e2-standard-8", None, None) is None
    assert "e2-standard-8" not in MACHINE_GPUS


def test_gpu_pools_carry_the_gpu_taint_first_and_cluster_labels(by_name):
    (h100, l4) = derive_gpu_pools(by_name["prod-gke"])
    assert (h100.taints[0].key, h100.taints[0].value, h100.taints[0].effect) == (GPU_TAINT[0], GPU_TAINT[1], "NO_SCHEDULE")
    assert dict(h100.labels) == {"gpufleet.dev/cluster": "prod-gke", "gpufleet.dev/gpu-pool": "h100", "workload": "pretrain"}
    assert (h100.gpus_per_node, h100.capacity_gpus, h100.zones) == (8, 32, ("us-central1-a",))
    assert l4.zones == ("us-central1-a", "us-central1-b")


def test_pools_are_protected_by_default_outside_dev_only(by_name):
    assert all(s.protected for s in derive_gpu_pools(by_name["prod-gke"]))
    assert not any(s.protected for s in derive_gpu_pools(by_name["dev-gke"]))


def test_explicit_protected_false_wins_outside_dev(by_name):
    config = by_name["prod-gke"]
    pools = (config.gpu_pools[1].model_copy(update={"protected": False}),)
    assert not derive_gpu_pools(config.model_copy(update={"gpu_pools": pools}))[0].protected


def _static(config, node_count=3, pool_name=None):
    """The named pool (default: the file's last) as a static pool of ``node_count`` nodes, alone in the cluster."""
    base = next(p for p in config.gpu_pools if p.name == pool_name) if pool_name else config.gpu_pools[-1]
    pool = base.model_copy(update={"node_count": node_count, "min_nodes": None, "max_nodes": None})
    return derive_gpu_pools(config.model_copy(update={"gpu_pools": (pool,)}))[0]


def test_static_pools_use_node_count_for_capacity(by_name):
    spec = _static(by_name["dev-gke"], pool_name="t4")  # one zone, one GPU per node
    assert (spec.autoscaling, spec.min_nodes, spec.max_nodes, spec.capacity_gpus) == (False, 3, 3, 3)


def test_static_gke_pool_counts_node_count_in_every_zone(by_name):
    spec = _static(by_name["prod-gke"])
    assert spec.zones == ("us-central1-a", "us-central1-b") and spec.gpus_per_node == 2
    assert (spec.min_total_nodes, spec.max_total_nodes, spec.capacity_gpus) == (6, 6, 12)
    assert total_gpus((spec,)) == (12, 12)


def test_static_nomad_pool_target_size_is_the_whole_group(by_name):
    spec = _static(by_name["prod-nomad"])
    assert spec.zones == ("europe-west4-a", "europe-west4-b") and spec.gpus_per_node == 1
    assert (spec.node_count, spec.max_total_nodes, spec.capacity_gpus) == (3, 3, 3)


def test_autoscaling_gke_pool_limits_are_totals_and_initial_nodes_are_spread(by_name):
    config = by_name["prod-gke"]
    pool = config.gpu_pools[1].model_copy(update={"min_nodes": 3})
    (spec,) = derive_gpu_pools(config.model_copy(update={"gpu_pools": (pool,)}))
    assert (spec.max_total_nodes, spec.capacity_gpus) == (8, 16)
    assert spec.initial_nodes_per_zone == 2, "ceil(3 / 2 zones): never more than min_nodes + one per zone"


def test_total_gpus_sums_min_and_capacity(by_name):
    assert total_gpus(derive_gpu_pools(by_name["prod-nomad"])) == (2, 22)
