"""Nomad's placement metrics (``FailedTGAllocs``) in the words of the job file.

Nomad reports why a task group did not fit as counters keyed by scheduler-internal strings
("devices: no devices match request", "${node.class} = a100", "missing devices"). An ML
engineer asked for "1 A100 with 40 GiB"; the answer should be phrased the same way:
"no client in pool a100 has 2 free GPUs with >= 40 GiB".
"""

from __future__ import annotations

from typing import Any

from jobs.spec import GpuRequest

DEVICES_EXHAUSTED = "devices: no devices match request"
MISSING_DEVICES = "missing devices"


def _clients(n: int) -> str:
    return f"{n} client{'s' if n != 1 else ''}"


def explain_group(metric: dict[str, Any], *, pool: str, gpu: GpuRequest) -> str:
    """One line for one task group's AllocationMetric."""
    wanted = gpu.describe()
    in_pool = metric.get("NodesInPool")
    evaluated = metric.get("NodesEvaluated") or 0
    if (in_pool if in_pool is not None else evaluated) == 0:
        return f"no client in pool {pool} is ready (0 nodes in node pool {pool}); start or scale up the pool's clients"
    reasons: list[str] = []
    dims = metric.get("DimensionExhausted") or {}
    filtered = metric.get("ConstraintFiltered") or {}
    node_class = sum(n for key, n in filtered.items() if key.startswith("${node.class}"))
    if node_class:
        reasons.append(f"{_clients(node_class)} in pool {pool} {'has' if node_class == 1 else 'have'} another node_class (expected {pool}); fix the clients' node_class")
    if filtered.get(MISSING_DEVICES):
        reasons.append(f"{_clients(filtered[MISSING_DEVICES])} in pool {pool} cannot offer {gpu.describe(free=False)} at all (missing, unhealthy or not matching); check the clients' GPUs or the job's gpu section")
    other = sorted(key for key in filtered if key != MISSING_DEVICES and not key.startswith("${node.class}"))
    for key in other:
        reasons.append(f"constraint {key!r} filtered {_clients(filtered[key])}")
    if DEVICES_EXHAUSTED in dims:
        busy = dims[DEVICES_EXHAUSTED]
        reasons.insert(0, f"no client in pool {pool} has {wanted} ({_clients(busy)} busy); wait for running jobs to finish or ask for fewer GPUs")
    for dim in sorted(k for k in dims if k != DEVICES_EXHAUSTED):
        reasons.append(f"{dim} exhausted on {_clients(dims[dim])}; lower cpu_mhz/memory_mb/disk_mb or wait")
    if not reasons:
        reasons.append(f"no client in pool {pool} can take {wanted} ({_clients(evaluated)} evaluated)")
    return "; ".join(reasons)


def explain(failed_tg_allocs: dict[str, Any] | None, *, pool: str, gpu: GpuRequest) -> str | None:
    """None when everything fits; else one line naming each task group that does not."""
    if not failed_tg_allocs:
        return None
    parts = [explain_group(metric, pool=pool, gpu=gpu) for _, metric in sorted(failed_tg_allocs.items())]
    return " | ".join(parts)
