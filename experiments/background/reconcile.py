"""process_scheduled: follow each run the scheduler holds into the experiment's own states,
and carry out requested cancels (stop on the scheduler first, then ``cancelled``).

Scheduler phase -> experiment state: pending and not placed -> queued (the reason says why,
e.g. the placement failure); pending and placed -> provisioning; running -> running;
succeeded / failed -> the same, with the exit code and the scheduler's reason (OOM,
preemption, the task's last event); stopped by someone else -> failed; placed once and back
in the queue (a Kueue eviction or preemption) -> an infrastructure failure of that attempt.

Every failure gets a class (``jobs.failures``: ``infrastructure`` when the scheduler says the
fleet lost the run, ``user`` for the command's own exit, an OOM kill, its deadline), recorded
on the run and in its event. A failure the job's ``retries`` allow becomes ``retrying`` and the
experiment's next attempt (``experiments.attempts``: new secret_ids, a new scheduler run, the
same id and quota); any other failure ends it ``failed``. A run requeued by Kueue that is not
retried is stopped at once, since its spent secret_id cannot resume and it would hold its queue
place for nothing. Once an experiment is terminal it is never asked about again, so Nomad's
garbage collection loses nothing.

One pass asks each scheduler in batches (``jobs.runner.poll``: Nomad's job and allocation
lists, Kubernetes' Job and Workload lists), not 3 GETs per run: a run whose list entries are
as last seen (its fingerprint) costs nothing more, and is still re-read in full every
``Timing.refresh_seconds`` so a changed reason (why a queued run waits) shows up. State
changes are committed in batches of ``COMMIT_BATCH``, the reconciled stamps in one commit, and the
logs of runs that ended are kept on a few threads. The pass ends by sampling the GPU
utilization of the running runs it just read, at a bounded rate (background.usage).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Row, not_, or_, select
from sqlalchemy.orm import Session

from experiments import attempts
from experiments.background.context import Context, log
from experiments.background.usage import Candidate, sample_usage
from experiments.background.vanished import hold_mass_vanishing
from experiments.errors import ApiError
from experiments.models import Experiment
from experiments.row_locks import lock_in_id_order, update_unlocked
from experiments.scheduler import bound_clause, not_bound
from experiments.services import logs as run_logs
from experiments.services.lifecycle import record, transition
from experiments.states import ON_SCHEDULER, TERMINAL, State, can_move
from jobs import failures
from jobs.failures import FailureClass
from jobs.runner import Phase, RunNotFound, RunReport, SchedulerUnavailable, poll

ACTOR = "reconciler"
COMMIT_BATCH = 500
STAMP_BATCH = 2000  # ids per UPDATE of reconciled_at
APPLY_THREADS = 4  # chunks of moves committed at once


@dataclass(frozen=True)
class Move:
    experiment_id: str
    target: State
    reason: str
    exit_code: int | None = None
    refs: dict[str, str] | None = None
    # The scheduler's own placement and end times: the cost of a run that ends unseen placed.
    placed_at: datetime | None = None
    ended_at: datetime | None = None
    # A failure's jobs.failures class and cause; with ``backoff`` set the target is RETRYING.
    failure_class: FailureClass | None = None
    cause: str | None = None
    backoff: float | None = None
    # The scheduler run the answer was about: the move applies only while the experiment still follows
    # that run. Another replica may have retried it meanwhile; an answer about attempt 1 must never end,
    # retry or stop attempt 2.
    run_id: str | None = None


def process_scheduled(ctx: Context) -> int:
    """One pass over the experiments on the scheduler of a cluster bound to this service, least
    recently reconciled first; returns how many got an answer (changed or not). A run the
    scheduler gave no answer for (its namespace could not be listed, the scheduler is down) is
    left as it was, not stamped as reconciled (so the lag metric shows it) and counted in
    ``gpufleet_reconcile_errors``."""
    started = time.monotonic()
    query = (select(Experiment.id, Experiment.run_id, Experiment.state, Experiment.cancel_requested_at, Experiment.scheduler_refs, Experiment.cluster)
             .where(Experiment.state.in_([s.value for s in ON_SCHEDULER]), Experiment.run_id.is_not(None)))
    bound = bound_clause(ctx.runner, Experiment.cluster, Experiment.scheduler)
    if bound is not None:
        query = query.where(bound)
        _note_not_bound(ctx, bound)
    with ctx.sessions() as session:
        if (mine := ctx.share(session, Experiment.id)) is not None:
            query = query.where(mine)  # several workers: this one's buckets (background.membership)
            bound = mine if bound is None else bound & mine
        rows = session.execute(query.order_by(Experiment.reconciled_at.is_not(None), Experiment.reconciled_at)
                               .limit(ctx.timing.reconcile_batch)).all()
    done = 0
    for row in [r for r in rows if r.cancel_requested_at is not None]:
        try:
            reconcile_one(ctx, row.id)
            done += 1
        except SchedulerUnavailable as exc:
            ctx.metrics.reconcile_errors.inc()
            log.warning("cancel of %s deferred: %s", row.id, exc)
    tracked = [r for r in rows if r.cancel_requested_at is None]
    if not tracked:
        return done
    run_ids = [r.run_id for r in tracked]
    try:
        results = poll(ctx.runner, run_ids, ctx.fingerprints.known(run_ids, max_age=ctx.timing.refresh_seconds))
    except SchedulerUnavailable as exc:
        ctx.metrics.reconcile_errors.inc(len(tracked))
        log.warning("reconcile pass deferred (%d runs): %s", len(tracked), exc)
        return done
    results = hold_mass_vanishing(ctx, tracked, results)
    moves: list[Move] = []
    fresh: dict[str, str] = {}
    answered: list[str] = []
    forgotten: set[str] = set()
    for row in tracked:
        result = results.get(row.run_id)
        if result is None:
            continue  # no answer for it this pass (its scheduler or namespace could not be read)
        if result.report is None and not result.gone:
            answered.append(row.id)
            continue  # unchanged since its last full read
        if result.gone:
            moves.append(Move(row.id, State.FAILED, f"the scheduler no longer knows run {row.run_id} (garbage-collected before gpufleet saw it end)",
                              run_id=row.run_id))
            answered.append(row.id)
            forgotten.add(row.id)
            continue
        try:
            moves.append(_decide(ctx, row.id, row.run_id, row.state, result.report))
        except SchedulerUnavailable as exc:
            log.warning("reconcile of %s deferred: %s", row.id, exc)
            continue
        answered.append(row.id)
        fresh[row.run_id] = result.fingerprint
    if missed := len(tracked) - len(answered):
        ctx.metrics.reconcile_errors.inc(missed)
        log.warning("reconcile: no answer for %d of %d runs this pass (see the scheduler errors above)", missed, len(tracked))
    if ctx.fenced():
        # Frozen since the lists were read (a paused VM): the others may follow these runs now, with newer answers.
        log.warning("reconcile: this worker's heartbeat lapsed during the pass; its %d answers are dropped", len(answered))
        return done
    ended, failed = _apply_all(ctx, moves, answered)
    _keep_logs(ctx, ended - forgotten, bound)  # a forgotten run has no logs left to read; before the stops below, which delete pods
    retrying = {m.experiment_id for m in moves if m.target == State.RETRYING}  # a set: thousands of runs may end in one pass
    _stop_retried(ctx, [r.run_id for r in tracked if r.id in ended and r.id in retrying])
    unapplied = {r.run_id for r in tracked if r.id in failed}  # not remembered as seen: read and applied again next pass
    ctx.fingerprints.remember({run_id: fingerprint for run_id, fingerprint in fresh.items() if run_id not in unapplied})
    gone = [r.run_id for r in tracked if r.id in ended]
    ctx.fingerprints.forget(gone)
    ctx.sampled.forget(gone)
    sample_usage(ctx, _running(tracked, moves, set(answered) - failed), pass_seconds=time.monotonic() - started)
    return done + len(answered)


def _stop_retried(ctx: Context, run_ids: list[str]) -> None:
    """Stop what is left of each attempt that will be retried, now that ``retrying`` is committed: a
    Kueue-requeued Job must not be admitted again meanwhile (its pods would start with spent
    secret_ids), nor the other ranks of a gang keep their GPUs. Best effort: the dispatcher stops it
    again, for certain, before the next attempt is submitted (experiments.attempts)."""
    for run_id in run_ids:
        try:
            ctx.runner.stop(run_id)
        except SchedulerUnavailable as exc:
            log.warning("stopping %s (its attempt will be retried) failed; the dispatcher stops it before the next attempt: %s", run_id, exc)


def _running(rows: Sequence[Row[Any]], moves: list[Move], answered: set[str]) -> list[Candidate]:
    """The runs the scheduler just said are running, with their scheduler refs (the allocation)."""
    moved = {m.experiment_id: m for m in moves}
    out = []
    for row in rows:
        move = moved.get(row.id)
        state = move.target.value if move is not None else row.state
        if row.id in answered and state == State.RUNNING.value:
            out.append(Candidate(row.id, row.run_id, {**(row.scheduler_refs or {}), **((move.refs if move else None) or {})}))
    return out


def _note_not_bound(ctx: Context, bound: ColumnElement[bool]) -> None:
    """Runs of clusters this service is not bound to keep their state; their reason says why
    nothing here follows them (one UPDATE per such cluster, only where the reason differs)."""
    on_scheduler = Experiment.state.in_([s.value for s in ON_SCHEDULER])
    with ctx.sessions() as session, session.begin():
        pairs = session.execute(select(Experiment.cluster, Experiment.scheduler).where(on_scheduler, not_(bound)).distinct()).all()
        for cluster, scheduler in pairs:
            reason = not_bound(ctx.runner, cluster, scheduler)
            update_unlocked(session, on_scheduler & (Experiment.cluster == cluster) & (Experiment.scheduler == scheduler)
                            & or_(Experiment.reason.is_(None), Experiment.reason != reason), reason=reason)


def _keep_logs(ctx: Context, ended: set[str], bound: ColumnElement[bool] | None) -> None:
    """Log tails into the database: every run that ended this pass, and a rotating few running
    ones (``Timing.log_captures_per_pass``), never a read per run per pass."""
    timing, now = ctx.timing, ctx.clock()
    if ended:
        # Each run's reads are waits on the scheduler: a few threads, so runs that end together (thousands
        # at once) do not hold the next pass up for one GET after another.
        ids = sorted(ended)
        width = max(1, min(_writers(ctx, timing.log_keep_concurrency), len(ids)))
        with ThreadPoolExecutor(max_workers=width, thread_name_prefix="gpufleet-logs") as pool:
            for future in [pool.submit(run_logs.keep, ctx.sessions, ctx.runner, ids[i::width], now=now, tail_bytes=timing.log_tail_bytes)
                           for i in range(width)]:
                future.result()
    if timing.log_captures_per_pass:
        run_logs.keep_running(ctx.sessions, ctx.runner, bound=bound, now=now, limit=timing.log_captures_per_pass,
                              every_seconds=timing.log_capture_every_seconds, tail_bytes=timing.log_tail_bytes)


def _decide(ctx: Context, experiment_id: str, run_id: str, state: str, report: RunReport) -> Move:
    refs = dict(report.refs)
    requeued = (not report.placed and state in (State.PROVISIONING.value, State.RUNNING.value)) or (report.cause or "").startswith("kueue-")
    if report.phase == Phase.PENDING and requeued:
        # Placed once, now back in the queue (a Kueue eviction or preemption, a lost node): the fleet took
        # its GPUs. Its single-use secret_id is spent, so this attempt cannot resume where it waits. Kueue's
        # Evicted condition says so even when no pass saw the run placed.
        move = Move(experiment_id, State.FAILED, f"lost its GPUs after it was placed ({report.detail})", None, refs,
                    failure_class=FailureClass.INFRASTRUCTURE, cause=report.cause or failures.REQUEUED, run_id=run_id)
        move = _failed(ctx, move)
        if move.target == State.FAILED:
            ctx.runner.stop(run_id)  # not retried: free its queue place and the tenant's quota at once
            move = replace(move, reason=f"{move.reason}; stopped on the scheduler")
        return move
    target, reason = _target(report, cancelling=False)
    move = Move(experiment_id, target, reason, report.exit_code if target in TERMINAL else None, refs, report.placed_at, report.ended_at,
                run_id=run_id)
    if target != State.FAILED or report.phase != Phase.FAILED:
        return move
    klass = FailureClass.INFRASTRUCTURE if report.infrastructure else FailureClass.USER
    return _failed(ctx, replace(move, failure_class=klass, cause=report.cause))


def _failed(ctx: Context, move: Move) -> Move:
    """A failed attempt: retried (RETRYING after a backoff) when the job's ``retries`` allow it, else
    FAILED; the reason names the class, the cause and what happens next (experiments.attempts)."""
    with ctx.sessions() as session:
        exp = session.get(Experiment, move.experiment_id)
        assert exp is not None
        attempt, job, document, digest = exp.attempt, exp.job, exp.job_spec, exp.job_spec_sha256
    try:
        retries = ctx.catalog.frozen(job, document, digest).retries
    except ApiError:
        retries = None
    assert move.failure_class is not None
    verdict = attempts.decide(retries, attempt=attempt, failure_class=move.failure_class, exit_code=move.exit_code,
                              base=ctx.timing.retry_backoff_seconds, cap=ctx.timing.retry_backoff_max_seconds, cause=move.cause)
    cause = f", {move.cause}" if move.cause else ""
    reason = f"{move.reason} ({move.failure_class.value} failure{cause} of attempt {attempt}; {verdict.why})"
    if verdict.retry:
        return replace(move, target=State.RETRYING, reason=reason, backoff=verdict.backoff_seconds)
    return replace(move, reason=reason)


def _apply_all(ctx: Context, moves: list[Move], reconciled: list[str]) -> tuple[set[str], set[str]]:
    """Commit the moves COMMIT_BATCH at a time and stamp every experiment the scheduler answered
    for (only those: a run without an answer keeps its old stamp); returns the ids that ended, and
    those of chunks that failed (rolled back, logged and counted; the caller leaves them for the next pass)."""
    now = ctx.clock()
    ended: set[str] = set()
    failed: set[str] = set()
    # One commit for the stamps, never waiting on a row (experiments.row_locks): a run a chunk of another
    # worker is moving right now keeps its old stamp, and that chunk stamps it itself (_apply).
    with ctx.sessions() as session, session.begin():
        for start in range(0, len(reconciled), STAMP_BATCH):
            update_unlocked(session, Experiment.id.in_(reconciled[start:start + STAMP_BATCH]), reconciled_at=now)
    chunks = [moves[start:start + COMMIT_BATCH] for start in range(0, len(moves), COMMIT_BATCH)]
    # Chunks hold disjoint rows, so on PostgreSQL they commit side by side: thousands of runs that end at
    # once are recorded in a fraction of one commit after another (each waits mostly on the database).
    with ThreadPoolExecutor(max_workers=max(1, min(_writers(ctx, APPLY_THREADS), len(chunks))), thread_name_prefix="gpufleet-apply") as pool:
        for chunk, future in [(chunk, pool.submit(_apply_chunk, ctx, chunk, now)) for chunk in chunks]:
            try:
                changed = future.result()
            except Exception:  # noqa: BLE001 - the other chunks committed: their ended runs still need their logs kept
                log.exception("reconcile: a chunk of %d state changes failed; its runs are read again next pass", len(chunk))
                ctx.metrics.reconcile_errors.inc(len(chunk))
                failed.update(move.experiment_id for move in chunk)
                continue
            for experiment_id, current, target in changed:
                log.info("experiment %s: %s -> %s", experiment_id, current.value, target.value)
                if target in TERMINAL or target == State.RETRYING:  # an attempt ended: keep its logs, forget its fingerprint
                    ended.add(experiment_id)
    return ended, failed


def _writers(ctx: Context, wanted: int) -> int:
    """Threads that may write at once: SQLite has one writer, and threads queued on its lock sleep in
    its busy handler (up to 100 ms a retry), so there they would only wait on each other."""
    with ctx.sessions() as session:
        return 1 if session.get_bind().dialect.name == "sqlite" else wanted


def _apply_chunk(ctx: Context, chunk: list[Move], now: datetime) -> list[tuple[str, State, State]]:
    changed = []
    with ctx.sessions() as session, session.begin():
        # Locked in id order (two chunks or two workers never wait on each other in a cycle; experiments.row_locks)
        # and read fresh: a run another worker ended meanwhile is seen ended, not ended twice.
        loaded = lock_in_id_order(session, [m.experiment_id for m in chunk])
        if ctx.fenced():  # lapsed while waiting for the locks: as before the pass's writes (process_scheduled)
            return changed
        for move in chunk:
            exp = loaded.get(move.experiment_id)
            if exp is not None and (moved := _apply(session, exp, move, now)) is not None:
                changed.append((move.experiment_id, *moved))
    return changed


def _target(report: RunReport, *, cancelling: bool) -> tuple[State, str]:
    if report.phase == Phase.PENDING:
        return (State.PROVISIONING if report.placed else State.QUEUED), report.detail
    if report.phase == Phase.RUNNING:
        return State.RUNNING, report.detail
    if report.phase == Phase.SUCCEEDED:
        return State.SUCCEEDED, "exited 0" if report.exit_code in (None, 0) else report.detail
    if report.phase == Phase.FAILED:
        return State.FAILED, report.detail
    if cancelling:
        return State.CANCELLED, "stopped on the scheduler after a cancel request"
    return State.FAILED, f"stopped outside gpufleet ({report.detail})"


def reconcile_one(ctx: Context, experiment_id: str) -> None:
    """One experiment with its own GET(s) and commit: cancels, and the bench's per-run baseline."""
    with ctx.sessions() as session:
        exp = session.get(Experiment, experiment_id)
    if exp is None or State(exp.state) in TERMINAL or exp.run_id is None:
        return
    if (why := not_bound(ctx.runner, exp.cluster, exp.scheduler)) is not None:
        raise SchedulerUnavailable(why)  # never stop, fail or free a run of another cluster from here
    if exp.cancel_requested_at is not None:
        ctx.runner.stop(exp.run_id)
        _move(ctx, Move(experiment_id, State.CANCELLED, "cancelled: stopped on the scheduler"))
        run_logs.keep(ctx.sessions, ctx.runner, [experiment_id], now=ctx.clock(), tail_bytes=ctx.timing.log_tail_bytes)
        return
    try:
        report = ctx.runner.status(exp.run_id)
    except RunNotFound:
        _move(ctx, Move(experiment_id, State.FAILED, f"the scheduler no longer knows run {exp.run_id} (garbage-collected before gpufleet saw it end)",
                        run_id=exp.run_id))
        return
    _move(ctx, _decide(ctx, experiment_id, exp.run_id, exp.state, report))


def _move(ctx: Context, move: Move) -> None:
    now = ctx.clock()
    with ctx.sessions() as session, session.begin():
        exp = session.get(Experiment, move.experiment_id, with_for_update=True, populate_existing=True)
        assert exp is not None
        moved = _apply(session, exp, move, now)
    if moved is not None:
        log.info("experiment %s: %s -> %s", move.experiment_id, moved[0].value, moved[1].value)


def _apply(session: Session, exp: Experiment, move: Move, now) -> tuple[State, State] | None:  # type: ignore[no-untyped-def]
    """One move inside the caller's transaction; (from, to) if the state changed. A move decided on an
    answer about another run than the one the experiment now follows (its attempt was retried since,
    e.g. by another replica) changes nothing."""
    if move.run_id is not None and (exp.run_id != move.run_id or State(exp.state) not in ON_SCHEDULER):
        return None
    exp.reconciled_at = now
    if move.refs and {**(exp.scheduler_refs or {}), **move.refs} != exp.scheduler_refs:
        exp.scheduler_refs = {**(exp.scheduler_refs or {}), **move.refs}  # kept once the scheduler forgets the run
    current, target = State(exp.state), move.target
    if current == target or not can_move(current, target):
        # e.g. why a queued run is not placed yet; a move the state is already past is an older answer
        # (another worker read the run later), whose reason is older too
        if current == target and current not in TERMINAL and move.reason and exp.reason != move.reason:
            exp.reason = move.reason
        return None
    if target == State.RETRYING:
        assert move.failure_class is not None and move.backoff is not None
        attempts.begin_next(session, exp, actor=ACTOR, now=now, reason=move.reason, failure_class=move.failure_class.value, cause=move.cause,
                            exit_code=move.exit_code, backoff=move.backoff, placed_at=move.placed_at, ended_at=move.ended_at)
        return current, target
    if move.failure_class is not None:
        exp.failure_class = move.failure_class.value
    if target in (State.SUCCEEDED, State.FAILED) and exp.running_at is None and current == State.PROVISIONING:
        exp.running_at = now
    if target in TERMINAL:
        exp.exit_code = move.exit_code if move.exit_code is not None else (0 if target == State.SUCCEEDED else None)
    unseen = target in TERMINAL and exp.provisioning_at is None and exp.running_at is None and move.placed_at is not None
    transition(session, exp, target, actor=ACTOR, now=now, reason=move.reason)
    if unseen:
        _scheduler_times(session, exp, move, now)
    return current, target


def _scheduler_times(session: Session, exp: Experiment, move: Move, now: datetime) -> None:
    """A run that ended without the reconciler ever seeing it placed (it ran between two passes) held
    GPUs all the same: its GPU-hours come from the scheduler's own placement and end times, bounded
    by when it was dispatched and now (clock skew), and an event says so."""
    assert move.placed_at is not None
    floor = exp.dispatching_at or exp.created_at
    placed = min(max(move.placed_at, floor), now)
    ended = min(max(move.ended_at or now, placed), now)
    exp.provisioning_at, exp.finished_at = placed, ended
    record(session, experiment_id=exp.id, actor=ACTOR, kind="cost", now=now,
           message=f"ended before gpufleet saw it placed: GPU time from the scheduler's own timestamps, placed {placed:%Y-%m-%d %H:%M:%S}Z,"
                   f" ended {ended:%Y-%m-%d %H:%M:%S}Z")
