"""Submit, read and cancel experiments: the logic behind the routers.

Submit on PostgreSQL, for a tenant without a money budget, is one autocommit statement
(``services.one_statement``): the tenant's ``pool_usage`` row for the pool incremented only if
the quota still holds, and the experiment, its outbox row and its event inserted only if it was.
Anything else (SQLite, a budgeted tenant, a refusal, a repeated Idempotency-Key, a key's first
counter row) is one transaction: the idempotency lookup (the unique index on tenant and key), the
experiment row, its outbox row and its event, then the counter incremented (one ``UPDATE ...
RETURNING``, which locks the row until the commit on PostgreSQL; SQLite: the write lock BEGIN
IMMEDIATE took) and the quota checked against what it held before. Checking and adding under that
one row's lock is what makes 50 clients racing for the last GPUs of a quota admit exactly as many
as fit; the locked step reads and writes one row, however many runs are live.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session

from clusters.schema import ClusterConfig
from experiments.auth import Caller
from experiments.errors import ApiError
from experiments.models import Event, Experiment, Outbox, RunAttempt
from experiments.services import admission, budgets, cost, one_statement, pool_usage
from experiments.services.catalog import Catalog
from experiments.services.lifecycle import record, transition
from experiments.states import NON_TERMINAL, TERMINAL, State
from jobs.loader import document_sha256
from jobs.spec import FinetuneSpec
from jobs.quota import check_tenant_quota

MAX_PAGE = 500
DEADLOCK = "40P01"  # PostgreSQL's SQLSTATE deadlock_detected (errcodes.txt)


def request_hash(job: str, meta: dict[str, str], deadline_hours: float | None) -> str:
    canonical = json.dumps({"job": job, "meta": meta, "deadline_hours": deadline_hours}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _existing(session: Session, tenant: str, key: str | None, digest: str) -> Experiment | None:
    if key is None:
        return None
    found = session.scalar(select(Experiment).where(Experiment.tenant == tenant, Experiment.idempotency_key == key))
    if found is not None and found.request_hash != digest:
        raise ApiError(409, f"Idempotency-Key {key!r} was used for a different request (experiment {found.id})", field="Idempotency-Key",
                       fix="send the same body again to get that experiment, or use a new key for a new experiment")
    return found


def gpus_in_use(session: Session, tenant: str, cluster: str, pool: str) -> int:
    """The sum over live experiments (what ``pool_usage`` counts; tests and repairs compare the two)."""
    total = session.scalar(select(func.coalesce(func.sum(Experiment.gpus), 0)).where(
        Experiment.tenant == tenant, Experiment.cluster == cluster, Experiment.pool == pool, Experiment.state.in_([s.value for s in NON_TERMINAL])))
    return int(total or 0)


def _adhoc(catalog: Catalog, caller: Caller, job_file: str) -> tuple[FinetuneSpec, dict[str, Any]]:
    """An ad-hoc job file, admitted only for a tenant whose cluster file says ``adhoc_jobs: true``. A
    tenant allowed in no cluster is refused before its file is parsed; then the tenant and cluster the
    file names must be one that allows it (an admin's token too: the flag is the tenant's policy)."""
    if caller.tenant is not None and not catalog.adhoc_allowed(caller.tenant):
        raise ApiError(403, f"tenant {caller.tenant} may not submit ad-hoc job files", field="job_file",
                       fix=f"submit a job of jobs/ by name, or ask the platform team to set adhoc_jobs: true on tenant {caller.tenant} in its cluster file")
    spec, document = catalog.admit_text(job_file)
    if caller.may_see(spec.namespace) and not catalog.adhoc_allowed(spec.namespace, spec.cluster):
        raise ApiError(403, f"tenant {spec.namespace} may not submit ad-hoc job files to cluster {spec.cluster}", field="job_file",
                       fix=f"submit a job of jobs/ by name, or ask the platform team to set adhoc_jobs: true on tenant {spec.namespace} in {spec.cluster}'s cluster file")
    return spec, document


def submit(session: Session, catalog: Catalog, caller: Caller, *, job: str | None, meta: dict[str, str], deadline_hours: float | None,
           idempotency_key: str | None, scheduler: str, now: datetime, clusters: Mapping[str, str] | None = None,
           job_file: str | None = None) -> tuple[Experiment, bool]:
    """Returns (experiment, created). Commits. ``job`` names a file of jobs/; ``job_file`` is instead an
    ad-hoc job file's text (exactly one of them is given)."""
    if idempotency_key is not None and not idempotency_key.strip():
        raise ApiError(422, "Idempotency-Key is empty", field="Idempotency-Key", fix="send a key of your own (for example the CI build id), or no header")
    admission.refuse_credential("job", job)
    admission.refuse_credential("Idempotency-Key", idempotency_key)
    if job_file is not None:
        spec, document = _adhoc(catalog, caller, job_file)
        named = f"job_file:{document_sha256(document)}"  # the same file sent again is the same request
    else:
        spec, document = catalog.admit(job or "")
        named = job or ""
    field = "job" if job_file is None else "job_file"
    if not caller.may_see(spec.namespace):
        raise ApiError(403, f"job {spec.name} belongs to tenant {spec.namespace}, not {caller.tenant}", field=field,
                       fix=f"submit a job of tenant {caller.tenant}, or use a token of tenant {spec.namespace}")
    scheduler = admission.scheduler_for(spec, scheduler, clusters)
    checked = admission.checked_meta(spec, dict(meta))
    hours = admission.checked_deadline(spec, deadline_hours)
    digest = request_hash(named, checked, deadline_hours)
    tenant_spec = catalog.tenant(spec.cluster, spec.namespace)
    if tenant_spec is None:  # loader cross-checks guarantee it; a changed cluster file must not crash the API
        raise ApiError(422, f"tenant {spec.namespace} is not in cluster {spec.cluster}", field="job", fix="run gpufleet check")
    prices = cost.load_prices()
    kind = cost.price_kind(spec.pool)
    price = prices.price(spec.pool.accelerator, kind, catalog.region(spec.cluster))
    budget = budgets.budgets_of(catalog.configs).get((spec.cluster, spec.namespace))
    gpus = admission.gpus_of(spec)
    row = {"id": str(uuid.uuid4()), "tenant": spec.namespace, "job": spec.name, "cluster": spec.cluster, "pool": spec.pool.name, "gpus": gpus,
           "meta": checked, "state": State.PENDING.value, "scheduler": scheduler, "submitted_by": caller.subject, "idempotency_key": idempotency_key,
           "request_hash": digest, "job_spec": document, "job_spec_sha256": document_sha256(document), "deadline_hours": hours,
           "price_per_gpu_hour": price, "price_kind": kind, "attempt": 1, "prior_gpu_hours": 0.0, "created_at": now, "updated_at": now}
    message = (f"submitted {'ad-hoc job file' if job_file is not None else 'job'} {spec.name} ({admission.gpus_text(spec)} on"
               f" {spec.cluster}/{spec.pool.name} via {scheduler}, deadline {hours:g}h)")
    if budget is None and _one_statement(session):
        quota = dict(tenant_spec.gpu_quota).get(spec.pool.name, 0)
        event = {"at": now, "actor": caller.subject, "kind": "request", "from_state": None, "to_state": State.PENDING.value, "message": message, "attempt": 1}
        try:
            with session.get_bind().connect() as connection:
                if one_statement.admit(connection.execution_options(isolation_level="AUTOCOMMIT"), experiment=row, event=event, quota=quota,
                                       outbox={"created_at": now, "attempts": 0, "next_attempt_at": now}):
                    return Experiment(**row), True
        except IntegrityError:
            pass  # the key is taken: the transaction below answers with its experiment
        except OperationalError as exc:
            if getattr(exc.orig, "sqlstate", None) != DEADLOCK:
                raise
            # It held the counter row and waited on a concurrent transaction's uncommitted insert of the same
            # key, which waited on the row: PostgreSQL undid this statement. That transaction decides the key.
        # Nothing was written. Refused, a repeated key, or the key's first counter row: the transaction
        # below decides each with the reads and locks it always had, and writes nothing twice.

    def in_transaction() -> tuple[Experiment, bool]:
        try:
            with session.begin():
                if budget is not None:
                    # Before the pool's counter row, always in this order. The budget's standing sums the tenant's live
                    # runs, so it is checked before this experiment is inserted (it would count itself).
                    budgets.lock(session, spec.cluster, spec.namespace)
                found = _existing(session, spec.namespace, idempotency_key, digest)
                if found is not None:
                    return found, False
                budgets.check_or_409(session, budget, gpus=gpus, deadline_hours=hours, price_per_gpu_hour=price, now=now)
                exp = Experiment(**row)
                session.add(exp)
                session.flush()  # no relationship() orders the inserts: the experiment row first, for its outbox and event rows
                session.add(Outbox(experiment_id=exp.id, created_at=now, attempts=0, next_attempt_at=now))
                record(session, experiment_id=exp.id, actor=caller.subject, kind="request", message=message, now=now, to_state=State.PENDING.value)
                session.flush()  # the inserts before the lock: the locked step is only the counter, the check and the commit
                in_use = pool_usage.take(session, cluster=spec.cluster, tenant=spec.namespace, pool=spec.pool.name, gpus=gpus, now=now)
                decision = check_tenant_quota(tenant_spec, pool=spec.pool.name, requested_gpus=gpus, in_use_gpus=in_use)
                admission.quota_or_409(decision)  # a refusal rolls back the experiment and the counter's increment
            return exp, True
        except IntegrityError:
            # A concurrent retry with the same key won the insert: answer with its experiment.
            session.rollback()
            with session.begin():
                found = _existing(session, spec.namespace, idempotency_key, digest)
            if found is None:
                raise
            return found, False

    try:
        return in_transaction()
    except OperationalError as exc:
        if getattr(exc.orig, "sqlstate", None) != DEADLOCK:
            raise
    # A one statement of the same key held the counter row while waiting on this transaction's insert of
    # the key, and PostgreSQL undid this transaction: nothing of it stays; once more, it finds that experiment.
    return in_transaction()


def waits_on_a_budget_lock(session: Session, catalog: Catalog, caller: Caller, job: str | None) -> bool:
    """On PostgreSQL, whether this submit takes the transactional path behind its tenant's budget lock
    (``budgets.lock``: a tenant with a money budget), where it waits, not computes, while the tenant's
    other submits commit. The route runs those on anyio's default pool, not on the few admission threads
    (docs/submit-path.md, "Threads"): a budgeted tenant's burst queued on its lock held back every other
    tenant's submit. SQLite: False (every submit queues on BEGIN IMMEDIATE, on its 40 admission threads).
    ``job`` None is an ad-hoc file, whose tenant is known only once parsed: the caller's own tenant decides
    (an admin's may be any). A job that ``submit`` refuses is False: it is refused before any lock."""
    if not _one_statement(session):
        return False
    budgeted = budgets.budgets_of(catalog.configs)
    if job is None:
        return caller.tenant is None or any(tenant == caller.tenant for _, tenant in budgeted)
    try:
        spec = catalog.job(job)
    except ApiError:
        return False
    return (spec.cluster, spec.namespace) in budgeted


def _one_statement(session: Session) -> bool:
    """PostgreSQL admits a tenant without a money budget in one statement (``services.one_statement``).
    SQLite has no data-modifying CTEs, and its writers already serialize on BEGIN IMMEDIATE; a money
    budget sums the tenant's live runs under its lock, which one statement cannot keep."""
    return session.get_bind().dialect.name == "postgresql"


MIN_PREFIX = 6
SHORT_ID = 8  # what `exp list` and the dashboard print
_PREFIX = re.compile(r"^[0-9a-f-]+$")


def get_visible(session: Session, caller: Caller, experiment_id: str) -> Experiment:
    """The experiment with this id, or with this unique id prefix (at least MIN_PREFIX characters,
    as git, docker and nomad take), among the caller's own (an admin's: all). Another tenant's
    experiment is indistinguishable from a missing one, also as a candidate of a prefix."""
    exp = session.get(Experiment, experiment_id)
    if exp is not None and caller.may_see(exp.tenant):
        return exp
    missing = ApiError(404, f"no experiment {experiment_id!r}", field="id", fix="list yours with GET /api/v1/experiments (gpufleet exp list)")
    prefix = experiment_id.lower()
    if exp is not None or not _PREFIX.match(prefix):
        raise missing
    if len(prefix) < MIN_PREFIX:
        raise ApiError(404, f"no experiment {experiment_id!r} (an id prefix needs at least {MIN_PREFIX} characters)", field="id",
                       fix=f"give at least {MIN_PREFIX} characters of the id, as `gpufleet exp list` prints it")
    query = select(Experiment).where(Experiment.id.startswith(prefix, autoescape=True))
    if not caller.admin:
        query = query.where(Experiment.tenant == caller.tenant)
    found = session.execute(query.order_by(Experiment.created_at).limit(11)).scalars().all()
    if not found:
        raise missing
    if len(found) > 1:
        names = ", ".join(f"{e.id[:SHORT_ID + 4]} ({e.job}, {e.state})" for e in found[:10]) + (", ..." if len(found) > 10 else "")
        raise ApiError(409, f"id prefix {experiment_id!r} matches {len(found) if len(found) <= 10 else 'more than 10'} experiments: {names}",
                       field="id", fix="give more characters of the id")
    return found[0]


def list_visible(session: Session, caller: Caller, *, state: str | None, tenant: str | None, job: str | None, limit: int, offset: int) -> tuple[Sequence[Experiment], int]:
    query = select(Experiment)
    if not caller.admin:
        if tenant is not None and tenant != caller.tenant:
            raise ApiError(403, f"tenant {tenant} is not yours", field="tenant", fix=f"filter by your tenant {caller.tenant} or drop the filter")
        query = query.where(Experiment.tenant == caller.tenant)
    if tenant is not None:
        query = query.where(Experiment.tenant == tenant)
    if state is not None:
        query = query.where(Experiment.state == state)
    if job is not None:
        query = query.where(Experiment.job == job)
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    rows = session.scalars(query.order_by(Experiment.created_at.desc(), Experiment.id).limit(limit).offset(offset)).all()
    return rows, int(total)


def events_of(session: Session, exp: Experiment) -> Sequence[Event]:
    return session.scalars(select(Event).where(Event.experiment_id == exp.id).order_by(Event.id)).all()


def cancel(session: Session, caller: Caller, experiment_id: str, *, now: datetime) -> Experiment:
    """Pending (never handed to the scheduler): cancelled at once. Later: the stop is recorded
    here and carried out by the reconciler, which stops the run on the scheduler first.

    A cancel of a run whose stop is already requested changes nothing, so it writes nothing:
    the event log holds requests that changed something, and a caller repeating the same cancel
    cannot grow it without bound (issue 22). The row is locked so two concurrent cancels record one.
    """
    with session.begin():
        exp = get_visible(session, caller, experiment_id)
        # The outbox row before the experiment's, the order every dispatcher takes them in (no deadlock).
        outbox = session.get(Outbox, exp.id, with_for_update=True, populate_existing=True)
        session.refresh(exp, with_for_update=True)
        if State(exp.state) in TERMINAL:
            raise ApiError(409, f"experiment {exp.id} is already {exp.state}", field="id", fix="nothing to cancel; submit a new experiment to run it again")
        if exp.cancel_requested_at is not None:
            return exp
        record(session, experiment_id=exp.id, actor=caller.subject, kind="request", message="cancel requested", now=now)
        if exp.state == State.PENDING.value and outbox is not None and outbox.attempts == 0 and outbox.lease_until is None:
            session.delete(outbox)
            transition(session, exp, State.CANCELLED, actor=caller.subject, now=now, reason=f"cancelled by {caller.subject} before dispatch")
        else:
            exp.cancel_requested_at = now
            exp.updated_at = now
            if exp.state == State.RETRYING.value and outbox is not None and outbox.lease_until is None:
                outbox.next_attempt_at = min(outbox.next_attempt_at, now)  # the dispatcher ends it now, not after the backoff
    return exp


def view(exp: Experiment, *, now: datetime) -> dict[str, Any]:
    """One experiment as the API shows it. GPU-hours and cost are over every attempt: the ended ones
    (``prior_gpu_hours``) plus the current one's."""
    placed = exp.provisioning_at or exp.running_at
    hours = cost.gpu_hours(gpus=exp.gpus, placed_at=placed, finished_at=exp.finished_at, now=now) + (exp.prior_gpu_hours or 0.0)
    stamp = lambda t: t.isoformat(timespec="seconds") + "Z" if t else None  # noqa: E731
    return {
        "id": exp.id, "status": exp.state, "reason": exp.reason, "exit_code": exp.exit_code,
        "attempt": exp.attempt or 1, "failure_class": exp.failure_class,
        "tenant": exp.tenant, "job": exp.job, "cluster": exp.cluster, "pool": exp.pool, "gpus": exp.gpus, "meta": exp.meta,
        "scheduler": exp.scheduler, "run_id": exp.run_id, "scheduler_ids": {"run": exp.run_id, **(exp.scheduler_refs or {})} if exp.run_id else {},
        "submitted_by": exp.submitted_by,
        "deadline_hours": exp.deadline_hours, "deadline_at": stamp(exp.deadline_at), "cancel_requested": exp.cancel_requested_at is not None,
        "timestamps": {"pending": stamp(exp.created_at), "dispatching": stamp(exp.dispatching_at), "queued": stamp(exp.queued_at),
                       "provisioning": stamp(exp.provisioning_at), "running": stamp(exp.running_at), "finished": stamp(exp.finished_at)},
        "gpu_hours": round(hours, 4), "price_per_gpu_hour": exp.price_per_gpu_hour, "price_kind": exp.price_kind,
        "estimated_cost_usd": round(hours * exp.price_per_gpu_hour, 4),
    }


def event_view(event: Event) -> dict[str, Any]:
    return {"id": event.id, "at": event.at.isoformat(timespec="seconds") + "Z", "actor": event.actor, "kind": event.kind,
            "attempt": event.attempt, "from": event.from_state, "to": event.to_state, "message": event.message}


def attempts_of(session: Session, exp: Experiment, *, now: datetime) -> list[dict[str, Any]]:
    """Every attempt of the experiment, oldest first: the ended ones (RunAttempt rows) and the current one."""
    stamp = lambda t: t.isoformat(timespec="seconds") + "Z" if t else None  # noqa: E731
    ended = session.scalars(select(RunAttempt).where(RunAttempt.experiment_id == exp.id).order_by(RunAttempt.attempt)).all()
    out = [{"attempt": a.attempt, "status": a.state, "run_id": a.run_id, "failure_class": a.failure_class, "cause": a.cause, "reason": a.reason,
            "exit_code": a.exit_code, "dispatched": stamp(a.dispatched_at), "placed": stamp(a.placed_at), "finished": stamp(a.finished_at),
            "gpu_hours": round(a.gpu_hours, 4)} for a in ended]
    placed = exp.provisioning_at or exp.running_at
    current = exp.state if exp.state != State.RETRYING.value else State.PENDING.value  # waiting out its backoff
    # Until its submit is recorded, the row still holds the previous attempt's run id: not this attempt's run.
    previous_run = ended[-1].run_id if ended else None
    run_id = exp.run_id if exp.dispatching_at and exp.run_id != previous_run else None
    out.append({"attempt": exp.attempt or 1, "status": current, "run_id": run_id,
                "failure_class": exp.failure_class if exp.state == State.FAILED.value else None, "cause": None,
                "reason": exp.reason, "exit_code": exp.exit_code, "dispatched": stamp(exp.dispatching_at), "placed": stamp(placed),
                "finished": stamp(exp.finished_at),
                "gpu_hours": round(cost.gpu_hours(gpus=exp.gpus, placed_at=placed, finished_at=exp.finished_at, now=now), 4)})
    return out


def totals(items: list[dict[str, Any]]) -> dict[str, float]:
    return {"gpu_hours": round(sum(i["gpu_hours"] for i in items), 4), "estimated_cost_usd": round(sum(i["estimated_cost_usd"] for i in items), 4)}


def cost_totals(session: Session, caller: Caller, *, now: datetime, configs: tuple[ClusterConfig, ...]) -> dict[str, Any]:
    # An ended attempt's GPU time counts too when the current one was never placed (retrying, or cancelled then).
    query = select(Experiment).where(Experiment.provisioning_at.is_not(None) | Experiment.running_at.is_not(None) | (Experiment.prior_gpu_hours > 0))
    if not caller.admin:
        query = query.where(Experiment.tenant == caller.tenant)
    by_tenant: dict[str, dict[str, float]] = {}
    by_job: dict[str, dict[str, float]] = {}
    for exp in session.scalars(query):
        item = view(exp, now=now)
        for bucket, key in ((by_tenant, exp.tenant), (by_job, f"{exp.tenant}/{exp.job}")):
            row = bucket.setdefault(key, {"gpu_hours": 0.0, "estimated_cost_usd": 0.0})
            row["gpu_hours"] = round(row["gpu_hours"] + item["gpu_hours"], 4)
            row["estimated_cost_usd"] = round(row["estimated_cost_usd"] + item["estimated_cost_usd"], 4)
    prices = cost.load_prices()
    return {"by_tenant": dict(sorted(by_tenant.items())), "by_job": dict(sorted(by_job.items())),
            "budgets": budget_views(session, caller, configs, now=now),
            "price_source": prices.source, "price_date": prices.date, "currency": prices.currency}


def budget_views(session: Session, caller: Caller, configs: tuple[ClusterConfig, ...], *, now: datetime) -> list[dict[str, Any]]:
    """Budget, spent, committed and left of each visible tenant that has a budget, this month."""
    return [budgets.standing(session, b, now=now).view() for (_, tenant), b in sorted(budgets.budgets_of(configs).items()) if caller.may_see(tenant)]
