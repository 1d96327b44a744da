"""process_scheduled: follow each run the scheduler holds into the experiment's own states,
and carry out requested cancels (stop on the scheduler first, then ``cancelled``).

Scheduler phase -> experiment state: pending and not placed -> queued (the reason says why,
e.g. the placement failure); pending and placed -> provisioning; running -> running;
succeeded / failed -> the same, with the exit code and the scheduler's reason (OOM,
preemption, the task's last event); stopped by someone else -> failed; placed once and back
in the queue (Kueue eviction) -> stopped and failed, since its spent secret_id cannot resume. Once an experiment
is terminal it is never asked about again, so Nomad's garbage collection loses nothing.
"""

from __future__ import annotations

from sqlalchemy import select

from experiments.background.context import Context, log
from experiments.models import Experiment
from jobs.runner import Phase, RunNotFound, RunReport, SchedulerUnavailable
from experiments.services.lifecycle import transition
from experiments.states import ON_SCHEDULER, TERMINAL, State, can_move

ACTOR = "reconciler"


def process_scheduled(ctx: Context) -> int:
    """One pass over the experiments on the scheduler, least recently reconciled first."""
    with ctx.sessions() as session:
        ids = session.scalars(
            select(Experiment.id)
            .where(Experiment.state.in_([s.value for s in ON_SCHEDULER]))
            .order_by(Experiment.reconciled_at.is_not(None), Experiment.reconciled_at)
            .limit(ctx.timing.reconcile_batch)
        ).all()
    done = 0
    for experiment_id in ids:
        try:
            reconcile_one(ctx, experiment_id)
            done += 1
        except SchedulerUnavailable as exc:
            log.warning("reconcile of %s deferred: %s", experiment_id, exc)
    return done


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
    with ctx.sessions() as session:
        exp = session.get(Experiment, experiment_id)
    if exp is None or State(exp.state) in TERMINAL or exp.run_id is None:
        return
    if exp.cancel_requested_at is not None:
        ctx.runner.stop(exp.run_id)
        _move(ctx, experiment_id, State.CANCELLED, "cancelled: stopped on the scheduler", exit_code=None)
        return
    try:
        report = ctx.runner.status(exp.run_id)
    except RunNotFound:
        _move(ctx, experiment_id, State.FAILED, f"the scheduler no longer knows run {exp.run_id} (garbage-collected before gpufleet saw it end)", exit_code=None)
        return
    refs = dict(report.refs)
    if report.phase == Phase.PENDING and not report.placed and exp.state in (State.PROVISIONING.value, State.RUNNING.value):
        # Placed once, now back in the queue (Kueue eviction/preemption, a lost node): its single-use
        # secret_id is spent, so a resumed run could not log in to Vault. Stop it rather than let it
        # wait for GPUs again only to fail there; the tenant's quota is freed at once.
        ctx.runner.stop(exp.run_id)
        _move(ctx, experiment_id, State.FAILED, f"lost its GPUs after it was placed ({report.detail}); stopped on the scheduler: "
              "its single-use secret_id is spent, so it cannot resume; submit it again", exit_code=None, refs=refs)
        return
    target, reason = _target(report, cancelling=False)
    _move(ctx, experiment_id, target, reason, exit_code=report.exit_code if target in TERMINAL else None, refs=refs)


def _move(ctx: Context, experiment_id: str, target: State, reason: str, *, exit_code: int | None, refs: dict[str, str] | None = None) -> None:
    now = ctx.clock()
    with ctx.sessions() as session, session.begin():
        exp = session.get(Experiment, experiment_id)
        assert exp is not None
        exp.reconciled_at = now
        if refs and {**(exp.scheduler_refs or {}), **refs} != exp.scheduler_refs:
            exp.scheduler_refs = {**(exp.scheduler_refs or {}), **refs}  # kept once the scheduler forgets the run
        current = State(exp.state)
        if current == target or not can_move(current, target):
            if current not in TERMINAL and reason and exp.reason != reason:
                exp.reason = reason  # e.g. why a queued run is not placed yet
            return
        if target in (State.SUCCEEDED, State.FAILED) and exp.running_at is None and current == State.PROVISIONING:
            exp.running_at = now
        if target in TERMINAL:
            exp.exit_code = exit_code if exit_code is not None else (0 if target == State.SUCCEEDED else None)
        transition(session, exp, target, actor=ACTOR, now=now, reason=reason)
    log.info("experiment %s: %s -> %s", experiment_id, current.value, target.value)
