"""process_overdue: nothing keeps billing.

A run past its deadline (from the job's max_run_hours unless the submission asked for less,
counted from the moment it holds GPUs) is stopped on the scheduler and marked ``expired``.
A run still queued when its wrapped secret_id has expired can never log in to Vault, so it
is stopped and failed with that reason rather than left to wait for a GPU it cannot use.

The same bound applies to a run still ``provisioning`` (placed, but the task not running on
every rank: nodes scaling up, images pulling, a Secret that cannot be mounted). Pulling images
is legitimate, but the task unwraps its secret_id only once it starts, and the wrap TTL counts
from the mint at dispatch (``queued_at``), not from placement: a rank not started within the
bound fails at start with an expired token, so holding its GPUs longer only bills. The bound
is the one dispatch sized the wrap TTL with (``wrap_ttl_for_queue(default_queue_seconds(pool))``:
25 min for a scale-from-zero pool). Either bound acts only on what the scheduler said after
it passed (``reconciled_at``): a run the reconciler got no answer for may be running by now.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import and_, func, or_, select

from experiments.background.context import Context, log
from experiments.errors import ApiError
from experiments.models import Experiment
from experiments.scheduler import bound_clause
from jobs.runner import SchedulerUnavailable
from experiments.services.lifecycle import transition
from experiments.states import State
from jobs.vault_mint import SCALE_FROM_ZERO_QUEUE_SECONDS, WARM_POOL_QUEUE_SECONDS, default_queue_seconds
from vault_policies.orchestrator import wrap_ttl_for_queue

ACTOR = "reaper"


def _queue_bound_seconds(ctx: Context, exp: Experiment) -> int:
    """The wrap TTL dispatch used: from the pool the experiment was admitted on (its frozen spec)."""
    try:
        return wrap_ttl_for_queue(default_queue_seconds(ctx.catalog.frozen(exp.job, exp.job_spec, exp.job_spec_sha256).pool))
    except ApiError:
        return wrap_ttl_for_queue(SCALE_FROM_ZERO_QUEUE_SECONDS)


def process_overdue(ctx: Context) -> int:
    now = ctx.clock()
    query = select(Experiment).where(or_(
        and_(Experiment.state.in_([State.PROVISIONING.value, State.RUNNING.value]), Experiment.deadline_at < now),
        # Not started: only those dispatched longer ago than the shortest wrap TTL dispatch uses.
        and_(Experiment.state.in_([State.QUEUED.value, State.PROVISIONING.value]),
             func.coalesce(Experiment.queued_at, Experiment.created_at) < now - timedelta(seconds=wrap_ttl_for_queue(WARM_POOL_QUEUE_SECONDS))),
    ))
    if (bound := bound_clause(ctx.runner, Experiment.cluster, Experiment.scheduler)) is not None:
        query = query.where(bound)  # another cluster's runs: this runner cannot stop them (the reconciler notes why)
    with ctx.sessions() as session:
        if (mine := ctx.share(session, Experiment.id)) is not None:
            query = query.where(mine)  # several workers: this one's buckets (background.membership)
        overdue = session.scalars(query).all()
    stopped = 0
    ttls: dict[tuple[str, str | None], int] = {}  # per admitted job document, once per pass
    for exp in overdue:
        if exp.state in (State.QUEUED.value, State.PROVISIONING.value) and not (exp.deadline_at is not None and exp.deadline_at < now):
            key = (exp.job, exp.job_spec_sha256)
            if key not in ttls:
                ttls[key] = _queue_bound_seconds(ctx, exp)
            ttl = timedelta(seconds=ttls[key])
            minted = exp.queued_at or exp.dispatching_at or exp.created_at
            if now - minted < ttl or exp.reconciled_at is None or exp.reconciled_at - minted < ttl:
                continue  # within the bound, or not seen by the scheduler since it passed
            where = "queued" if exp.state == State.QUEUED.value else "placed but not started on every rank"
            target, reason = State.FAILED, (f"{where} {int(ttl.total_seconds()) // 60} min after dispatch, the lifetime of its wrapped secret_id: it could not "
                                            "log in to Vault if it started now; stopped, submit again when the pool has capacity")
        else:
            target, reason = State.EXPIRED, f"deadline of {exp.deadline_hours:g}h passed at {exp.deadline_at:%Y-%m-%d %H:%M:%S}Z; stopped on the scheduler"
        try:
            if exp.run_id:
                ctx.runner.stop(exp.run_id)
        except SchedulerUnavailable as exc:
            log.warning("could not stop overdue experiment %s yet: %s", exp.id, exc)
            continue
        with ctx.sessions() as session, session.begin():
            fresh = session.get(Experiment, exp.id, with_for_update=True, populate_existing=True)
            assert fresh is not None
            if fresh.state == exp.state:
                transition(session, fresh, target, actor=ACTOR, now=ctx.clock(), reason=reason)
                stopped += 1
        log.info("experiment %s %s: %s", exp.id, target.value, reason)
    return stopped
