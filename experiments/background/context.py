"""What every background step needs, passed in (no globals): sessions, runner, catalog, clock,
metrics, and the reconciler's memory of what each run looked like last time, when its GPU
utilization was last sampled, and the idle policy's evidence of each run."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import ColumnElement
from sqlalchemy.orm import InstrumentedAttribute, Session, sessionmaker

from experiments.background.membership import Membership, leads, share
from experiments.metrics import Metrics
from experiments.services.catalog import Catalog
from jobs.logs import DEFAULT_TAIL_BYTES
from jobs.runner import Runner

if TYPE_CHECKING:
    from experiments.background.idle import PolicyMemory
    from experiments.background.orphans import OrphanMemory
    from experiments.background.usage import SampledAt

log = logging.getLogger("gpufleet.experiments")


def _sampled_at() -> SampledAt:
    from experiments.background.usage import SampledAt

    return SampledAt()


def _policy_memory() -> PolicyMemory:
    from experiments.background.idle import PolicyMemory

    return PolicyMemory()


class Fingerprints:
    """Per run: the fingerprint of its last full read, and when (monotonic). In memory: after a
    restart every run is read in full once."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()

    def known(self, run_ids: Sequence[str], *, max_age: float) -> dict[str, str]:
        now = time.monotonic()
        with self._lock:
            return {r: fp for r in run_ids if (entry := self._seen.get(r)) and (fp := entry[0]) and now - entry[1] < max_age}

    def remember(self, fingerprints: dict[str, str]) -> None:
        now = time.monotonic()
        with self._lock:
            self._seen.update((r, (fp, now)) for r, fp in fingerprints.items() if fp)

    def forget(self, run_ids: Sequence[str]) -> None:
        with self._lock:
            for run_id in run_ids:
                self._seen.pop(run_id, None)


def _orphan_memory() -> OrphanMemory:
    from experiments.background.orphans import OrphanMemory

    return OrphanMemory()


@dataclass(frozen=True)
class Timing:
    poll_seconds: float = 2.0
    # The dispatch loop polls at the smaller of this and poll_seconds while the outbox is empty (a pass that
    # dispatched starts the next at once): an idle probe is one statement without a transaction
    # (background.dispatch._anything_due), and a submission should not wait long for its dispatch.
    dispatch_poll_seconds: float = 0.1
    # Dispatches one worker has in flight at once (each a thread: the claim, Vault's mint, the scheduler's
    # answer and the record are mostly waits). Each row is claimed by one thread only; 1 is sequential.
    dispatch_concurrency: int = 8
    # Log tails kept in the database: bytes per rank and stream; while runs run, at most this many
    # runs' tails per reconcile pass, each at most once per log_capture_every_seconds (those that
    # ended in the pass are always kept, on top).
    log_tail_bytes: int = DEFAULT_TAIL_BYTES
    log_captures_per_pass: int = 4
    log_capture_every_seconds: float = 300.0
    # Follows of one tenant's runs open at once (each holds a thread and a scheduler connection per rank).
    max_follows_per_tenant: int = 32
    # A claimed dispatch is retried by another pass after this even while its worker lives (longer than the
    # Nomad client's retries); a worker whose heartbeat is older than worker_ttl_seconds loses its claims at once.
    dispatch_lease_seconds: int = 120
    # Workers write a heartbeat this often; one silent for worker_ttl_seconds is dead to the others, and on PostgreSQL
    # one silent for worker_lost_seconds whose advisory lock no session holds (it exited: background.membership).
    heartbeat_seconds: float = 0.5
    worker_ttl_seconds: float = 10.0
    # 1.5 s, not 2: a dead worker's claims wait this long after its last beat, a fixed wait that a kill -9 in the
    # middle of a burst of 200 (about 1.2 s clean) made longer than the burst itself (docs/dispatch-throughput.md).
    # A live worker fences itself one heartbeat period earlier (1 s without a successful beat).
    worker_lost_seconds: float = 1.5
    # How often the pool_usage counters are compared with the sum over live runs (background.pool_usage).
    pool_usage_check_seconds: float = 300.0
    # An accepted experiment not handed to the scheduler within this fails with the last error.
    dispatch_stuck_seconds: int = 900
    # Runs per reconcile pass. The schedulers are asked in list calls of whole namespaces, which cost the same
    # whatever share of their runs a pass answers, so one pass answers them all: 2,000 a pass took five passes,
    # each listing everything, before a change among 10,000 live runs was sure to be seen.
    reconcile_batch: int = 20_000
    # Ended runs whose log tails are read at once (each a few scheduler GETs and commits; experiments.services.logs).
    log_keep_concurrency: int = 8
    # A run unchanged in the lists is still read in full this often (a queued run's reason can change alone).
    refresh_seconds: float = 300.0
    # A running run's GPU utilization is sampled at most this often (0: never); background.usage.
    usage_seconds: float = 60.0
    # Nomad allocations asked for their stats per pass (one GET each), least recently sampled first.
    usage_nomad_per_pass: int = 25
    # ...and only while those GETs have taken less than this share of the pass (at least a few a pass).
    usage_budget: float = 0.15
    # The budget and idle-policy steps run at most this often (0: every pass); their windows are minutes to hours.
    policy_seconds: float = 60.0
    # A retried run's next attempt waits this, doubled per attempt, at most the max (experiments.attempts).
    retry_backoff_seconds: float = 30.0
    retry_backoff_max_seconds: float = 600.0


@dataclass(frozen=True)
class Context:
    sessions: sessionmaker[Session]
    runner: Runner
    catalog: Catalog
    clock: Callable[[], datetime]
    metrics: Metrics
    timing: Timing
    fingerprints: Fingerprints = field(default_factory=Fingerprints)
    sampled: SampledAt = field(default_factory=lambda: _sampled_at())
    policy: PolicyMemory = field(default_factory=lambda: _policy_memory())
    membership: Membership = field(default_factory=Membership)
    usage_checked: list[datetime] = field(default_factory=list)  # when background.pool_usage last ran (at most one entry)

    def _bounds(self) -> dict[str, float]:
        timing = self.timing
        return {"ttl_seconds": timing.worker_ttl_seconds, "heartbeat_seconds": timing.heartbeat_seconds, "lost_seconds": timing.worker_lost_seconds}

    def fenced(self) -> bool:
        """This worker's heartbeat may look dead to the others: claim and submit nothing."""
        return self.membership.fenced(**self._bounds())

    def share(self, session: Session, experiment_id: InstrumentedAttribute[str]) -> ColumnElement[bool] | None:
        """The runs this worker follows this pass (None: all), see background.membership."""
        return share(self.membership, session, experiment_id, now=self.clock(), **self._bounds())

    def leads(self, session: Session) -> bool:
        """Whether this worker does the work of this pass that is not split by run (background.membership)."""
        return leads(self.membership, session, now=self.clock(), **self._bounds())
    orphans: OrphanMemory = field(default_factory=lambda: _orphan_memory())
