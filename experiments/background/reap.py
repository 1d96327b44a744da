"""process_overdue: nothing keeps billing.

A run past its deadline (from the job's max_run_hours unless the submission asked for less,
counted from the moment it holds GPUs) is stopped on the scheduler and marked ``expired``.
A run still queued when its wrapped secret_id has expired can never log in to Vault, so it
is stopped and failed with that reason rather than left to wait for a GPU it cannot use.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import and_, or_, select

from experiments.background.context import Context, log
from experiments.errors import ApiError
from experiments.models import Experiment
from jobs.runner import SchedulerUnavailable
from experiments.services.lifecycle import transition
from experiments.states import State
from jobs.vault_mint import SCALE_FROM_ZERO_QUEUE_SECONDS, default_queue_seconds
from vault_policies.orchestrator import wrap_ttl_for_queue

ACTOR = "reaper"


def _queue_bound_seconds(ctx: Context, job: str) -> int:
    try:
        return wrap_ttl_for_queue(default_queue_seconds(ctx.catalog.job(job).pool))
    except ApiError:
        return wrap_ttl_for_queue(SCALE_FROM_ZERO_QUEUE_SECONDS)


def process_overdue(ctx: Context) -> int:
    now = ctx.clock()
    with ctx.sessions() as session:
        overdue = session.scalars(select(Experiment).where(or_(
            and_(Experiment.state.in_([State.PROVISIONING.value, State.RUNNING.value]), Experiment.deadline_at < now),
            Experiment.state == State.QUEUED.value,
        ))).all()
    stopped = 0
    for exp in overdue:
        if exp.state == State.QUEUED.value:
            bound = _queue_bound_seconds(ctx, exp.job)
            if exp.queued_at is None or now - exp.queued_at < timedelta(seconds=bound):
                continue
            target, reason = State.FAILED, f"queued for more than {bound // 60} min, the lifetime of its wrapped secret_id: it could not log in to Vault if placed now; stopped, submit again when the pool has capacity"
        else:
            target, reason = State.EXPIRED, f"deadline of {exp.deadline_hours:g}h passed at {exp.deadline_at:%Y-%m-%d %H:%M:%S}Z; stopped on the scheduler"
        try:
            if exp.run_id:
                ctx.runner.stop(exp.run_id)
        except SchedulerUnavailable as exc:
            log.warning("could not stop overdue experiment %s yet: %s", exp.id, exc)
            continue
        with ctx.sessions() as session, session.begin():
            fresh = session.get(Experiment, exp.id)
            assert fresh is not None
            if fresh.state == exp.state:
                transition(session, fresh, target, actor=ACTOR, now=ctx.clock(), reason=reason)
                stopped += 1
        log.info("experiment %s %s: %s", exp.id, target.value, reason)
    return stopped
