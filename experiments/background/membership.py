"""Which workers are alive, and which share of the runs each follows.

Every worker (``gpufleet serve`` with its worker threads, or ``gpufleet serve --worker-only``)
writes its row in ``workers`` every ``Timing.heartbeat_seconds``. A worker is dead to the others
when its heartbeat is older than ``Timing.worker_ttl_seconds``, or, on PostgreSQL, older than
``Timing.worker_lost_seconds`` while its process has no database session left:

- **Why two bounds.** A process that exited (a crash, kill -9, the OOM killer) loses its sessions
  the moment the kernel closes its sockets: PostgreSQL ends their backends and
  ``pg_stat_activity`` no longer lists its ``application_name`` (``experiments.db.PROCESS_TAG``,
  also the first 12 characters of its worker id). Its claims pass on once it missed a few
  heartbeats, in seconds, instead of the TTL. A process that is alive but silent (frozen, paused,
  cut off from the database) keeps its sessions open on the server, so only the longer TTL ends
  its claims: it may resume in the middle of a submit. PostgreSQL shows every role the
  ``application_name`` of every session (src/backend/utils/adt/pgstatfuncs.c,
  ``pg_stat_get_activity``: ``st_appname`` is among the "values available to all callers").
  Behind a pooler that rewrites ``application_name``, or in transaction mode, a live worker may
  show no session: the shorter bound then applies to every stale worker. It fences itself one
  heartbeat period before, which stops a submit not yet sent but not one in flight
  (docs/control-plane.md, "What the fence does not cover").
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
database where it applies), it claims no dispatch, submits nothing and follows
no bucket, because the others may already have taken its work over. Heartbeat times come from
each worker's clock: the workers' clocks must agree to well within the shorter bound (NTP does).

A context no ``Worker`` registered (``worker.run_once``: tests, tools) follows every run and
its claims end only with their lease, as before.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, and_, column, delete, exists, false, func, literal, or_, select, table, update
from sqlalchemy.orm import InstrumentedAttribute, Session, sessionmaker

from experiments.db import PROCESS_TAG
from experiments.models import WorkerBeat

BUCKETS = 256
# A row this much older than the TTL is deleted; its claims' leases have long passed by then.
PRUNE_AFTER = timedelta(hours=1)


def buckets_of(index: int, members: int) -> list[str]:
    """The id suffixes (two hex digits) the ``index``-th of ``members`` live workers follows."""
    return [f"{b:02x}" for b in range(BUCKETS) if b % members == index]


class Membership:
    """This worker's id and the freshness of its own heartbeat (monotonic, so a clock step cannot fake it)."""

    def __init__(self) -> None:
        # The process tag first: the others find this process's sessions by it (see the module docstring).
        self.worker_id = f"{PROCESS_TAG}-{uuid.uuid4().hex[:23]}"
        self.registered = False
        self.early_takeover = False  # whether the others can see this process's sessions end (sessions_listed)
        self._last_beat: float | None = None
        self._lock = threading.Lock()

    def beat(self, sessions: sessionmaker[Session], now: datetime) -> None:
        """Write this worker's heartbeat (creating its row first); prune long-dead rows. Its freshness
        counts from before the write, as ``heartbeat_at`` does for the others: a commit that waited
        must not make this worker think itself fresher than they see it (``fenced``)."""
        started = time.monotonic()
        with sessions() as session, session.begin():
            self.early_takeover = sessions_listed(session)
            if not session.execute(update(WorkerBeat).where(WorkerBeat.id == self.worker_id).values(heartbeat_at=now)).rowcount:
                session.add(WorkerBeat(id=self.worker_id, host=socket.gethostname()[:255], pid=os.getpid(), started_at=now, heartbeat_at=now))
            session.execute(delete(WorkerBeat).where(WorkerBeat.heartbeat_at < now - PRUNE_AFTER))
        with self._lock:
            self._last_beat = started
            self.registered = True

    def leave(self, sessions: sessionmaker[Session]) -> None:
        """A clean stop: the row goes, so the others re-split the runs at their next pass."""
        with sessions() as session, session.begin():
            session.execute(delete(WorkerBeat).where(WorkerBeat.id == self.worker_id))

    def fenced(self, *, ttl_seconds: float, heartbeat_seconds: float, lost_seconds: float) -> bool:
        """True when the others may consider this worker dead: it must not act. It cannot know whether
        the others still see its sessions, so the shorter bound counts where they can take over early
        (PostgreSQL); elsewhere (SQLite) only the TTL passes its work on."""
        if not self.registered:
            return False
        with self._lock:
            last = self._last_beat
        bound = ttl_seconds - 2 * heartbeat_seconds
        if self.early_takeover:
            bound = min(bound, lost_seconds - heartbeat_seconds)
        return last is None or time.monotonic() - last > bound


_ACTIVITY = table("pg_stat_activity", column("application_name"))


def sessions_listed(session: Session) -> bool:
    """Whether the database lists every process's sessions (PostgreSQL's pg_stat_activity), which the
    early takeover of an exited process's claims needs."""
    return session.get_bind().dialect.name == "postgresql"


def dead_workers(session: Session, now: datetime, *, ttl_seconds: float, lost_seconds: float):  # type: ignore[no-untyped-def]
    """The ids of workers dead to the others (a subquery for claims): heartbeat older than the TTL,
    or, on PostgreSQL, older than ``lost_seconds`` with no session of the worker's process left."""
    stale = WorkerBeat.heartbeat_at < now - timedelta(seconds=ttl_seconds)
    if sessions_listed(session):
        gone = ~exists().where(_ACTIVITY.c.application_name == literal("gpufleet ") + func.substr(WorkerBeat.id, 1, len(PROCESS_TAG)))
        stale = or_(stale, and_(WorkerBeat.heartbeat_at < now - timedelta(seconds=lost_seconds), gone))
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
