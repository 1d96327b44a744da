"""Which workers are alive, and which share of the runs each follows.

Every worker (``gpufleet serve`` with its worker threads, or ``gpufleet serve --worker-only``)
writes its row in ``workers`` every ``Timing.heartbeat_seconds``. A worker is dead to the others
when its heartbeat is older than ``Timing.worker_ttl_seconds``, or, on PostgreSQL, older than
``Timing.worker_lost_seconds`` while its advisory lock is held by no session:

- **The lock.** Each worker holds, for its whole life, a session-level advisory lock on the two
  int4 keys ``(LOCK_CLASS, hashtext(worker id))`` on a connection of its own (not from the pool,
  ``Membership._hold``). PostgreSQL releases a session's advisory locks when the session ends
  (docs: "Explicit Locking", advisory locks), and ``pg_locks`` shows every role every lock
  (``pg_lock_status`` has no privilege check): a two-int4 key as ``classid`` = key 1, ``objid`` =
  key 2, ``objsubid`` = 2 (docs, view ``pg_locks``; src/backend/utils/adt/lockfuncs.c,
  ``SET_LOCKTAG_INT32``, field4 = 2), in the ``database`` it was taken in (``lock_held``).
- **Why two bounds, and why fail-safe.** A process that exited (a crash, kill -9, the OOM killer)
  loses its connections the moment the kernel closes its sockets: PostgreSQL ends their backends
  and the lock is gone, so its claims pass on once it missed a few heartbeats, in seconds, instead
  of the TTL. Every doubt keeps the lock listed, which only ever falls back to the TTL: a live
  process that is silent (frozen, paused, cut off) keeps its lock connection open on the server;
  behind a transaction-mode pooler (PgBouncer) the lock stays on the server connection it was
  taken on, whatever the worker does, so the short bound never applies there; two worker ids
  whose hashes collide hold one key (the lock is *shared*, so neither waits for the other) and
  both are judged by the TTL while either lives.
- **Losing the lock.** The worker checks its lock at each heartbeat, with no extra round trip: the
  lock connection's socket (``db.server_closed``: ``pg_terminate_backend`` or a server restart
  writes a FATAL error and closes it) and, in the heartbeat's own UPDATE, whether ``pg_locks``
  lists the lock (what the others test). Lost, it is fenced (below) until a later beat took it
  again on a new connection. Between two beats it may not know yet: the heartbeat fence covers
  that (the others also need its heartbeat older than ``worker_lost_seconds``).
- **Dispatch.** A dead worker's outbox claims (``outbox.claimed_by``) are claimable at once, not
  after their lease (``Timing.dispatch_lease_seconds``, which still bounds a live worker's stuck call).
- **Reconcile and reap.** The runs are split into 256 buckets by the last two hex digits of the
  experiment id; the live workers, sorted by id, take bucket ``b`` when ``b % N`` is their
  index. A dead worker's buckets pass to the others at their next pass after its heartbeat
  goes stale; while two workers' views of the membership differ (a worker joining or leaving)
  a bucket may be followed twice for a pass, which costs reads but changes nothing twice (the
  state-guarded UPDATE, ``models.Experiment``, and the row locks the writers take).
- **One at a time.** Work that is not split by run (the orphan scan) is done by the first live
  worker by id only (``leads``).

A worker fences itself: once its own last successful heartbeat is older than either bound less
one heartbeat period (less two for the TTL; the shorter bound only on PostgreSQL, the one
database where it applies), or, on PostgreSQL, while its last beat found its lock not held, it
claims no dispatch, submits nothing and follows no bucket, because the others may already have
taken its work over. Heartbeat times come from each worker's clock: the workers' clocks must
agree to well within one heartbeat period (NTP does), the margin between a worker's own fence and
the others' takeover on the shorter bound; a clock ahead by that much leaves none.

A context no ``Worker`` registered (``worker.run_once``: tests, tools) follows every run and
its claims end only with their lease, as before.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from datetime import datetime, timedelta

from sqlalchemy import (ColumnElement, Connection, Engine, Integer, and_, cast, column, create_engine, delete, exists, false, func, literal, or_,
                        select, table, text, update)
from sqlalchemy.dialects.postgresql import OID
from sqlalchemy.orm import InstrumentedAttribute, Session, sessionmaker
from sqlalchemy.pool import NullPool

from experiments.db import APPLICATION_NAME, PROCESS_TAG, server_closed
from experiments.models import WorkerBeat

log = logging.getLogger("gpufleet.experiments")  # as background.context (which imports this module)

BUCKETS = 256
# A row this much older than the TTL is deleted; its claims' leases have long passed by then.
PRUNE_AFTER = timedelta(hours=1)
# The first key of every worker's advisory lock (an int4: "gpf" and 1), so no other user of the database's
# two-int4 advisory keys meets gpufleet's unless it picks this very number.
LOCK_CLASS = 0x67706601


def buckets_of(index: int, members: int) -> list[str]:
    """The id suffixes (two hex digits) the ``index``-th of ``members`` live workers follows."""
    return [f"{b:02x}" for b in range(BUCKETS) if b % members == index]


class Membership:
    """This worker's id, the freshness of its own heartbeat (monotonic, so a clock step cannot fake it)
    and, on PostgreSQL, the connection that holds its advisory lock."""

    def __init__(self) -> None:
        # The process tag first: an operator finds this worker's sessions in pg_stat_activity by it (experiments.db).
        self.worker_id = f"{PROCESS_TAG}-{uuid.uuid4().hex[:23]}"
        self.registered = False
        self.early_takeover = False  # whether the others can take over early (PostgreSQL: lock_held)
        self._last_beat: float | None = None
        self._locked = False  # whether the last beat found this worker's advisory lock held (fenced otherwise)
        self._holder: Connection | None = None
        self._holder_engine: Engine | None = None
        self._lock = threading.Lock()

    def beat(self, sessions: sessionmaker[Session], now: datetime) -> None:
        """Write this worker's heartbeat (creating its row first); prune long-dead rows; on PostgreSQL take
        the advisory lock again if its connection was lost, and read whether ``pg_locks`` lists it in the
        heartbeat's UPDATE. Its freshness counts from before the write, as ``heartbeat_at`` does for the
        others: a commit that waited must not make this worker think itself fresher than they see it (``fenced``)."""
        started = time.monotonic()
        with sessions() as session, session.begin():
            early = sessions_listed(session)
            held = early and self._hold(session.get_bind())
            beat = update(WorkerBeat).where(WorkerBeat.id == self.worker_id).values(heartbeat_at=now)
            if early:
                listed = session.execute(beat.returning(lock_held(literal(self.worker_id)))).scalar()
                if listed is None:
                    session.add(WorkerBeat(id=self.worker_id, host=socket.gethostname()[:255], pid=os.getpid(), started_at=now, heartbeat_at=now))
                    listed = session.scalar(select(lock_held(literal(self.worker_id))))
                held = held and bool(listed)
            elif not session.execute(beat).rowcount:
                session.add(WorkerBeat(id=self.worker_id, host=socket.gethostname()[:255], pid=os.getpid(), started_at=now, heartbeat_at=now))
            # Long-dead rows, but not one another worker's beat holds right now (it is refreshing it): two workers
            # back after an outage longer than PRUNE_AFTER each deleted the other's row while holding their own.
            dead = select(WorkerBeat.id).where(WorkerBeat.heartbeat_at < now - PRUNE_AFTER).with_for_update(skip_locked=True)
            session.execute(delete(WorkerBeat).where(WorkerBeat.id.in_(dead.scalar_subquery())))
        with self._lock:
            if early and not held and self._locked:
                log.warning("worker %s lost its advisory lock: fenced until it holds it again", self.worker_id)
            self.early_takeover = early
            self._locked = held
            self._last_beat = started
            self.registered = True

    def _hold(self, bind: Engine | Connection) -> bool:
        """Whether this worker holds its advisory lock on its own connection, taking it on a new one when
        the last was lost (closed by the server, or its lock no longer listed at the last beat). The
        connection is not from the pool: the pool would hand it to other work and recycle it. The lock is
        shared so that a worker id whose hash another's shares still gets it (both then count by the TTL)."""
        if self._holder is not None and (not self._locked or server_closed(self._holder.connection.dbapi_connection)):
            self.release()
        if self._holder is not None:
            return True
        try:
            if self._holder_engine is None:
                self._holder_engine = create_engine(bind.engine.url, poolclass=NullPool, isolation_level="AUTOCOMMIT",
                                                    connect_args={"application_name": APPLICATION_NAME})
            holder = self._holder_engine.connect()
        except Exception:  # noqa: BLE001 - fenced until a later beat connects; the heartbeat itself still counts
            log.exception("worker %s could not open the connection for its advisory lock", self.worker_id)
            return False
        try:
            taken = holder.scalar(text("SELECT pg_try_advisory_lock_shared(CAST(:class AS int4), hashtext(:worker))"),
                                  {"class": LOCK_CLASS, "worker": self.worker_id})
        except Exception:  # noqa: BLE001 - as above
            log.exception("worker %s could not take its advisory lock", self.worker_id)
            taken = False
        if not taken:
            holder.close()
            return False
        self._holder = holder
        return True

    def release(self) -> None:
        """Close the lock's connection (the server releases the lock with its session)."""
        holder, self._holder = self._holder, None
        if holder is not None:
            try:
                holder.close()
            except Exception:  # noqa: BLE001 - already broken: its session is gone, and the lock with it
                log.debug("closing the advisory lock's connection failed", exc_info=True)

    def leave(self, sessions: sessionmaker[Session]) -> None:
        """A clean stop: the row goes, so the others re-split the runs at their next pass; the lock goes with it."""
        try:
            with sessions() as session, session.begin():
                session.execute(delete(WorkerBeat).where(WorkerBeat.id == self.worker_id))
        finally:
            self.release()

    def fenced(self, *, ttl_seconds: float, heartbeat_seconds: float, lost_seconds: float) -> bool:
        """True when the others may consider this worker dead: it must not act. Where they can take over
        early (PostgreSQL) the shorter bound counts, and so does a lost advisory lock; elsewhere (SQLite)
        only the TTL passes its work on."""
        if not self.registered:
            return False
        with self._lock:
            last, early, locked = self._last_beat, self.early_takeover, self._locked
        if early and not locked:
            return True
        bound = ttl_seconds - 2 * heartbeat_seconds
        if early:
            bound = min(bound, lost_seconds - heartbeat_seconds)
        return last is None or time.monotonic() - last > bound


_LOCKS = table("pg_locks", column("locktype"), column("database"), column("classid"), column("objid"), column("objsubid"), column("granted"))
_DATABASES = table("pg_database", column("oid"), column("datname"))


def sessions_listed(session: Session) -> bool:
    """Whether the database lists every session's locks (PostgreSQL's pg_locks), which the early
    takeover of an exited process's claims needs."""
    return session.get_bind().dialect.name == "postgresql"


def lock_held(worker_id: ColumnElement[str]) -> ColumnElement[bool]:
    """Whether some session of this database holds the advisory lock of ``worker_id`` (module docstring:
    a two-int4 key shows as classid = key 1, objid = key 2, objsubid = 2; an int4 key below zero shows
    as its bits read as an oid, which the cast of ``hashtext`` to oid reproduces)."""
    here = select(_DATABASES.c.oid).where(_DATABASES.c.datname == func.current_database()).scalar_subquery()
    return exists().where(_LOCKS.c.locktype == "advisory", _LOCKS.c.database == here, _LOCKS.c.classid == cast(cast(literal(LOCK_CLASS), Integer), OID),
                          _LOCKS.c.objid == cast(func.hashtext(worker_id), OID), _LOCKS.c.objsubid == 2, _LOCKS.c.granted)


def dead_workers(session: Session, now: datetime, *, ttl_seconds: float, lost_seconds: float):  # type: ignore[no-untyped-def]
    """The ids of workers dead to the others (a subquery for claims): heartbeat older than the TTL,
    or, on PostgreSQL, older than ``lost_seconds`` with its advisory lock held by no session."""
    stale = WorkerBeat.heartbeat_at < now - timedelta(seconds=ttl_seconds)
    if sessions_listed(session):
        stale = or_(stale, and_(WorkerBeat.heartbeat_at < now - timedelta(seconds=lost_seconds), ~lock_held(WorkerBeat.id)))
    return select(WorkerBeat.id).where(stale)


def live_workers(session: Session, now: datetime, *, ttl_seconds: float, lost_seconds: float) -> list[str]:
    dead = dead_workers(session, now, ttl_seconds=ttl_seconds, lost_seconds=lost_seconds)
    return list(session.scalars(select(WorkerBeat.id).where(WorkerBeat.id.not_in(dead)).order_by(WorkerBeat.id)))


def leads(membership: Membership, session: Session, *, now: datetime, ttl_seconds: float, heartbeat_seconds: float, lost_seconds: float) -> bool:
    """Whether this worker does this pass's work that is not split by run: an unregistered context
    always, a fenced one never, else the first live worker by id (while a worker joins or leaves, two
    may lead for one pass)."""
    if not membership.registered:
        return True
    if membership.fenced(ttl_seconds=ttl_seconds, heartbeat_seconds=heartbeat_seconds, lost_seconds=lost_seconds):
        return False
    live = live_workers(session, now, ttl_seconds=ttl_seconds, lost_seconds=lost_seconds)
    return bool(live) and live[0] == membership.worker_id


def share(membership: Membership, session: Session, experiment_id: InstrumentedAttribute[str], *, now: datetime, ttl_seconds: float,
          heartbeat_seconds: float, lost_seconds: float) -> ColumnElement[bool] | None:
    """The filter on experiment ids this worker follows this pass: None (all) for an unregistered
    context, nothing when fenced or not among the live workers, else its buckets."""
    if not membership.registered:
        return None
    if membership.fenced(ttl_seconds=ttl_seconds, heartbeat_seconds=heartbeat_seconds, lost_seconds=lost_seconds):
        return false()
    live = live_workers(session, now, ttl_seconds=ttl_seconds, lost_seconds=lost_seconds)
    if membership.worker_id not in live:
        return false()
    if len(live) == 1:
        return None
    return func.substr(experiment_id, 35, 2).in_(buckets_of(live.index(membership.worker_id), len(live)))
