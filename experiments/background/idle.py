"""process_idle: a running run that holds GPUs it does not use is stopped on the admin's terms.

The policy is the cluster file's (``idle``, per tenant ``tenants[].idle``; a job file has no such
field, so a user cannot turn it off). Two signals, each from what the reconcile pass already keeps,
never from a per-run poll:

- **low utilization**: every GPU of every rank below ``gpu_util_below_pct`` in every sample for
  ``low_util_minutes`` (``run_usage.util_max_pct``, the busiest GPU of each sample; a sample
  nobody measured breaks the streak). The newest sample must be recent (half the window):
  stale numbers say nothing about now; likewise two neighbouring samples more than half a window
  apart break the streak (``_without_gaps``).
- **no log output**: no rank's kept log tail changed for ``no_logs_minutes``
  (``run_logs.changed_at`` to the capture that saw it unchanged). Before a stop the run's tails
  are read again, so a run that just printed is not stopped on an old capture.

The step runs at most every ``Timing.policy_seconds`` (a minute by default), so "a pass" below is
one of its passes. A run that meets a signal first gets an ``idle-warning`` event; it is stopped at
a later pass only if it still meets one (an ``idle-cleared`` event marks a warned run that worked
again, so the next stop needs a new warning). The stop ends it ``idle`` with the evidence (signal, since when, the
values) as its reason. A run past a window with no utilization samples, or no kept logs, cannot be
judged on that signal: one ``idle-unknown-util`` / ``idle-unknown-logs`` event says so, and that
signal never fires for it.

Cost: the evidence of each run is kept in memory (``PolicyMemory``) and re-aggregated only for the
runs whose samples or log tails changed since the last pass (found through the indexes on
``run_usage.at`` and ``run_logs.captured_at``, with ``SLACK`` for a transaction another worker
committed late); after a restart the first pass aggregates every running run once. Each pass
also reads the running runs and their idle events, and reads the logs of a run about to be stopped.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, case, func, or_, select
from sqlalchemy.orm import Session

from clusters.derive.runpolicy import IdleSpec, derive_idle_policies
from experiments.background.context import Context, log
from experiments.models import Event, Experiment, RunLog, RunUsage
from experiments.scheduler import bound_clause
from experiments.services import logs as run_logs
from experiments.services.lifecycle import record, transition
from experiments.states import State
from jobs.runner import SchedulerUnavailable

ACTOR = "idle-policy"
# Changes committed up to this long after their timestamp (a slow transaction of another worker) are still seen.
SLACK = timedelta(seconds=30)
# More runs to refresh than this: one aggregate over all running runs instead of an IN list.
FULL_REFRESH = 500
WARNING, CLEARED, UNKNOWN_UTIL, UNKNOWN_LOGS = "idle-warning", "idle-cleared", "idle-unknown-util", "idle-unknown-logs"
_KINDS = (WARNING, CLEARED, UNKNOWN_UTIL, UNKNOWN_LOGS)


@dataclass(frozen=True)
class Tracked:
    id: str
    run_id: str
    cluster: str
    tenant: str
    policy: IdleSpec


@dataclass(frozen=True)
class UtilEvidence:
    last_at: datetime
    known: int
    low_since: datetime | None
    busiest: float | None
    samples: int


@dataclass(frozen=True)
class LogEvidence:
    rows: int
    known: int
    quiet_since: datetime | None
    observed_until: datetime


class PolicyMemory:
    """Per process: each running run's idle evidence as of the last pass that read it, and when the
    idle and budget steps last ran. A run missing here is read in full at the next pass (after a
    restart: all of them, once)."""

    def __init__(self) -> None:
        self.util: dict[str, UtilEvidence | None] = {}
        self.logs: dict[str, LogEvidence | None] = {}
        self.read_at: datetime | None = None
        self.budget_at: datetime | None = None
        self.lock = threading.Lock()

    def due(self, last: datetime | None, now: datetime, every_seconds: float) -> bool:
        return last is None or (now - last).total_seconds() >= every_seconds


def _stamp(at: datetime) -> str:
    return f"{at:%Y-%m-%d %H:%M}Z"


def _tracked(ctx: Context, session: Session) -> list[Tracked]:
    policies = {(c.name, tenant): spec for c in ctx.catalog.configs for tenant, spec in derive_idle_policies(c).items()}
    if not any(p.enabled for p in policies.values()):
        return []
    shortest = min(m for p in policies.values() for m in (p.low_util_minutes, p.no_logs_minutes) if m > 0)
    # A run younger than the shortest window cannot meet a signal or be unknown on one yet.
    query = select(Experiment.id, Experiment.run_id, Experiment.cluster, Experiment.tenant).where(
        Experiment.state == State.RUNNING.value, Experiment.run_id.is_not(None),
        Experiment.running_at <= ctx.clock() - timedelta(minutes=shortest))
    if (bound := bound_clause(ctx.runner, Experiment.cluster, Experiment.scheduler)) is not None:
        query = query.where(bound)
    if (mine := ctx.share(session, Experiment.id)) is not None:
        query = query.where(mine)  # several workers: this one's buckets (background.membership), no double warnings
    rows = session.connection().execute(query).all()  # Core rows: 5,000 of them without ORM overhead
    return [Tracked(r.id, r.run_id, r.cluster, r.tenant, policy) for r in rows
            if (policy := policies.get((r.cluster, r.tenant))) is not None and policy.enabled]


def _utilization(session: Session, tracked: Sequence[Tracked], only: Collection[str] | None = None) -> dict[str, UtilEvidence]:
    """Per running run (of ``only`` where given): its newest sample, how many had a measured busiest
    GPU, and the streak of low samples since the last one at or over the threshold (or unmeasured).
    One statement per distinct threshold (one in most fleets)."""
    found: dict[str, UtilEvidence] = {}
    by_threshold: dict[float, set[tuple[str, str]]] = {}
    for t in tracked:
        if t.policy.low_util_minutes > 0:
            by_threshold.setdefault(t.policy.util_below_pct, set()).add((t.cluster, t.tenant))
    for threshold, owners in sorted(by_threshold.items()):
        busy = or_(RunUsage.util_max_pct.is_(None), RunUsage.util_max_pct >= threshold)
        per_run = (select(RunUsage.experiment_id.label("eid"), func.max(RunUsage.at).label("last_at"),
                          func.count(RunUsage.util_max_pct).label("known"), func.max(case((busy, RunUsage.at))).label("last_busy"))
                   .join(Experiment, Experiment.id == RunUsage.experiment_id).where(Experiment.state == State.RUNNING.value))
        if len(by_threshold) > 1:
            per_run = per_run.where(or_(*(and_(Experiment.cluster == c, Experiment.tenant == t) for c, t in sorted(owners))))
        if only is not None:
            per_run = per_run.where(RunUsage.experiment_id.in_(sorted(only)))
        agg = per_run.group_by(RunUsage.experiment_id).subquery()
        streak = RunUsage.__table__.alias("streak")
        rows = session.connection().execute(
            select(agg.c.eid, agg.c.last_at, agg.c.known, agg.c.last_busy, func.min(streak.c.at), func.max(streak.c.util_max_pct),
                   func.coalesce(func.sum(streak.c.samples), 0))
            .select_from(agg).outerjoin(streak, and_(streak.c.experiment_id == agg.c.eid, or_(agg.c.last_busy.is_(None), streak.c.at > agg.c.last_busy)))
            .group_by(agg.c.eid, agg.c.last_at, agg.c.known, agg.c.last_busy))
        for eid, last_at, known, _, low_since, busiest, samples in rows:
            found[eid] = UtilEvidence(last_at, int(known), low_since, busiest, int(samples))
    return found


def _logs(session: Session, only: Collection[str] | None = None) -> dict[str, LogEvidence]:
    query = (select(RunLog.experiment_id, func.count(), func.count(RunLog.changed_at), func.max(RunLog.changed_at), func.min(RunLog.captured_at))
             .join(Experiment, Experiment.id == RunLog.experiment_id).where(Experiment.state == State.RUNNING.value))
    if only is not None:
        query = query.where(RunLog.experiment_id.in_(sorted(only)))
    rows = session.connection().execute(query.group_by(RunLog.experiment_id))
    return {eid: LogEvidence(int(n), int(known), quiet, seen) for eid, n, known, quiet, seen in rows}


def _marks(session: Session) -> dict[str, list[str]]:
    """The idle events of each running run, oldest first."""
    marks: dict[str, list[str]] = {}
    for eid, kind in session.execute(select(Event.experiment_id, Event.kind).join(Experiment, Experiment.id == Event.experiment_id)
                                     .where(Experiment.state == State.RUNNING.value, Event.kind.in_(_KINDS)).order_by(Event.id)):
        marks.setdefault(eid, []).append(kind)
    return marks


def low_util_evidence(t: Tracked, util: UtilEvidence | None, now: datetime) -> str | None:
    window = timedelta(minutes=t.policy.low_util_minutes)
    if util is None or util.low_since is None or util.last_at < now - window / 2 or util.last_at - util.low_since < window:
        return None
    return (f"GPU utilization below {t.policy.util_below_pct:g}% on every GPU since {_stamp(util.low_since)} "
            f"({int((util.last_at - util.low_since).total_seconds() // 60)} min to the last sample at {_stamp(util.last_at)}; "
            f"{util.samples} samples, busiest GPU {util.busiest:.1f}%)")


def _without_gaps(session: Session, t: Tracked, util: UtilEvidence, usage_seconds: float) -> UtilEvidence:
    """``util`` with its low streak starting after the last gap in it: two neighbouring samples more
    than half a window apart (and more than twice what the older one's samples span, so rows merged
    by downsampling are not gaps) leave time nobody measured (metrics source down, service stopped),
    which is not "below the threshold". Read only for a run that meets the signal on its streak."""
    if util.low_since is None:
        return util
    # Only the streak ``util`` saw: a sample another worker stored since may be unmeasured (NULL).
    rows = session.execute(select(RunUsage.at, RunUsage.samples, RunUsage.util_max_pct).where(
        RunUsage.experiment_id == t.id, RunUsage.at >= util.low_since, RunUsage.at <= util.last_at).order_by(RunUsage.at)).all()
    half = timedelta(minutes=t.policy.low_util_minutes) / 2
    start = 0
    for i in range(1, len(rows)):
        gap = rows[i].at - rows[i - 1].at
        if gap > half and gap.total_seconds() > 2 * rows[i - 1].samples * usage_seconds:
            start = i
    if start == 0:
        return util
    kept = rows[start:]
    return UtilEvidence(util.last_at, util.known, kept[0].at, max(r.util_max_pct for r in kept), sum(r.samples for r in kept))


def no_logs_evidence(t: Tracked, logs: LogEvidence | None) -> str | None:
    if logs is None or logs.quiet_since is None or logs.known < logs.rows:
        return None
    if logs.observed_until - logs.quiet_since < timedelta(minutes=t.policy.no_logs_minutes):
        return None
    return (f"no log output on any rank since {_stamp(logs.quiet_since)} "
            f"({int((logs.observed_until - logs.quiet_since).total_seconds() // 60)} min to the capture at {_stamp(logs.observed_until)})")


def _blind(t: Tracked, util: UtilEvidence | None, logs: LogEvidence | None) -> bool:
    """Whether a signal of ``t``'s policy has nothing to go on (no measured sample, or no kept tail)."""
    return (t.policy.low_util_minutes > 0 and (util is None or util.known == 0)) or (t.policy.no_logs_minutes > 0 and logs is None)


def _running_since(session: Session, ids: Collection[str]) -> dict[str, datetime]:
    """When these runs started running: read only for the few that ``_blind`` picks."""
    if not ids:
        return {}
    return dict(session.connection().execute(select(Experiment.id, Experiment.running_at).where(Experiment.id.in_(sorted(ids)))).all())


def _unknowns(t: Tracked, running_at: datetime, util: UtilEvidence | None, logs: LogEvidence | None, now: datetime) -> list[tuple[str, str]]:
    notes = []
    if t.policy.low_util_minutes > 0 and now - running_at >= timedelta(minutes=t.policy.low_util_minutes) and (util is None or util.known == 0):
        notes.append((UNKNOWN_UTIL, f"idle policy: GPU utilization of this run is unknown (no measured sample in {t.policy.low_util_minutes} min of running);"
                                    " the low-utilization signal does not fire for it until samples arrive"))
    if t.policy.no_logs_minutes > 0 and now - running_at >= timedelta(minutes=t.policy.no_logs_minutes) and logs is None:
        notes.append((UNKNOWN_LOGS, f"idle policy: no log tail of this run was kept in {t.policy.no_logs_minutes} min of running;"
                                    " the no-log-output signal does not fire for it until one is"))
    return notes


def _evidence(t: Tracked, util: UtilEvidence | None, logs: LogEvidence | None, now: datetime) -> str | None:
    found = []
    if t.policy.low_util_minutes > 0 and (e := low_util_evidence(t, util, now)):
        found.append(e)
    if t.policy.no_logs_minutes > 0 and (e := no_logs_evidence(t, logs)):
        found.append(e)
    return "; ".join(found) or None


def _changed(session: Session, column: Any, since: datetime | None) -> set[str] | None:
    """Runs with a usage sample (or log capture) at or after ``since``; None: all (no earlier pass)."""
    if since is None:
        return None
    return set(session.connection().execute(select(column.table.c.experiment_id).where(column >= since).distinct()).scalars())


def _refresh(session: Session, memory: PolicyMemory, tracked: Sequence[Tracked], now: datetime) -> tuple[dict[str, UtilEvidence | None], dict[str, LogEvidence | None]]:
    """The evidence of every tracked run: from memory, re-read for runs that changed or are new."""
    ids = {t.id for t in tracked}
    since = memory.read_at - SLACK if memory.read_at is not None else None
    for cache, column, read in ((memory.util, RunUsage.at, lambda only: _utilization(session, tracked, only)),
                                (memory.logs, RunLog.captured_at, lambda only: _logs(session, only))):
        for gone in [k for k in cache if k not in ids]:
            del cache[gone]
        changed = _changed(session, column, since)
        stale = ids if changed is None else (ids - cache.keys()) | (changed & ids)
        if not stale:
            continue
        found = read(None if len(stale) > FULL_REFRESH else stale)
        cache.update((k, found.get(k)) for k in stale)
    memory.read_at = now
    return memory.util, memory.logs


def process_idle(ctx: Context) -> int:
    """One pass, at most every ``Timing.policy_seconds`` (the windows are tens of minutes); returns
    how many runs it stopped."""
    now = ctx.clock()
    if not ctx.policy.due(ctx.policy.read_at, now, ctx.timing.policy_seconds):
        return 0
    with ctx.sessions() as session:
        tracked = _tracked(ctx, session)
        if not tracked:
            return 0
        with ctx.policy.lock:
            util, logs = (dict(d) for d in _refresh(session, ctx.policy, tracked, now))
        for t in tracked:
            if t.policy.low_util_minutes > 0 and (found := util.get(t.id)) is not None and low_util_evidence(t, found, now):
                util[t.id] = _without_gaps(session, t, found, ctx.timing.usage_seconds)
        marks = _marks(session)
        started = _running_since(session, [t.id for t in tracked if _blind(t, util.get(t.id), logs.get(t.id))])
    notes: list[tuple[str, str, str]] = []
    to_stop: list[Tracked] = []
    for t in tracked:
        kinds = marks.get(t.id, [])
        warned = [k for k in kinds if k in (WARNING, CLEARED)][-1:] == [WARNING]
        if t.id in started:
            notes += [(t.id, kind, message) for kind, message in _unknowns(t, started[t.id], util.get(t.id), logs.get(t.id), now) if kind not in kinds]
        evidence = _evidence(t, util.get(t.id), logs.get(t.id), now)
        if evidence and warned:
            to_stop.append(t)
        elif evidence:
            notes.append((t.id, WARNING, f"idle policy warning: {evidence}; the run is stopped and ends idle at the next pass unless this changes"))
        elif warned:
            notes.append((t.id, CLEARED, "idle policy: the run works again (utilization or log output); the warning no longer applies"))
    if notes:
        with ctx.sessions() as session, session.begin():
            for experiment_id, kind, message in notes:
                record(session, experiment_id=experiment_id, actor=ACTOR, kind=kind, message=message, now=now)
    return sum(_stop(ctx, t, util.get(t.id)) for t in to_stop)


def _stop(ctx: Context, t: Tracked, util: UtilEvidence | None) -> int:
    """Read the run's logs once more (the evidence must hold now), stop it on the scheduler, end it idle."""
    run_logs.keep(ctx.sessions, ctx.runner, [t.id], now=ctx.clock(), tail_bytes=ctx.timing.log_tail_bytes)
    now = ctx.clock()
    with ctx.sessions() as session:
        logs = _logs(session, only=[t.id]).get(t.id)
    evidence = _evidence(t, util, logs, now)
    if evidence is None:
        with ctx.sessions() as session, session.begin():
            record(session, experiment_id=t.id, actor=ACTOR, kind=CLEARED, now=now,
                   message="idle policy: new log output on the last read; the warning no longer applies")
        return 0
    try:
        ctx.runner.stop(t.run_id)
    except SchedulerUnavailable as exc:
        log.warning("could not stop idle experiment %s yet: %s", t.id, exc)
        return 0
    reason = f"idle: {evidence}; stopped on the scheduler by the idle policy of cluster {t.cluster} for tenant {t.tenant}"
    with ctx.sessions() as session, session.begin():
        fresh = session.get(Experiment, t.id, with_for_update=True, populate_existing=True)
        if fresh is None or fresh.state != State.RUNNING.value:
            return 0
        transition(session, fresh, State.IDLE, actor=ACTOR, now=ctx.clock(), reason=reason)
    log.info("experiment %s idle: %s", t.id, evidence)
    return 1

