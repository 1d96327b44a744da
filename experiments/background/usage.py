"""GPU utilization sampling, a step of the reconcile pass (never a poll of its own).

Each running run is sampled at most once per ``Timing.usage_seconds``. Nomad costs one GET per
allocation, so at most ``Timing.usage_nomad_per_pass`` are asked per pass, least recently sampled
first (a rotation: with 200 running runs and 25 a pass, each is sampled every 8 passes); GKE costs
one Prometheus query per pass for all its due runs. A run is marked sampled whether or not the
source answered, so a metrics source that is down is not asked harder; its runs get no row
(unknown), and ``gpufleet_usage_errors`` counts the failed passes.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from experiments.background.context import Context, log
from experiments.services import usage as run_usage
from jobs.runner import GKE_PREFIX
from jobs.usage import UsageUnavailable


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


def sample_usage(ctx: Context, running: Sequence[Candidate]) -> int:
    """Sample the due runs among ``running``; returns how many got a sample stored."""
    usage = getattr(ctx.runner, "usage", None)
    if usage is None or ctx.timing.usage_seconds <= 0 or not running:
        return 0
    now = ctx.clock()
    due = ctx.sampled.due(running, now=now, every_seconds=ctx.timing.usage_seconds)
    nomad = [c for c in due if not c.run_id.startswith(GKE_PREFIX)][: ctx.timing.usage_nomad_per_pass]
    chosen = nomad + [c for c in due if c.run_id.startswith(GKE_PREFIX)]
    if not chosen:
        return 0
    ctx.sampled.mark([c.run_id for c in chosen], now)
    try:
        answers = usage([c.run_id for c in chosen], {c.run_id: c.refs for c in chosen})
    except UsageUnavailable as exc:
        ctx.metrics.usage_errors.inc()
        log.warning("GPU utilization of %d runs unknown this pass: %s", len(chosen), exc)
        return 0
    samples = {c.experiment_id: answers[c.run_id] for c in chosen if c.run_id in answers}
    if samples:
        with ctx.sessions() as session, session.begin():
            run_usage.record(session, samples, now=now)
    return len(samples)
