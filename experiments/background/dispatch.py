"""process_outbox: hand accepted experiments to the scheduler, exactly once.

1. claim: the oldest due rows (as many as the worker has free dispatch threads), locked ``FOR
   UPDATE SKIP LOCKED`` (PostgreSQL; SQLite's write lock serializes the claim), each get this
   worker's id, a lease and the next attempt number (the fencing token) and move pending ->
   dispatching, in one transaction. A row is due when unclaimed, past its lease, or held by a
   worker dead to the others (``background.membership``): a crashed worker's claims are taken
   over within seconds, a live worker's only after the lease;
2. call ``runner.submit`` with the experiment id as the idempotency key (it mints the
   wrapped secret_id and dispatches), each claimed row on its own thread;
3. record: the run id, the outbox row deleted and dispatching -> queued, in one transaction,
   only while the claim is still this worker's (same claimant and attempt); a worker whose claim
   was taken over during its submit leaves the record to the new holder.

A crash between 2 and 3 leaves the row; once its claim is due again the next holder submits
with the same key and the scheduler answers with the run it already has (Nomad's dispatch
idempotency token, the Kubernetes Job named from the key). Nomad checks the token against its
state before it commits a new child, so two submits of one key must never be in flight at once:
a takeover waits until the holder is dead to the others, and a worker whose own heartbeat may have
lapsed submits nothing and gives its claims back (``Context.fenced``).

A retried experiment (``retrying``, experiments.attempts) comes through here again as its next
attempt: the claim moves it to dispatching, the previous attempt's run is stopped first (the
whole gang), and the submit uses the attempt's own key (``attempts.attempt_key``), so it mints new
secret_ids and makes a new scheduler run exactly once, whatever crashes in between. A scheduler error
(503, timeout, Vault unreachable) releases the row with a backoff; past
``dispatch_stuck_seconds`` the experiment fails with the last error instead of waiting forever.

Nothing is left billing when a dispatch ends without a run id (stuck, cancelled while
retrying, its job file gone, or ended while a submit was in flight): once any submit may have
reached the scheduler, the outbox row stays as a *stop debt*. Each pass asks the scheduler for
the run that key made (``runner.find``) and stops it; only then is the row deleted. A debt the
scheduler cannot settle yet is retried with backoff and shown in the experiment's reason.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import or_, select

from clusters.errors import UserError
from experiments.attempts import attempt_key
from experiments.deadline import run_seconds_left
from experiments.background.context import Context, log
from experiments.background.membership import dead_workers
from experiments.row_locks import lock_in_id_order
from experiments.db import single_statement_session
from experiments.errors import ApiError
from experiments.models import Experiment, Outbox, RunAttempt, WorkerBeat
from jobs.runner import NomadRunner, SchedulerUnavailable
from jobs.spec import EXPERIMENT_META, RUN_DEADLINE_META
from experiments.services.lifecycle import record, transition
from experiments.states import TERMINAL, State

ACTOR = "dispatcher"
MAX_BACKOFF_SECONDS = 60


@dataclass(frozen=True)
class Claim:
    """A claimed outbox row and its fencing token: the claimant and the attempt number it set.
    Only the holder of the current token records a run id or a retry for the row."""

    experiment_id: str
    worker: str
    attempt: int
    exp: Experiment

    def holds(self, outbox: Outbox | None) -> bool:
        return outbox is not None and outbox.claimed_by == self.worker and outbox.attempts == self.attempt


def process_outbox(ctx: Context, *, batch: int = 200, stopping: Callable[[], bool] = lambda: False) -> int:
    """One pass: claim due rows a few at a time (``FOR UPDATE SKIP LOCKED`` on PostgreSQL, so several
    workers each take different rows without waiting on each other) and dispatch them on up to
    ``Timing.dispatch_concurrency`` threads, claiming more as threads free up, until nothing is due
    or ``batch`` rows were taken; returns how many experiments were handed to the scheduler.

    Why threads: a dispatch is mostly waiting (the claim's commit, Vault minting the secret_id,
    the scheduler's answer, the record's commit), so one thread left the worker's core idle most of
    a burst and a second worker had little to add. Each claimed row is still dispatched by exactly
    one thread with its own fencing token, and no two threads hold one row (each claim locks and
    leases distinct rows), so no key is ever in flight twice from here.

    Why claims run ahead of the threads: claiming a row for each thread as it freed up made a claim
    transaction of one or two rows per freed thread (a third of a dispatch's CPU in the worker, and as
    much again in PostgreSQL, went to claims). A pass keeps up to half the width again claimed and
    waiting for a thread, and claims only when at least half the width is free to claim, so each claim
    takes several rows and no thread waits for one. A claim waiting for its thread is checked like any
    other before its submit (the fence, then ``_still_held``), and a dead worker's waiting claims pass
    on with its others.

    Once ``stopping`` says so (the worker was asked to stop: SIGTERM on ``serve --worker-only``) the pass
    claims nothing more and returns when the rows it holds are dispatched. It used to claim on to the end of
    the burst (up to ``batch`` rows): against a slow scheduler that outlasted the worker's 30 s join, so the
    process exited with dispatches in flight and its heartbeat row left to go stale, and the rows it had not
    reached waited for it instead of going to the live workers at once."""
    if not _anything_due(ctx):
        return 0
    width = max(1, ctx.timing.dispatch_concurrency)
    ahead = width + width // 2  # claimed rows a pass holds: on the threads, and waiting for one
    step = max(1, width // 2)  # the fewest rows a claim asks for while some are still in flight
    seen: set[str] = set()  # each row at most once a pass: a debt released for "now" waits for the next pass
    dispatched = 0
    more = True
    with ThreadPoolExecutor(max_workers=width, thread_name_prefix="gpufleet-dispatch") as pool:
        running: set[Future[bool]] = set()
        while True:
            room = min(ahead - len(running), batch - len(seen))
            if more and room > 0 and (room >= step or not running) and not ctx.fenced() and not stopping():
                try:
                    claims = _claim(ctx, None, skip=seen, limit=room)
                    # Fewer rows than asked is not the end of the burst: another worker's claim may have held the rest
                    # for a moment (SKIP LOCKED), and stopping here drained this pass's threads before the next pass
                    # claimed again. Only a claim that finds nothing ends this pass's claiming.
                    more = bool(claims)
                except Exception:  # noqa: BLE001 - the dispatches in flight still finish and report; the next pass claims again
                    log.exception("claiming outbox rows failed")
                    claims, more = [], False
                seen.update(c.experiment_id for c in claims)
                running.update(pool.submit(_dispatch_claimed, ctx, claim) for claim in claims)
            if not running:
                return dispatched
            finished, running = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                try:
                    dispatched += bool(future.result())
                except Exception:  # noqa: BLE001 - one row's bad dispatch must not hide the others' results; its lease brings it back
                    log.exception("a dispatch raised")


def _anything_due(ctx: Context) -> bool:
    """Whether some outbox row of this worker's clusters is due: one statement, no transaction (PostgreSQL;
    ``db.single_statement_session``). The idle dispatch loop asks this every ``Timing.dispatch_poll_seconds``
    instead of running a claim pass (a transaction, the dead-worker subquery over ``pg_locks``, a thread
    pool): about a quarter of the CPU, so it can look five times as often for what a pass every 0.5 s
    cost. A row a worker with a fresh heartbeat holds under a running lease is not due: counted, it made
    an idle worker run ten claim passes a second that found nothing for as long as another worker had a
    dispatch in flight (up to the lease of a stuck call). The check is a superset of what a claim takes,
    so it never hides a claimable row: every worker ``membership.dead_workers`` lists has a heartbeat
    older than the shorter of its two bounds, which is all this asks (no ``pg_locks``)."""
    from experiments.scheduler import bound_clause

    now = ctx.clock()
    silent = select(WorkerBeat.id).where(
        WorkerBeat.heartbeat_at < now - timedelta(seconds=min(ctx.timing.worker_ttl_seconds, ctx.timing.worker_lost_seconds)))
    query = (select(Outbox.experiment_id).where(Outbox.next_attempt_at <= now)
             .where(or_(Outbox.lease_until.is_(None), Outbox.lease_until < now, Outbox.claimed_by.in_(silent))).limit(1))
    bound = bound_clause(ctx.runner, Experiment.cluster, Experiment.scheduler)
    if bound is not None:
        query = query.join(Experiment, Experiment.id == Outbox.experiment_id).where(bound)
    with single_statement_session(ctx.sessions()) as session:
        return session.execute(query).first() is not None


def _claim(ctx: Context, experiment_id: str | None, *, skip: Collection[str] = (), limit: int = 1) -> list[Claim]:
    """Claim ``experiment_id``'s row, or up to ``limit`` of the oldest due ones, in one transaction: a
    row is due when not leased, leased past its lease, or held by a worker dead to the others
    (taken over, with an event saying so)."""
    from experiments.scheduler import bound_clause

    now = ctx.clock()
    me = ctx.membership.worker_id
    query = (select(Outbox).where(Outbox.next_attempt_at <= now)
             .order_by(Outbox.created_at).limit(limit).with_for_update(skip_locked=True, of=Outbox)
             .execution_options(populate_existing=True))
    if experiment_id is not None:
        query = query.where(Outbox.experiment_id == experiment_id)
    if skip:
        query = query.where(Outbox.experiment_id.not_in(skip))
    bound = bound_clause(ctx.runner, Experiment.cluster, Experiment.scheduler)
    if bound is not None:
        # Services bound to different clusters may share one database: each takes only its own
        # clusters' rows, so none fails another's dispatch as stuck.
        query = query.join(Experiment, Experiment.id == Outbox.experiment_id).where(bound)
    claims: list[Claim] = []
    with ctx.sessions() as session, session.begin():
        dead = dead_workers(session, now, ttl_seconds=ctx.timing.worker_ttl_seconds, lost_seconds=ctx.timing.worker_lost_seconds)
        rows = session.scalars(query.where(or_(Outbox.lease_until.is_(None), Outbox.lease_until < now, Outbox.claimed_by.in_(dead)))).all()
        if not rows:
            return claims
        # The experiments locked in id order, as the reconciler locks them (experiments.row_locks): no two transactions wait in a cycle.
        experiments = lock_in_id_order(session, [o.experiment_id for o in rows])
        for outbox in rows:
            taken_from = outbox.claimed_by if outbox.lease_until is not None and outbox.lease_until >= now else None
            outbox.lease_until = now + timedelta(seconds=ctx.timing.dispatch_lease_seconds)
            outbox.attempts += 1
            outbox.claimed_by = me
            exp = experiments[outbox.experiment_id]
            if taken_from is not None:
                record(session, experiment_id=exp.id, actor=ACTOR, kind="takeover", now=now,
                       message=f"dispatch claim taken over from worker {taken_from}, dead to the others: its heartbeat is older than"
                               f" {ctx.timing.worker_ttl_seconds:g}s, or older than {ctx.timing.worker_lost_seconds:g}s with its advisory lock released (its process exited)")
                log.warning("experiment %s: dispatch claim taken over from dead worker %s", exp.id, taken_from)
            if exp.state in (State.PENDING.value, State.RETRYING.value):
                transition(session, exp, State.DISPATCHING, actor=ACTOR, now=now)
            claims.append(Claim(exp.id, me, outbox.attempts, exp))
    return claims


def dispatch_one(ctx: Context, experiment_id: str) -> bool:
    claims = _claim(ctx, experiment_id)
    return bool(claims) and _dispatch_claimed(ctx, claims[0])


def _dispatch_claimed(ctx: Context, claim: Claim) -> bool:
    experiment_id, exp = claim.experiment_id, claim.exp
    if State(exp.state) in TERMINAL:
        settle_stop_debt(ctx, experiment_id)
        return False
    if exp.cancel_requested_at is not None:
        # Cancelled while a dispatch was being retried: never submit again. A retried attempt's previous
        # run is stopped as a stop debt (settle_stop_debt), so a stop the scheduler refuses now does not
        # hold the cancel (and the tenant's quota) back.
        _end(ctx, claim, State.CANCELLED, "cancelled before its dispatch completed", previous_run=exp.attempt > 1)
        return False
    if exp.attempt > 1 and not _stop_previous(ctx, claim):
        return False
    try:
        spec = ctx.catalog.frozen(exp.job, exp.job_spec, exp.job_spec_sha256)  # as admitted, never as edited since
    except ApiError as exc:
        _end(ctx, claim, State.FAILED, f"job no longer passes the checks: {exc.error}")
        return False
    seconds = run_seconds_left(exp, ctx.clock())
    if seconds < 1:
        # A retry whose experiment deadline is spent: admission priced no more GPU time than that.
        _end(ctx, claim, State.EXPIRED, f"deadline of {exp.deadline_hours:g}h spent by earlier attempts; attempt {exp.attempt} not dispatched")
        return False
    if ctx.fenced():
        _give_back(ctx, claim)  # the others may be taking this claim over: only one of us may call the scheduler
        return False
    if not _still_held(ctx, claim):
        # Taken over while this worker was frozen past the TTL (its heartbeat, beating again since, no longer
        # fences it): the new holder submits; a second submit of the key now could make a second child.
        log.warning("experiment %s: dispatch claim taken over before this worker submitted; the new holder dispatches", experiment_id)
        return False
    try:
        # The experiment id in the run's meta names its checkpoint directory (GPUFLEET_CHECKPOINT_URI) on every attempt;
        # the attempt's own key makes a new scheduler run (and new secret_ids) once per attempt. The seconds left of the
        # experiment's deadline bound the run on the scheduler itself (experiments.deadline), not only through the reaper.
        meta = {**exp.meta, EXPERIMENT_META: exp.id, RUN_DEADLINE_META: str(seconds)}
        key = attempt_key(exp.id, exp.attempt)
        run_id = (ctx.runner.find(spec, key) if _resumable(exp, claim) else None) or ctx.runner.submit(spec, meta, idempotency_key=key, attempt=exp.attempt)
    except (SchedulerUnavailable, UserError) as exc:
        _retry_later(ctx, claim, str(exc))
        return False
    except Exception as exc:  # noqa: BLE001 - an unforeseen error must still count toward the stuck bound
        log.exception("dispatch of experiment %s raised", experiment_id)
        _retry_later(ctx, claim, f"unexpected {type(exc).__name__} (details in the service log)")
        return False
    now = ctx.clock()
    with ctx.sessions() as session, session.begin():
        outbox = session.get(Outbox, experiment_id, with_for_update=True, populate_existing=True)
        exp = session.get(Experiment, experiment_id, with_for_update=True, populate_existing=True)
        assert exp is not None
        orphan = State(exp.state) in TERMINAL
        if not orphan and not claim.holds(outbox):
            # Taken over while this submit was in flight: the new holder submits with the same key,
            # gets this same run from the scheduler and records it; recording here too would race it.
            log.warning("experiment %s: dispatch claim taken over while submitting; the new holder records run %s", experiment_id, run_id)
            return False
        exp.run_id = run_id
        if outbox is not None and not orphan:
            session.delete(outbox)
        if exp.state == State.DISPATCHING.value:
            transition(session, exp, State.QUEUED, actor=ACTOR, now=now, reason=f"dispatched to {exp.scheduler} as {run_id}"
                       + (f" (attempt {exp.attempt})" if exp.attempt > 1 else ""))
        latency = (now - exp.created_at).total_seconds()
    if orphan:
        # Ended (failed as stuck, or cancelled) while this submit was in flight: nothing may run
        # for it. The row stays until the stop succeeds (a debt a failed stop leaves for later passes).
        settle_stop_debt(ctx, experiment_id)
        log.warning("experiment %s ended while its dispatch was in flight; its run %s is being stopped", experiment_id, run_id)
        return False
    ctx.metrics.dispatch_latency.observe(latency)
    log.info("dispatched experiment %s as %s", experiment_id, run_id)
    return True


def _still_held(ctx: Context, claim: Claim) -> bool:
    """Whether the claim is still this worker's, read just before its submit: one statement on its own
    (``db.single_statement_session``), as fresh as the transaction it replaced, without its BEGIN and ROLLBACK."""
    with single_statement_session(ctx.sessions()) as session:
        return claim.holds(session.get(Outbox, claim.experiment_id, populate_existing=True))


def _resumable(exp: Experiment, claim: Claim) -> bool:
    """Whether a run an earlier claim of this attempt made is recorded as it is instead of submitted again.
    A row claimed before (its holder died, or lost the scheduler's answer) may have reached Nomad, whose
    dispatch is one call carrying the wrapped secret_ids: a child it made has them all, and a second submit
    would mint secret_ids the idempotent answer then drops (live, and of no use to anyone). A Kubernetes Job
    is made before its Secret: its submit completes a half-made run and mints only a missing Secret
    (``jobs.k8s.client.dispatch``), so it is always submitted again."""
    return claim.attempt > 1 and exp.scheduler == NomadRunner.scheduler


def _give_back(ctx: Context, claim: Claim) -> None:
    """A claim this worker did not submit (fenced meanwhile): due again at once, for whoever claims
    next, instead of held until its lease ends. Only while the claim is still ours; its attempt was
    counted, so a later cancel keeps it as a stop debt (the safe side)."""
    with ctx.sessions() as session, session.begin():
        outbox = session.get(Outbox, claim.experiment_id, with_for_update=True, populate_existing=True)
        if outbox is not None and claim.holds(outbox):
            outbox.lease_until, outbox.claimed_by, outbox.next_attempt_at = None, None, ctx.clock()


def _retry_later(ctx: Context, claim: Claim, error: str) -> None:
    experiment_id = claim.experiment_id
    ctx.metrics.dispatch_errors.inc()
    now = ctx.clock()
    with ctx.sessions() as session, session.begin():
        outbox = session.get(Outbox, experiment_id, with_for_update=True, populate_existing=True)
        exp = session.get(Experiment, experiment_id, with_for_update=True, populate_existing=True)
        assert exp is not None
        if outbox is None or not claim.holds(outbox):
            return  # taken over meanwhile: the new holder decides

        waited = (now - outbox.created_at).total_seconds()  # this attempt's row: a retry's clock starts when it is due
        if waited >= ctx.timing.dispatch_stuck_seconds:
            # Any of the attempts may have reached the scheduler (an answer lost): keep the row as a stop debt.
            _keep_as_debt(outbox, now, error)
            transition(session, exp, State.FAILED, actor=ACTOR, now=now,
                       reason=f"not dispatched within {ctx.timing.dispatch_stuck_seconds}s after {outbox.attempts} attempts; last error: {error}")
            log.warning("experiment %s failed: dispatch stuck for %.0fs", experiment_id, waited)
            return
        backoff = _release(outbox, now, error)
        exp.reason = f"dispatch attempt {outbox.attempts} failed, retrying in {backoff}s: {error}"
        exp.updated_at = now
        record(session, experiment_id=exp.id, actor=ACTOR, kind="dispatch-error", message=exp.reason, now=now)
    log.warning("dispatch of experiment %s failed (attempt will be retried): %s", experiment_id, error)


def _stop_previous(ctx: Context, claim: Claim) -> bool:
    """Before attempt N is submitted, whatever is left of attempt N-1 on the scheduler is stopped (all
    of its ranks: a multi-node run restarts as a whole gang). Stopping a stopped run is a no-op, so a
    re-claimed row repeats it safely; any error releases the row for a later pass (and counts toward
    the stuck bound, so a stop that never succeeds ends the run failed, with the stop as a debt)."""
    exp = claim.exp
    with ctx.sessions() as session:
        previous = session.get(RunAttempt, (exp.id, exp.attempt - 1))
        run_id = previous.run_id if previous is not None else None
    if run_id is None:
        return True
    try:
        ctx.runner.stop(run_id)
    except SchedulerUnavailable as exc:
        _retry_later(ctx, claim, f"attempt {exp.attempt - 1}'s run {run_id} is not confirmed stopped: {exc}")
        return False
    except Exception as exc:  # noqa: BLE001 - an unforeseen error must still count toward the stuck bound
        log.exception("stop of experiment %s's previous attempt raised", exp.id)
        _retry_later(ctx, claim, f"attempt {exp.attempt - 1}'s run {run_id}: unexpected {type(exc).__name__} (details in the service log)")
        return False
    return True


def _release(outbox: Outbox, now: datetime, error: str, *, backoff: int | None = None) -> int:
    """Give the row back for a later pass, after ``backoff`` seconds (default: exponential in its
    attempts, capped); returns the wait."""
    wait = min(MAX_BACKOFF_SECONDS, 2 ** min(outbox.attempts, 6)) if backoff is None else backoff
    outbox.lease_until = None
    outbox.claimed_by = None
    outbox.next_attempt_at = now + timedelta(seconds=wait)
    outbox.last_error = error
    return wait


def _keep_as_debt(outbox: Outbox, now: datetime, error: str) -> None:
    _release(outbox, now, f"stop debt: {error}", backoff=0)


def _end(ctx: Context, claim: Claim, state: State, reason: str, *, previous_run: bool = False) -> None:
    """End an experiment that has no run id. The claim counted this pass as an attempt, so
    ``attempts > 1`` means an earlier submit ran and may have reached the scheduler: the row
    stays as a stop debt and is settled at once; otherwise it is deleted. ``previous_run``: a
    retried attempt, whose previous attempt's run is not confirmed stopped either: a debt too."""
    experiment_id, now = claim.experiment_id, ctx.clock()
    with ctx.sessions() as session, session.begin():
        outbox = session.get(Outbox, experiment_id, with_for_update=True, populate_existing=True)
        exp = session.get(Experiment, experiment_id, with_for_update=True, populate_existing=True)
        assert exp is not None
        if not claim.holds(outbox):
            return  # taken over meanwhile: the new holder decides
        debt = outbox is not None and (outbox.attempts > 1 or previous_run)
        if outbox is not None:
            if debt:
                _keep_as_debt(outbox, now, reason)
            else:
                session.delete(outbox)
        transition(session, exp, state, actor=ACTOR, now=now, reason=reason)
    if debt:
        settle_stop_debt(ctx, experiment_id)


def settle_stop_debt(ctx: Context, experiment_id: str) -> bool:
    """Stop whatever an ended experiment's submits left on the scheduler, then drop its outbox
    row. Returns True when settled; a scheduler error keeps the row for a later pass."""
    now = ctx.clock()
    with ctx.sessions() as session:
        exp = session.get(Experiment, experiment_id)
        assert exp is not None
        run_id, job, tenant, document, digest, attempt = exp.run_id, exp.job, exp.tenant, exp.job_spec, exp.job_spec_sha256, exp.attempt
    previous_run: str | None = None
    if attempt > 1 and run_id is not None:
        with ctx.sessions() as session:
            previous = session.get(RunAttempt, (experiment_id, attempt - 1))
        if previous is not None and previous.run_id == run_id:
            # The previous attempt's run: stopped again (its stop may never have been confirmed, e.g. the
            # retry failed as stuck on that very stop; a no-op otherwise), then this attempt's is looked for.
            previous_run, run_id = run_id, None
    try:
        if previous_run is not None:
            ctx.runner.stop(previous_run)
        if run_id is None:
            run_id = ctx.runner.find(ctx.catalog.frozen(job, document, digest), attempt_key(experiment_id, attempt))
        if run_id is not None:
            ctx.runner.stop(run_id)
    except Exception as exc:  # noqa: BLE001 - a debt is never dropped: any failure keeps it for a later pass
        if isinstance(exc, (SchedulerUnavailable, ApiError)):
            error = exc.error if isinstance(exc, ApiError) else str(exc)
        else:
            log.exception("settling the stop debt of experiment %s raised", experiment_id)
            error = f"unexpected {type(exc).__name__} (details in the service log)"
        ctx.metrics.dispatch_errors.inc()
        with ctx.sessions() as session, session.begin():
            outbox = session.get(Outbox, experiment_id)
            if outbox is not None:
                backoff = _release(outbox, now, f"stop debt: {error}")
                record(session, experiment_id=experiment_id, actor=ACTOR, kind="dispatch-error",
                       message=f"a run its dispatch may have left on the scheduler is not confirmed stopped; retrying in {backoff}s: {error}", now=now)
        log.warning("stop debt of experiment %s (tenant %s) not settled yet: %s", experiment_id, tenant, error)
        return False
    with ctx.sessions() as session, session.begin():
        outbox = session.get(Outbox, experiment_id)
        if outbox is not None:
            session.delete(outbox)
        exp = session.get(Experiment, experiment_id)
        assert exp is not None
        if run_id is not None and exp.run_id is None:
            exp.run_id = run_id
        message = f"stopped {run_id}, left on the scheduler by a dispatch that did not complete" if run_id else "no run reached the scheduler"
        if previous_run is not None:
            message = f"stopped the previous attempt's run {previous_run}; {message}"
        record(session, experiment_id=experiment_id, actor=ACTOR, kind="stop", message=message, now=now)
    return True
