"""Reserved capacity stays warm (issue 25): a pool on a specific reservation keeps its reserved nodes
(``max_nodes``) by default, ``gpufleet check`` prices the nodes a file leaves cold, and moving an applied
pool's minimum up changes it in place (never a replacement of the protected pool)."""

from __future__ import annotations

import copy

import clusters
from clusters.derive.pools import cold_reservations, derive_gpu_pools
from experiments.services.cost import load_prices
from review.checks import cold_reservation_warnings, run_checks
from tests.conftest import load_fleet


def _pool(config, name):
    return next(p for p in derive_gpu_pools(config) if p.name == name)


def _load(path):
    (config,) = clusters.load_all(path.parent)
    return config


def test_a_reserved_pool_without_min_nodes_keeps_its_reserved_nodes_warm():
    prod = next(c for c in load_fleet() if c.name == "prod-gke")
    h100, spot = _pool(prod, "h100"), _pool(prod, "l4-spot")
    assert h100.reservation and (h100.min_nodes, h100.max_nodes) == (4, 4) and h100.autoscaling
    assert spot.min_nodes == 0  # not reserved: scale-to-zero stays the default
    assert cold_reservations(prod) == ()


def test_the_synthesized_reserved_pool_has_its_reserved_minimum(stack_json):
    pools = stack_json("prod-gke")["resource"]["google_container_node_pool"]
    (h100,) = [p for p in pools.values() if p["name"] == "h100"]
    assert h100["autoscaling"]["total_min_node_count"] == 4 and h100["autoscaling"]["total_max_node_count"] == 4


def test_check_warns_what_scale_to_zero_on_a_reserved_pool_costs(write_cluster):
    def cold(data):
        data["gpu_pools"][0]["min_nodes"] = 0

    path = write_cluster("prod-gke", cold)
    config = _load(path)
    assert _pool(config, "h100").min_nodes == 0  # the file's explicit choice is kept
    (line,) = cold_reservation_warnings((config,), load_prices().price, directory=path.parent)
    # a3-highgpu-8g: 8 H100 per node; 4 reserved nodes x 8 GPUs x the 1-year commitment price in us-central1.
    price = load_prices().price("nvidia-h100-80gb", "reservation", "us-central1")
    hourly = 4 * 8 * price
    assert line.startswith(f"warning: {path}:") and ": gpu_pools[0].min_nodes: scale-to-zero on reserved pool h100" in line
    assert f"4 cold node(s) x 8 GPUs cost ${hourly:,.2f}/h" in line and f"(${hourly * 730:,.0f}/month)" in line
    assert line.endswith("remove min_nodes (default: the 4 reserved nodes stay warm) or set min_nodes: 4")


def test_check_reports_reserved_pools_in_its_summary(write_cluster, tmp_path):
    def cold(data):
        data["gpu_pools"][0]["min_nodes"] = 1

    config = _load(write_cluster("prod-gke", cold))
    fleet = tuple(config if c.name == "prod-gke" else c for c in load_fleet())
    report = run_checks(fleet, out=tmp_path / "cdktf.out", checkov=False, price=load_prices().price)
    assert ("reservations", True, "1 warning(s)") in report.rows
    assert any("min_nodes 1 on reserved pool h100" in line and "3 cold node(s)" in line for line in report.details)


def test_raising_an_applied_pools_minimum_updates_it_in_place(stack_json):
    """total_min_node_count is not ForceNew (preview/forcenew/google.json) and initial_node_count, which is,
    is ignored after creation (constructs_lib/gpu_node_pool.py lifecycle): an applied reserved pool at
    min 0 moves to its reserved minimum without being replaced."""
    from preview.diff import ExitCode, preview
    from preview.forcenew import load_tables

    head = stack_json("prod-gke")
    base = copy.deepcopy(head)
    (address,) = [a for a, p in base["resource"]["google_container_node_pool"].items() if p["name"] == "h100"]
    pool = base["resource"]["google_container_node_pool"][address]
    pool["autoscaling"]["total_min_node_count"] = 0
    pool["initial_node_count"] = 0
    tables = load_tables()
    rules = tables.rules("google_container_node_pool")
    assert "initial_node_count" in rules and "autoscaling.total_min_node_count" not in rules  # the provider's ForceNew set
    result = preview({"prod-gke": base}, {"prod-gke": head}, tables)
    (stack,) = result.stacks
    assert (stack.updated_in_place, stack.replaced, stack.destroyed) == (1, 0, 0) and stack.no_table == ()
    assert result.findings == () and result.exit_code != ExitCode.BLOCKED
