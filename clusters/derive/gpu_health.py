"""Which GKE GPU pools the GPU health checker watches (constructs_lib/gpu_health.py), fully derived.

Every GPU pool of a GKE cluster: a fault keeps a node out of the next run whatever the pool is for.
The checker compares the GPUs it sees with the machine's count (``gpus_per_node``, derived from the
machine type) and must run beside the pool's own taints, GKE's DWS taint included.
"""

from __future__ import annotations

from dataclasses import dataclass

from clusters.derive.pools import GpuPoolSpec, TaintSpec


@dataclass(frozen=True)
class GpuHealthSpec:
    # (pool name, GPUs its machine has), sorted by pool name.
    pools: tuple[tuple[str, int], ...]
    taints: tuple[TaintSpec, ...]
    queued_provisioning: bool


def derive_gpu_health(pools: tuple[GpuPoolSpec, ...]) -> GpuHealthSpec | None:
    """None for a cluster without GPU pools (nothing to watch)."""
    if not pools:
        return None
    taints = {t for p in pools for t in p.taints}
    return GpuHealthSpec(pools=tuple(sorted((p.name, p.gpus_per_node) for p in pools)),
                         taints=tuple(sorted(taints, key=lambda t: (t.key, t.value, t.effect))),
                         queued_provisioning=any(p.queued_provisioning for p in pools))
