"""The control plane's tables (SQLAlchemy 2). The database is the record of every run:
Nomad garbage-collects finished jobs, this does not forget them.

Times are naive UTC (SQLite has no time zones); ``services.views`` adds the ``Z``.
No column holds a credential: API tokens are stored as SHA-256 hashes, and the wrapped
secret_id minted at dispatch goes straight to the scheduler and is never written here.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, DateTime, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class Experiment(Base):
    __tablename__ = "experiments"
    __table_args__ = (
        UniqueConstraint("tenant", "idempotency_key", name="uq_experiments_tenant_idempotency_key"),
        Index("ix_experiments_state", "state"),
        Index("ix_experiments_tenant_state", "tenant", "state"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64))
    job: Mapped[str] = mapped_column(String(128))
    cluster: Mapped[str] = mapped_column(String(64))
    pool: Mapped[str] = mapped_column(String(64))
    gpus: Mapped[int] = mapped_column(Integer)
    meta: Mapped[dict[str, Any]] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(16))
    # The current attempt (issue 25): a retried run is attempt 2, 3, ... of the same experiment;
    # ended attempts are rows of RunAttempt. failure_class: jobs.failures.FailureClass of the last failure.
    attempt: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    failure_class: Mapped[str | None] = mapped_column(String(16), default=None)
    # GPU-hours of the ended attempts (RunAttempt.gpu_hours summed): cost adds the current attempt's.
    prior_gpu_hours: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    reason: Mapped[str | None] = mapped_column(Text, default=None)
    exit_code: Mapped[int | None] = mapped_column(Integer, default=None)
    scheduler: Mapped[str] = mapped_column(String(16))
    run_id: Mapped[str | None] = mapped_column(String(255), default=None)
    # The scheduler's names for the run's pieces (Nomad job/allocation/node; GKE Job/Workload/ClusterQueue/flavor).
    scheduler_refs: Mapped[dict[str, str] | None] = mapped_column(JSON, default=None)
    # The job file's document as admission checked it, and its SHA-256: dispatch runs this, never the
    # file as edited later (issue 25). Vault references only; NULL for rows admitted before 0008.
    job_spec: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    job_spec_sha256: Mapped[str | None] = mapped_column(String(64), default=None)
    submitted_by: Mapped[str] = mapped_column(String(255))
    idempotency_key: Mapped[str | None] = mapped_column(String(255), default=None)
    request_hash: Mapped[str] = mapped_column(String(64))
    deadline_hours: Mapped[float] = mapped_column(Float)
    price_per_gpu_hour: Mapped[float] = mapped_column(Float)
    price_kind: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(DateTime)
    updated_at: Mapped[datetime] = mapped_column(DateTime)
    dispatching_at: Mapped[datetime | None] = mapped_column(DateTime, default=None)
    queued_at: Mapped[datetime | None] = mapped_column(DateTime, default=None)
    provisioning_at: Mapped[datetime | None] = mapped_column(DateTime, default=None)
    running_at: Mapped[datetime | None] = mapped_column(DateTime, default=None)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime, default=None)
    deadline_at: Mapped[datetime | None] = mapped_column(DateTime, default=None)
    cancel_requested_at: Mapped[datetime | None] = mapped_column(DateTime, default=None)
    reconciled_at: Mapped[datetime | None] = mapped_column(DateTime, default=None)
    # Proof of release (experiments.background.orphans): when the scheduler showed nothing of the ended run
    # holding GPUs, and what it last showed still held until then.
    released_at: Mapped[datetime | None] = mapped_column(DateTime, default=None)
    release_held: Mapped[str | None] = mapped_column(Text, default=None)

    # Every ORM UPDATE of a row says ``AND state = <the state it was read in>`` (the application sets
    # the new state itself): two workers that both read a run as running and both end it cannot
    # both commit; the second flush raises StaleDataError and its transaction, with its release of
    # the run's GPUs from ``pool_usage``, rolls back (docs/control-plane.md, "Several workers").
    __mapper_args__ = {"version_id_col": state, "version_id_generator": False}


class Event(Base):
    """The audit trail: every state change and every request that changed something."""

    __tablename__ = "events"
    __table_args__ = (Index("ix_events_experiment", "experiment_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    experiment_id: Mapped[str | None] = mapped_column(ForeignKey("experiments.id"), default=None)
    at: Mapped[datetime] = mapped_column(DateTime)
    actor: Mapped[str] = mapped_column(String(255))
    kind: Mapped[str] = mapped_column(String(32))
    from_state: Mapped[str | None] = mapped_column(String(16), default=None)
    to_state: Mapped[str | None] = mapped_column(String(16), default=None)
    message: Mapped[str] = mapped_column(Text, default="")
    # The experiment's attempt when the event happened (NULL: an event of no experiment, or before 0010).
    attempt: Mapped[int | None] = mapped_column(Integer, default=None)


class RunAttempt(Base):
    """One ended attempt of a retried experiment: which scheduler run it was, how and why it ended
    (jobs.failures class and cause), and the GPU time it held, which the experiment's GPU-hours and
    cost add to the current attempt's. The current attempt lives on the experiment row itself."""

    __tablename__ = "run_attempts"

    experiment_id: Mapped[str] = mapped_column(String(36), ForeignKey("experiments.id", ondelete="CASCADE"), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[str | None] = mapped_column(String(255), default=None)
    state: Mapped[str] = mapped_column(String(16))
    failure_class: Mapped[str | None] = mapped_column(String(16), default=None)
    cause: Mapped[str | None] = mapped_column(String(64), default=None)
    reason: Mapped[str | None] = mapped_column(Text, default=None)
    exit_code: Mapped[int | None] = mapped_column(Integer, default=None)
    dispatched_at: Mapped[datetime | None] = mapped_column(DateTime, default=None)
    placed_at: Mapped[datetime | None] = mapped_column(DateTime, default=None)
    finished_at: Mapped[datetime] = mapped_column(DateTime)
    gpu_hours: Mapped[float] = mapped_column(Float)


class Outbox(Base):
    """One row per accepted experiment not yet handed to the scheduler.

    Written in the same transaction as the experiment, deleted in the same transaction that
    records the scheduler's run id: a crash in between leaves the row, and the retry reuses
    the experiment id as the scheduler's idempotency token, so the run exists once.
    """

    __tablename__ = "outbox"

    experiment_id: Mapped[str] = mapped_column(ForeignKey("experiments.id"), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(DateTime)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(DateTime)
    lease_until: Mapped[datetime | None] = mapped_column(DateTime, default=None)
    # The worker holding the claim (``workers.id``); NULL when unclaimed or claimed by a pass
    # without a heartbeat (tests, tools), whose claim only its lease ends.
    claimed_by: Mapped[str | None] = mapped_column(String(36), default=None)
    last_error: Mapped[str | None] = mapped_column(Text, default=None)


class PoolUsage(Base):
    """GPUs a tenant's live runs hold or wait for on one pool: the sum of ``experiments.gpus``
    over its non-terminal experiments, kept as one row so admission locks and reads one row
    instead of summing every live run under a lock (issue 28). A submit adds with one ``UPDATE
    ... RETURNING`` (the row stays locked until its commit) in its own transaction; the transition
    that ends a run subtracts in the same transaction (``services.pool_usage``); ``background.pool_usage`` checks it against the sum."""

    __tablename__ = "pool_usage"

    cluster: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64), primary_key=True)
    pool: Mapped[str] = mapped_column(String(64), primary_key=True)
    gpus_committed: Mapped[int] = mapped_column(Integer, default=0)
    updated_at: Mapped[datetime] = mapped_column(DateTime)


class WorkerBeat(Base):
    """One row per running worker (``gpufleet serve`` with its worker, or ``--worker-only``): its
    heartbeat. Outbox claims carry the claimant's id, so a claim of a worker whose heartbeat is
    older than the TTL is taken over at once instead of after the claim's lease; reconcile and
    reap split the runs among the workers whose heartbeat is fresh (``background.membership``)."""

    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(DateTime)
    heartbeat_at: Mapped[datetime] = mapped_column(DateTime)


class ApiToken(Base):
    """A bearer token for one tenant (or admin); only its SHA-256 is kept."""

    __tablename__ = "api_tokens"

    id: Mapped[str] = mapped_column(String(16), primary_key=True)
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    tenant: Mapped[str | None] = mapped_column(String(64), default=None)
    admin: Mapped[bool] = mapped_column(Boolean, default=False)
    name: Mapped[str] = mapped_column(String(128), default="")
    created_at: Mapped[datetime] = mapped_column(DateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime, default=None)


class RunLog(Base):
    """The last part of each rank's stdout/stderr, kept while the run runs (a few runs per
    reconcile pass) and when it ends, so a run the scheduler has garbage-collected still shows
    why it died. Masked by jobs.logs before it is written."""

    __tablename__ = "run_logs"
    __table_args__ = (Index("ix_run_logs_captured_at", "captured_at"),)  # the idle policy reads only what changed

    experiment_id: Mapped[str] = mapped_column(String(36), ForeignKey("experiments.id", ondelete="CASCADE"), primary_key=True)
    rank: Mapped[int] = mapped_column(Integer, primary_key=True, default=0)
    stream: Mapped[str] = mapped_column(String(8), primary_key=True)
    text: Mapped[str] = mapped_column(Text)
    captured_at: Mapped[datetime] = mapped_column(DateTime)
    # When this tail last differed from the one captured before it (the idle policy's "no log output
    # since"); NULL on rows kept before 0010.
    changed_at: Mapped[datetime | None] = mapped_column(DateTime, default=None)


class SchedulerIdentity(Base):
    """Which scheduler a bound cluster name means: recorded by the first service that reached it
    (``jobs.runner.Runner.identity``: Nomad's region and server ids, the Kubernetes cluster's
    kube-system uid). A service whose scheduler answers with another identity acts on none of
    that cluster's runs (``experiments.binding``)."""

    __tablename__ = "scheduler_identities"

    cluster: Mapped[str] = mapped_column(String(64), primary_key=True)
    scheduler: Mapped[str] = mapped_column(String(16))
    identity: Mapped[str] = mapped_column(Text)
    recorded_at: Mapped[datetime] = mapped_column(DateTime)
    confirmed_at: Mapped[datetime] = mapped_column(DateTime)


class RunUsage(Base):
    """A run's downsampled GPU utilization: one row per time bucket, merged in pairs as the run
    grows (services.usage), so a week-long run keeps a few hundred rows. ``samples`` weighs a
    row's mean when rows merge; a value nobody reported stays NULL (unknown), never 0."""

    __tablename__ = "run_usage"
    __table_args__ = (Index("ix_run_usage_at", "at"),)  # the idle policy reads only what changed

    experiment_id: Mapped[str] = mapped_column(String(36), ForeignKey("experiments.id", ondelete="CASCADE"), primary_key=True)
    at: Mapped[datetime] = mapped_column(DateTime, primary_key=True)
    samples: Mapped[int] = mapped_column(Integer)
    util_mean_pct: Mapped[float | None] = mapped_column(Float, default=None)
    util_peak_pct: Mapped[float | None] = mapped_column(Float, default=None)
    memory_peak_mib: Mapped[float | None] = mapped_column(Float, default=None)
    # The busiest single GPU of the run in this bucket (util_peak_pct is the run's mean's peak):
    # below the idle threshold means every GPU of every rank was. NULL where unknown or before 0010.
    util_max_pct: Mapped[float | None] = mapped_column(Float, default=None)


class DashboardSession(Base):
    """A signed-in dashboard browser. The cookie holds a random id; only its SHA-256 is kept, so
    the table cannot be replayed as cookies. It acts for its API token: revoking the token ends
    it (checked on every page and deleted by ``api token revoke``)."""

    __tablename__ = "dashboard_sessions"
    __table_args__ = (Index("ix_dashboard_sessions_token", "token_id"), Index("ix_dashboard_sessions_expires", "expires_at"))

    id_sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    token_id: Mapped[str] = mapped_column(String(16), ForeignKey("api_tokens.id", ondelete="CASCADE"))
    created_at: Mapped[datetime] = mapped_column(DateTime)
    last_seen_at: Mapped[datetime] = mapped_column(DateTime)
    expires_at: Mapped[datetime] = mapped_column(DateTime)  # the absolute limit: created_at + max hours
