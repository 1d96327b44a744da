"""GPU utilization sampling, a step of the reconcile pass (never a poll of its own).

Each running run is sampled at most once per ``Timing.usage_seconds``. Nomad costs one GET per
allocation, so at most ``Timing.usage_nomad_per_pass`` are asked per pass, least recently sampled
first (a rotation: with 200 running runs and 25 a pass, each is sampled every 8 passes), and
only while they take less than ``Timing.usage_budget`` of the pass; GKE costs one Prometheus
query per pass for all its due runs. A run is marked sampled whether or not the
source answered, so a metrics source that is down is not asked harder; its runs get no row
(unknown), and ``gpufleet_usage_errors`` counts the failed passes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from experiments.background.context import Context, log
from experiments.services import usage as run_usage
from jobs.runner import GKE_PREFIX
from jobs.usage import UsageUnavailable

CHUNK = 5  # Nomad allocations asked between two looks at the time budget


@dataclass(frozen=True)
class Candidate:
    experiment_id: str
    run_id: str
    refs: Mapping[str, str]


class SampledAt:
    """Per run: when it was last asked about (in memory; after a restart every run is due once)."""

    def __init__(self) -> None:
        self._at: dict[str, datetime] = {}
        self._lock = threading.Lock()

    def due(self, candidates: Sequence[Candidate], *, now: datetime, every_seconds: float) -> list[Candidate]:
        """The candidates not asked about within ``every_seconds``, never-asked first, then oldest."""
        with self._lock:
            last = {c.run_id: self._at.get(c.run_id) for c in candidates}
        waiting = [c for c in candidates if (at := last[c.run_id]) is None or (now - at).total_seconds() >= every_seconds]
        return sorted(waiting, key=lambda c: (last[c.run_id] is not None, last[c.run_id] or now, c.run_id))

    def mark(self, run_ids: Sequence[str], now: datetime) -> None:
        with self._lock:
            self._at.update((r, now) for r in run_ids)

    def forget(self, run_ids: Sequence[str]) -> None:
        with self._lock:
            for run_id in run_ids:
                self._at.pop(run_id, None)


def sample_usage(ctx: Context, running: Sequence[Candidate], *, pass_seconds: float = 0.0) -> int:
    """Sample the due runs among ``running``; returns how many got a sample stored.

    Besides the count bound, Nomad's GETs stop once they have taken ``Timing.usage_budget`` of
    the pass so far (``pass_seconds``), in chunks of ``CHUNK``, at least one chunk a pass: the
    sampling cannot make the pass much slower than it is without it, whatever Nomad's latency."""
    usage = getattr(ctx.runner, "usage", None)
    if usage is None or ctx.timing.usage_seconds <= 0 or not running:
        return 0
    now = ctx.clock()
    due = ctx.sampled.due(running, now=now, every_seconds=ctx.timing.usage_seconds)
    nomad = [c for c in due if not c.run_id.startswith(GKE_PREFIX)][: ctx.timing.usage_nomad_per_pass]
    gke = [c for c in due if c.run_id.startswith(GKE_PREFIX)]
    batches = [gke] if gke else []
    batches += [nomad[i:i + CHUNK] for i in range(0, len(nomad), CHUNK)]
    started, budget = time.monotonic(), ctx.timing.usage_budget * pass_seconds
    samples = {}
    for number, batch in enumerate(batches):
        if number and batch is not gke and time.monotonic() - started > budget:
            break  # the rest stay due: first in line next pass
        ctx.sampled.mark([c.run_id for c in batch], now)
        try:
            answers = usage([c.run_id for c in batch], {c.run_id: c.refs for c in batch})
        except UsageUnavailable as exc:
            ctx.metrics.usage_errors.inc()
            log.warning("GPU utilization of %d runs unknown this pass: %s", len(batch), exc)
            continue
        samples.update((c.experiment_id, answers[c.run_id]) for c in batch if c.run_id in answers)
    if samples:
        with ctx.sessions() as session, session.begin():
            run_usage.record(session, samples, now=now)
    return len(samples)
