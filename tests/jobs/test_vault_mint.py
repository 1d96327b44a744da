"""The dispatcher's default queue wait, derived from the target pool, sizes the wrap TTL."""

from __future__ import annotations

import dataclasses

import pytest

from jobs.loader import find, load
from jobs.vault_mint import SCALE_FROM_ZERO_QUEUE_SECONDS, WARM_POOL_QUEUE_SECONDS, default_queue_seconds
from vault_policies.layout import MAX_WRAP_TTL_SECONDS
from vault_policies.orchestrator import wrap_ttl_for_queue


@pytest.mark.parametrize(("job", "min_nodes", "queue_seconds", "wrap_ttl"), [("eval-judge", 0, 1200, 1500), ("finetune-llama", 1, 300, 375)])
def test_default_queue_wait_follows_the_pools_min_nodes(job: str, min_nodes: int, queue_seconds: int, wrap_ttl: int) -> None:
    pool = load(find(job)).pool
    assert pool.min_nodes == min_nodes
    assert default_queue_seconds(pool) == queue_seconds
    assert wrap_ttl_for_queue(default_queue_seconds(pool)) == wrap_ttl


def test_a_warm_pool_scaled_to_zero_gets_the_long_default() -> None:
    pool = load(find("finetune-llama")).pool
    assert default_queue_seconds(dataclasses.replace(pool, min_nodes=0)) == SCALE_FROM_ZERO_QUEUE_SECONDS
    assert default_queue_seconds(dataclasses.replace(pool, min_nodes=3)) == WARM_POOL_QUEUE_SECONDS
    assert wrap_ttl_for_queue(SCALE_FROM_ZERO_QUEUE_SECONDS) <= MAX_WRAP_TTL_SECONDS


def test_a_warm_reserved_pool_keeps_the_long_default() -> None:
    """The reserved h100 pool now stays warm (min = its 4 reserved nodes, issue 25), but its runs queue in
    Kueue behind each other's GPUs: the wrap TTL keeps the bound it had, or a queued run dies at 375 s."""
    from clusters.derive.pools import derive_gpu_pools
    from tests.conftest import load_fleet

    prod = next(c for c in load_fleet() if c.name == "prod-gke")
    h100 = next(p for p in derive_gpu_pools(prod) if p.name == "h100")
    assert h100.reservation and h100.min_nodes == 4
    assert default_queue_seconds(h100) == SCALE_FROM_ZERO_QUEUE_SECONDS
