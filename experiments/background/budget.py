"""process_budgets: no tenant overspends its monthly budget while its runs run.

Admission keeps the worst case of every live run inside the budget, so spend crosses it only when
the admin lowered the budget, prices or deadlines changed, or runs were admitted before the budget
existed. Once a tenant's spend this month (``services.budgets.standing``) reaches its budget, the
reaper acts on each of its runs the scheduler holds (queued, provisioning, running), as the
tenant's ``budget_policy`` says:

- ``stop`` (default): stop it on the scheduler and end it ``cancelled``, the numbers in its reason;
- ``warn``: a ``budget`` event on it, once a month, and it runs on.

Runs not yet dispatched are left to the dispatcher: they hold nothing, and the next pass stops them
once the scheduler has them. One read per budgeted tenant, at most every ``Timing.policy_seconds``.
"""

from __future__ import annotations

from sqlalchemy import select

from experiments.background.context import Context, log
from experiments.models import Event, Experiment
from experiments.scheduler import bound_clause
from experiments.services import budgets
from experiments.services.lifecycle import record, transition
from experiments.states import ON_SCHEDULER, State
from jobs.runner import SchedulerUnavailable

ACTOR = "reaper"
KIND = "budget"


def process_budgets(ctx: Context) -> int:
    """One pass over every budgeted tenant (when due); returns how many runs it stopped."""
    found = budgets.budgets_of(ctx.catalog.configs)
    now = ctx.clock()
    if not found or not ctx.policy.due(ctx.policy.budget_at, now, ctx.timing.policy_seconds):
        return 0
    ctx.policy.budget_at = now
    stopped = 0
    for budget in found.values():
        with ctx.sessions() as session:
            standing = budgets.standing(session, budget, now=now)
            if not standing.crossed:
                continue
            query = select(Experiment.id, Experiment.run_id, Experiment.state).where(
                Experiment.cluster == budget.cluster, Experiment.tenant == budget.tenant, Experiment.state.in_([s.value for s in ON_SCHEDULER]))
            if (bound := bound_clause(ctx.runner, Experiment.cluster, Experiment.scheduler)) is not None:
                query = query.where(bound)
            if (mine := ctx.share(session, Experiment.id)) is not None:
                query = query.where(mine)  # several workers: this one's buckets (background.membership), one warning per run
            live = session.execute(query.order_by(Experiment.id)).all()
            warned = set(session.scalars(select(Event.experiment_id).where(
                Event.kind == KIND, Event.at >= budgets.month_start(now), Event.experiment_id.in_([r.id for r in live])))) if live else set()
        numbers = (f"tenant {budget.tenant} on cluster {budget.cluster} spent ${standing.spent:,.2f} of its ${budget.usd_month:,.2f} budget for {standing.month}"
                   f" (committed ${standing.committed:,.2f} more by {standing.live_runs} live runs)")
        if budget.policy == "warn":
            fresh = [r.id for r in live if r.id not in warned]
            if fresh:
                with ctx.sessions() as session, session.begin():
                    for experiment_id in fresh:
                        record(session, experiment_id=experiment_id, actor=ACTOR, kind=KIND, now=now,
                               message=f"over budget: {numbers}; budget_policy warn: left running")
            continue
        for row in live:
            stopped += _stop(ctx, row.id, row.run_id, row.state, f"over budget: {numbers}; stopped by budget_policy stop")
    return stopped


def _stop(ctx: Context, experiment_id: str, run_id: str | None, state: str, reason: str) -> int:
    try:
        if run_id:
            ctx.runner.stop(run_id)
    except SchedulerUnavailable as exc:
        log.warning("could not stop over-budget experiment %s yet: %s", experiment_id, exc)
        return 0
    with ctx.sessions() as session, session.begin():
        fresh = session.get(Experiment, experiment_id, with_for_update=True, populate_existing=True)
        if fresh is None or fresh.state != state:
            return 0
        transition(session, fresh, State.CANCELLED, actor=ACTOR, now=ctx.clock(), reason=reason)
    log.info("experiment %s cancelled: %s", experiment_id, reason)
    return 1
