"""How hard a run's GPUs work, the same way for every scheduler.

Each runner that can say has ``usage(run_ids, refs) -> {run_id: Usage}`` (Nomad: the allocation's
resource usage, which carries the NVIDIA device plugin's per-GPU stats; GKE: DCGM metrics through
the Prometheus HTTP API). A run missing from the answer is *unknown* (no device stats yet, the
metrics source is down, nothing scraped): the caller stores nothing for it, so unknown is never
shown as 0 % busy.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


class UsageUnavailable(Exception):
    """The metrics source could not be asked now (down, refused, not configured)."""


@dataclass(frozen=True)
class Usage:
    """One sample of a run: utilization averaged over all its GPUs (percent of time a kernel ran,
    NVML's definition on both sides) and the most memory any one of its GPUs held (MiB). Either may
    be None when the source reported the GPU but not that value ("N/A")."""

    util_pct: float | None
    memory_mib: float | None
    gpus: int
    # The busiest single GPU (percent): what the idle policy needs to say "every GPU was below".
    util_max_pct: float | None = None


def combine(per_gpu: Iterable[tuple[float | None, float | None]]) -> Usage | None:
    """One run's GPUs (util %, used MiB) -> its sample; None when no GPU reported anything."""
    rows = list(per_gpu)
    utils = [u for u, _ in rows if u is not None]
    memory = [m for _, m in rows if m is not None]
    if not utils and not memory:
        return None
    # The busiest GPU only when every reported GPU has a utilization: one "N/A" could be the busy one.
    busiest = max(utils) if utils and len(utils) == len(rows) else None
    return Usage(sum(utils) / len(utils) if utils else None, max(memory) if memory else None, len(rows), busiest)
