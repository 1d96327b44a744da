"""A run's GPU utilization series in the database: append samples, keep it small, summarize it.

Each sample is one row; once a run has more than ``MAX_POINTS`` rows, neighbouring rows are
merged in pairs (sample-weighted mean, max of peaks), halving the resolution and keeping the
series of any run length at a few hundred rows while its mean and peaks stay exact. Unknown
values are NULL and never count as 0: a run nobody could measure has a null summary.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Row, delete, func, select
from sqlalchemy.orm import Session

from experiments.models import Experiment, RunUsage
from experiments.row_locks import lock_in_id_order
from jobs.usage import Usage

MAX_POINTS = 360


def record(session: Session, samples: Mapping[str, Usage], *, now: datetime) -> None:
    """Append one sample per experiment (inside the caller's transaction), then downsample those over MAX_POINTS."""
    # The busiest GPU says "every GPU was below" only if the sample covers every GPU of the run: a rank
    # the source did not report (no DCGM series on its node, one allocation of several) stays unknown.
    gpus = dict(session.execute(select(Experiment.id, Experiment.gpus).where(Experiment.id.in_(list(samples)))).all())
    for experiment_id, usage in sorted(samples.items()):
        busiest = usage.util_max_pct if usage.gpus >= gpus.get(experiment_id, 0) else None
        session.merge(RunUsage(experiment_id=experiment_id, at=now, samples=1, util_mean_pct=usage.util_pct,
                               util_peak_pct=usage.util_pct, memory_peak_mib=usage.memory_mib, util_max_pct=busiest))
    session.flush()
    over = sorted(experiment_id for experiment_id, count in _counts(session, list(samples)) if count > MAX_POINTS)
    if not over:
        return
    # Halving rewrites a run's whole series. Two workers sampling one run at once (their views of the membership
    # differ for a pass) both halved what each saw before the other's commit: the second's rewrite failed on the
    # primary key, its sample lost. The runs' rows are locked first (experiments.row_locks: no cycle with a
    # reconcile chunk, none with a sample's key share), and counted again under the lock: the second worker
    # counts what the first left.
    lock_in_id_order(session, over)
    for experiment_id, count in _counts(session, over):
        if count > MAX_POINTS:
            _halve(session, experiment_id)


def _counts(session: Session, experiment_ids: list[str]) -> Sequence[Row[Any]]:
    """(run, rows) per run of these runs' series (sorted: halved in id order)."""
    return session.execute(select(RunUsage.experiment_id, func.count()).where(RunUsage.experiment_id.in_(experiment_ids))
                           .group_by(RunUsage.experiment_id).order_by(RunUsage.experiment_id)).all()


def _max(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


def _halve(session: Session, experiment_id: str) -> None:
    rows = session.scalars(select(RunUsage).where(RunUsage.experiment_id == experiment_id).order_by(RunUsage.at)).all()
    merged = []
    for first, second in zip(rows[::2], [*rows[1::2], None], strict=False):
        if second is None:
            merged.append((first.at, first.samples, first.util_mean_pct, first.util_peak_pct, first.memory_peak_mib, first.util_max_pct))
            continue
        weights = [(r.util_mean_pct, r.samples) for r in (first, second) if r.util_mean_pct is not None]
        mean = sum(v * n for v, n in weights) / sum(n for _, n in weights) if weights else None
        # The busiest GPU of a merged bucket is unknown if either half's was: the idle policy must not
        # read "every GPU low" into a half nobody measured.
        busiest = None if None in (first.util_max_pct, second.util_max_pct) else max(first.util_max_pct, second.util_max_pct)
        merged.append((first.at, first.samples + second.samples, mean, _max(first.util_peak_pct, second.util_peak_pct),
                       _max(first.memory_peak_mib, second.memory_peak_mib), busiest))
    session.execute(delete(RunUsage).where(RunUsage.experiment_id == experiment_id))
    session.add_all(RunUsage(experiment_id=experiment_id, at=at, samples=n, util_mean_pct=mean, util_peak_pct=peak, memory_peak_mib=memory,
                             util_max_pct=busiest) for at, n, mean, peak, memory, busiest in merged)


def _stamp(at: datetime | None) -> str | None:
    return at.isoformat(timespec="seconds") + "Z" if at else None


def summarize(points: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Mean and peak utilization (%) and peak GPU memory (MiB, of any one GPU) of a series; null where unknown."""
    weights = [(p["util_mean_pct"], p["samples"]) for p in points if p["util_mean_pct"] is not None]
    peaks = [p["util_peak_pct"] for p in points if p["util_peak_pct"] is not None]
    memory = [p["memory_peak_mib"] for p in points if p["memory_peak_mib"] is not None]
    return {"mean_pct": round(sum(v * n for v, n in weights) / sum(n for _, n in weights), 1) if weights else None,
            "peak_pct": round(max(peaks), 1) if peaks else None, "peak_memory_mib": round(max(memory)) if memory else None,
            "samples": sum(p["samples"] for p in points), "last_sampled": points[-1]["at"] if points else None}


def summary(session: Session, experiment_id: str) -> dict[str, Any]:
    return summarize(series(session, experiment_id))


def series(session: Session, experiment_id: str) -> list[dict[str, Any]]:
    rows: Sequence[RunUsage] = session.scalars(select(RunUsage).where(RunUsage.experiment_id == experiment_id).order_by(RunUsage.at)).all()
    return [{"at": _stamp(r.at), "samples": r.samples, "util_mean_pct": r.util_mean_pct, "util_peak_pct": r.util_peak_pct,
             "memory_peak_mib": r.memory_peak_mib} for r in rows]
