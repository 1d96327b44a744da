"""Which workers are alive, and which share of the runs each follows.

Every worker (``gpufleet serve`` with its worker threads, or ``gpufleet serve --worker-only``)
writes its row in ``workers`` every ``Timing.heartbeat_seconds``. A worker whose heartbeat is
older than ``Timing.worker_ttl_seconds`` is dead to the others:

- **Dispatch.** Its outbox claims (``outbox.claimed_by``) are claimable at once, not after
  their lease (``Timing.dispatch_lease_seconds``, which still bounds a live worker's stuck call).
- **Reconcile and reap.** The runs are split into 256 buckets by the last two hex digits of the
  experiment id; the live workers, sorted by id, take bucket ``b`` when ``b % N`` is their
  index. A dead worker's buckets pass to the others at their next pass after its heartbeat
  goes stale; while two workers' views of the membership differ (a worker joining or leaving)
  a bucket may be followed twice for a pass, which costs reads but changes nothing twice (the
  state-guarded UPDATE, ``models.Experiment``, and the row locks the writers take).

A worker fences itself: once its own last successful heartbeat is older than the TTL less two
heartbeat periods, it claims no dispatch, submits nothing and follows no bucket, because the
others may already have taken its work over. Heartbeat times come from each worker's clock:
the workers' clocks must agree to well within the TTL (NTP does).

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

from sqlalchemy import ColumnElement, delete, false, func, select, update
from sqlalchemy.orm import InstrumentedAttribute, Session, sessionmaker

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
        self.worker_id = str(uuid.uuid4())
        self.registered = False
        self._last_beat: float | None = None
        self._lock = threading.Lock()

    def beat(self, sessions: sessionmaker[Session], now: datetime) -> None:
        """Write this worker's heartbeat (creating its row first); prune long-dead rows."""
        with sessions() as session, session.begin():
            if not session.execute(update(WorkerBeat).where(WorkerBeat.id == self.worker_id).values(heartbeat_at=now)).rowcount:
                session.add(WorkerBeat(id=self.worker_id, host=socket.gethostname()[:255], pid=os.getpid(), started_at=now, heartbeat_at=now))
            session.execute(delete(WorkerBeat).where(WorkerBeat.heartbeat_at < now - PRUNE_AFTER))
        with self._lock:
            self._last_beat = time.monotonic()
            self.registered = True

    def leave(self, sessions: sessionmaker[Session]) -> None:
        """A clean stop: the row goes, so the others re-split the runs at their next pass."""
        with sessions() as session, session.begin():
            session.execute(delete(WorkerBeat).where(WorkerBeat.id == self.worker_id))

    def fenced(self, *, ttl_seconds: float, heartbeat_seconds: float) -> bool:
        """True when the others may consider this worker dead: it must not act."""
        if not self.registered:
            return False
        with self._lock:
            last = self._last_beat
        return last is None or time.monotonic() - last > ttl_seconds - 2 * heartbeat_seconds


def dead_workers(now: datetime, ttl_seconds: float):  # type: ignore[no-untyped-def]
    """The ids of workers whose heartbeat is older than the TTL (a subquery for claims)."""
    return select(WorkerBeat.id).where(WorkerBeat.heartbeat_at < now - timedelta(seconds=ttl_seconds))


def live_workers(session: Session, now: datetime, ttl_seconds: float) -> list[str]:
    return list(session.scalars(select(WorkerBeat.id).where(WorkerBeat.heartbeat_at >= now - timedelta(seconds=ttl_seconds)).order_by(WorkerBeat.id)))


def share(membership: Membership, session: Session, experiment_id: InstrumentedAttribute[str], *, now: datetime, ttl_seconds: float,
          heartbeat_seconds: float) -> ColumnElement[bool] | None:
    """The filter on experiment ids this worker follows this pass: None (all) for an unregistered
    context, nothing when fenced or not among the live workers, else its buckets."""
    if not membership.registered:
        return None
    if membership.fenced(ttl_seconds=ttl_seconds, heartbeat_seconds=heartbeat_seconds):
        return false()
    live = live_workers(session, now, ttl_seconds)
    if membership.worker_id not in live:
        return false()
    if len(live) == 1:
        return None
    return func.substr(experiment_id, 35, 2).in_(buckets_of(live.index(membership.worker_id), len(live)))
