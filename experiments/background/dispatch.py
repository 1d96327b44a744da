"""process_outbox: hand accepted experiments to the scheduler, exactly once.

1. claim: one conditional UPDATE takes the outbox row's lease (any number of dispatchers,
   on SQLite or PostgreSQL, get each row once per lease) and moves pending -> dispatching;
2. call ``runner.submit`` with the experiment id as the idempotency key (it mints the
   wrapped secret_id and dispatches);
3. record: the run id, the outbox row deleted and dispatching -> queued, in one transaction.

A crash between 2 and 3 leaves the row; once its lease lapses the next pass submits again
with the same key and the scheduler answers with the run it already has. A scheduler error
(503, timeout, Vault unreachable) releases the row with a backoff; past
``dispatch_stuck_seconds`` the experiment fails with the last error instead of waiting forever.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import or_, select, update

from clusters.errors import UserError
from experiments.background.context import Context, log
from experiments.errors import ApiError
from experiments.models import Experiment, Outbox
from jobs.runner import SchedulerUnavailable
from experiments.services.lifecycle import record, transition
from experiments.states import TERMINAL, State

ACTOR = "dispatcher"
MAX_BACKOFF_SECONDS = 60


def process_outbox(ctx: Context, *, batch: int = 50) -> int:
    """One pass; returns how many experiments were handed to the scheduler."""
    now = ctx.clock()
    with ctx.sessions() as session:
        ids = session.scalars(
            select(Outbox.experiment_id)
            .where(Outbox.next_attempt_at <= now, or_(Outbox.lease_until.is_(None), Outbox.lease_until < now))
            .order_by(Outbox.created_at)
            .limit(batch)
        ).all()
    return sum(1 for experiment_id in ids if dispatch_one(ctx, experiment_id))


def _claim(ctx: Context, experiment_id: str) -> Experiment | None:
    now = ctx.clock()
    with ctx.sessions() as session, session.begin():
        claimed = session.execute(
            update(Outbox)
            .where(Outbox.experiment_id == experiment_id, Outbox.next_attempt_at <= now, or_(Outbox.lease_until.is_(None), Outbox.lease_until < now))
            .values(lease_until=now + timedelta(seconds=ctx.timing.dispatch_lease_seconds), attempts=Outbox.attempts + 1)
        ).rowcount
        if claimed != 1:
            return None
        exp = session.get(Experiment, experiment_id)
        assert exp is not None
        if exp.state == State.PENDING.value:
            transition(session, exp, State.DISPATCHING, actor=ACTOR, now=now)
        return exp


def dispatch_one(ctx: Context, experiment_id: str) -> bool:
    exp = _claim(ctx, experiment_id)
    if exp is None:
        return False
    try:
        spec = ctx.catalog.job(exp.job)
    except ApiError as exc:
        _give_up(ctx, experiment_id, f"job file no longer passes the checks: {exc.error}")
        return False
    try:
        run_id = ctx.runner.submit(spec, exp.meta, idempotency_key=exp.id)
    except (SchedulerUnavailable, UserError) as exc:
        _retry_later(ctx, experiment_id, str(exc))
        return False
    except Exception as exc:  # noqa: BLE001 - an unforeseen error must still count toward the stuck bound
        log.exception("dispatch of experiment %s raised", experiment_id)
        _retry_later(ctx, experiment_id, f"unexpected {type(exc).__name__} (details in the service log)")
        return False
    now = ctx.clock()
    with ctx.sessions() as session, session.begin():
        exp = session.get(Experiment, experiment_id)
        assert exp is not None
        exp.run_id = run_id
        outbox = session.get(Outbox, experiment_id)
        if outbox is not None:
            session.delete(outbox)
        if exp.state == State.DISPATCHING.value:
            transition(session, exp, State.QUEUED, actor=ACTOR, now=now, reason=f"dispatched to {exp.scheduler} as {run_id}")
        orphan = State(exp.state) in TERMINAL
        latency = (now - exp.created_at).total_seconds()
    if orphan:
        # Ended (failed as stuck, or cancelled) while this submit was in flight: nothing may run for it.
        ctx.runner.stop(run_id)
        log.warning("experiment %s ended while its dispatch was in flight; stopped run %s", experiment_id, run_id)
        return False
    ctx.metrics.dispatch_latency.observe(latency)
    log.info("dispatched experiment %s as %s", experiment_id, run_id)
    return True


def _retry_later(ctx: Context, experiment_id: str, error: str) -> None:
    ctx.metrics.dispatch_errors.inc()
    now = ctx.clock()
    with ctx.sessions() as session, session.begin():
        outbox = session.get(Outbox, experiment_id)
        exp = session.get(Experiment, experiment_id)
        assert outbox is not None and exp is not None
        waited = (now - exp.created_at).total_seconds()
        if waited >= ctx.timing.dispatch_stuck_seconds:
            session.delete(outbox)
            transition(session, exp, State.FAILED, actor=ACTOR, now=now,
                       reason=f"not dispatched within {ctx.timing.dispatch_stuck_seconds}s after {outbox.attempts} attempts; last error: {error}")
            log.warning("experiment %s failed: dispatch stuck for %.0fs", experiment_id, waited)
            return
        backoff = min(MAX_BACKOFF_SECONDS, 2 ** min(outbox.attempts, 6))
        outbox.lease_until = None
        outbox.next_attempt_at = now + timedelta(seconds=backoff)
        outbox.last_error = error
        exp.reason = f"dispatch attempt {outbox.attempts} failed, retrying in {backoff}s: {error}"
        exp.updated_at = now
        record(session, experiment_id=exp.id, actor=ACTOR, kind="dispatch-error", message=exp.reason, now=now)
    log.warning("dispatch of experiment %s failed (attempt will be retried): %s", experiment_id, error)


def _give_up(ctx: Context, experiment_id: str, reason: str) -> None:
    now = ctx.clock()
    with ctx.sessions() as session, session.begin():
        exp = session.get(Experiment, experiment_id)
        outbox = session.get(Outbox, experiment_id)
        assert exp is not None
        if outbox is not None:
            session.delete(outbox)
        transition(session, exp, State.FAILED, actor=ACTOR, now=now, reason=reason)
