"""Issue 28 hardening: the early takeover of a silent worker's claims (``Timing.worker_lost_seconds``)
is keyed on its session-level advisory lock, which fails safe (real PostgreSQL, the Nomad API double).

pg_locks shows a two-int4 advisory key as classid = key 1, objid = key 2, objsubid = 2 (PostgreSQL
docs, view pg_locks; src/backend/utils/adt/lockfuncs.c, SET_LOCKTAG_INT32): what the tests read.
"""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy import literal, select, text, update

from experiments.background.dispatch import _claim, _dispatch_claimed, process_outbox
from experiments.background.membership import LOCK_CLASS, lock_held
from experiments.db import database_url
from experiments.models import Outbox, WorkerBeat
from tests.experiments.test_scale_out import TIMING, _lock_released, _submit, _worker

pytestmark = pytest.mark.usefixtures("still_fence")  # workers beaten by hand (_worker) age only when a test says so


def _holders(svc, worker_id: str) -> list[int]:
    """The backend pids of the sessions holding ``worker_id``'s advisory lock in this database."""
    with svc.ctx.sessions() as session:
        return list(session.scalars(text(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " AND classid = CAST(:class AS int4)::oid AND objid = hashtext(:worker)::oid AND objsubid = 2 AND granted"),
            {"class": LOCK_CLASS, "worker": worker_id}))


def test_a_worker_holds_its_lock_on_a_connection_of_its_own_and_the_server_lists_it(make_service, pg_url, nomad_runner):
    svc = make_service(database_url(pg_url), nomad_runner)
    a = _worker(svc, svc.clock)
    [pid] = _holders(svc, a.membership.worker_id)
    with svc.ctx.sessions() as session:
        assert session.scalar(text("SELECT pg_backend_pid()")) != pid  # not a pooled session
    a.membership.leave(a.sessions)
    _lock_released(svc, a.membership.worker_id)  # the lock goes with the connection, as its backend exits
    assert _holders(svc, a.membership.worker_id) == []


def test_the_others_read_a_lock_on_a_key_of_either_sign(make_service, pg_url, nomad_runner):
    """hashtext is an int4 of either sign; pg_locks shows a negative key as its bits read as an oid
    (lockfuncs.c puts the int4 into the lock tag's uint32 field): ``lock_held`` must match both."""
    svc = make_service(database_url(pg_url), nomad_runner)
    names = {}
    with svc.ctx.sessions() as session:
        for i in range(64):
            names.setdefault(session.scalar(text("SELECT hashtext(:n) < 0"), {"n": f"w{i}"}), f"w{i}")
    assert set(names) == {True, False}
    with psycopg.connect(pg_url, autocommit=True) as other:
        for name in names.values():
            with svc.ctx.sessions() as session:
                assert not session.scalar(select(lock_held(literal(name))))
            other.execute("SELECT pg_advisory_lock_shared(%s, hashtext(%s))", (LOCK_CLASS, name))
            with svc.ctx.sessions() as session:
                assert session.scalar(select(lock_held(literal(name))))


def test_a_silent_worker_whose_lock_a_pooler_keeps_is_taken_over_only_after_the_ttl(make_service, pg_url, nomad_runner):
    """Behind a transaction-mode pooler a live worker's application_name is on no server session between
    its transactions, and the lock it took stays on a server connection it no longer talks to. Its
    heartbeat stalls (a submit may be in flight): the others must wait for the TTL, not the 2 s bound.
    Simulated: the worker's id carries a process tag no session has, and its lock is held on a connection
    the worker does not use (its own is closed)."""
    svc = make_service(database_url(pg_url), nomad_runner)
    exp = _submit(svc.ctx, 1)
    pooled, other = _worker(svc, svc.clock), _worker(svc, svc.clock)
    [claim] = _claim(pooled, exp.id)
    hidden = "0" * 12 + pooled.membership.worker_id[12:]
    with svc.ctx.sessions() as session, session.begin():
        session.execute(update(WorkerBeat).where(WorkerBeat.id == pooled.membership.worker_id).values(id=hidden))
        session.execute(update(Outbox).where(Outbox.experiment_id == exp.id).values(claimed_by=hidden))
    pooled.membership.release()
    with psycopg.connect(pg_url, autocommit=True) as server_connection:
        server_connection.execute("SELECT pg_advisory_lock_shared(%s, hashtext(%s))", (LOCK_CLASS, hidden))
        svc.clock.advance(seconds=TIMING.worker_lost_seconds + 0.5)
        other.membership.beat(other.sessions, svc.clock())
        assert _claim(other, None) == []  # stale past the short bound, but its lock is held: it may be mid-submit
        svc.clock.advance(seconds=TIMING.worker_ttl_seconds)
        other.membership.beat(other.sessions, svc.clock())
        [taken] = _claim(other, None)
    assert taken.experiment_id == exp.id and taken.attempt == claim.attempt + 1


def test_a_worker_whose_lock_connection_is_terminated_fences_itself_until_it_holds_the_lock_again(make_service, pg_url, nomad, nomad_runner):
    """pg_terminate_backend of the lock's connection: at its next heartbeat the worker sees the socket
    closed and takes the lock again on a new connection. While it cannot (here another session holds the
    key exclusively), it is fenced: it submits nothing and gives its claim back at once."""
    svc = make_service(database_url(pg_url), nomad_runner)
    exp = _submit(svc.ctx, 1)
    a = _worker(svc, svc.clock)
    [claim] = _claim(a, exp.id)
    [pid] = _holders(svc, a.membership.worker_id)
    with psycopg.connect(pg_url, autocommit=True) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s, 30000)", (pid,)).fetchone() == (True,)  # waits for the backend's exit
        assert _holders(svc, a.membership.worker_id) == []
        admin.execute("SELECT pg_advisory_lock(%s, hashtext(%s))", (LOCK_CLASS, a.membership.worker_id))
        assert not a.fenced()  # it cannot know before its next heartbeat
        a.membership.beat(a.sessions, svc.clock())
        assert a.fenced()
        assert not _dispatch_claimed(a, claim) and not nomad.calls("POST", "dispatch")
        with svc.ctx.sessions() as session:
            assert session.get(Outbox, exp.id).claimed_by is None  # given back, not held for the lease
        assert process_outbox(a) == 0
        admin.execute("SELECT pg_advisory_unlock(%s, hashtext(%s))", (LOCK_CLASS, a.membership.worker_id))
    a.membership.beat(a.sessions, svc.clock())
    assert not a.fenced()
    [new_pid] = _holders(svc, a.membership.worker_id)
    assert new_pid != pid
    assert process_outbox(a) == 1 and len(nomad.calls("POST", "dispatch")) == 1


def test_a_worker_whose_lock_is_gone_from_pg_locks_fences_itself_for_a_beat_and_takes_it_again(make_service, pg_url, nomad_runner):
    """A lock can go while the worker's connection stays open (a pooler closing the server connection
    it was taken on): the heartbeat's check of pg_locks, what the others read, fences the worker; the
    next beat takes the lock again on a new connection."""
    svc = make_service(database_url(pg_url), nomad_runner)
    _submit(svc.ctx, 1)
    a = _worker(svc, svc.clock)
    a.membership._holder.execute(text("SELECT pg_advisory_unlock_all()"))
    a.membership.beat(a.sessions, svc.clock())
    assert a.fenced() and process_outbox(a) == 0
    a.membership.beat(a.sessions, svc.clock())
    assert not a.fenced() and len(_holders(svc, a.membership.worker_id)) == 1
    with svc.ctx.sessions() as session:
        assert session.scalar(select(Outbox.experiment_id)) is not None
    assert process_outbox(a) == 1
