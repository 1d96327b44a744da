"""The GPU counter per (cluster, tenant, pool) that admission locks instead of summing live runs.

Invariant: ``pool_usage.gpus_committed`` equals the sum of ``experiments.gpus`` over the
non-terminal experiments of its key. Two writers keep it:

- ``take`` (submit): one ``UPDATE ... RETURNING`` adds the run's GPUs to the row and locks it
  until the transaction ends (SQLite: the transaction already holds the database's write lock,
  BEGIN IMMEDIATE), so racing submissions of one tenant and pool queue on that row; the caller
  checks the quota against the GPUs held before (a refusal rolls the addition back) in the same
  transaction as the experiment and its outbox row. The locked step is one statement and the
  commit, whatever the number of live runs.
- ``note_transition`` (``lifecycle.transition``, the one place a state changes): a run leaving
  the live states gives its GPUs back in the same transaction. The changes are collected on the
  session and written just before it commits, in key order: a reconcile batch ending 500 runs
  holds each counter row for one UPDATE at the end, not for the whole batch (submissions of that
  pool would wait behind it), and two batches take the rows in one order (no deadlock).

``drift`` compares the counters with the sum, and ``repair`` corrects one key under its lock
(``background.pool_usage`` runs both every few minutes and counts the repairs).
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime

from sqlalchemy import event, func, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from experiments.models import Experiment, PoolUsage
from experiments.states import NON_TERMINAL, State

Key = tuple[str, str, str]  # (cluster, tenant, pool)
_PENDING = "gpufleet_pool_usage_deltas"


def take(session: Session, *, cluster: str, tenant: str, pool: str, gpus: int, now: datetime) -> int:
    """Add ``gpus`` to the key's counter, locking its row until the caller's transaction ends;
    returns the GPUs held before (what the quota is checked against). The row is created at 0
    the first time a key is used."""
    key = (PoolUsage.cluster == cluster, PoolUsage.tenant == tenant, PoolUsage.pool == pool)
    statement = (update(PoolUsage).where(*key).values(gpus_committed=PoolUsage.gpus_committed + gpus, updated_at=now)
                 .returning(PoolUsage.gpus_committed).execution_options(synchronize_session=False))
    held = session.execute(statement).scalar_one_or_none()
    if held is None:
        _create(session, cluster=cluster, tenant=tenant, pool=pool, now=now)
        held = session.execute(statement).scalar_one()
    return held - gpus


def _create(session: Session, *, cluster: str, tenant: str, pool: str, now: datetime) -> None:
    insert = pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert
    session.execute(insert(PoolUsage).values(cluster=cluster, tenant=tenant, pool=pool, gpus_committed=0, updated_at=now).on_conflict_do_nothing())


def lock(session: Session, *, cluster: str, tenant: str, pool: str, now: datetime) -> PoolUsage:
    """The key's counter row, locked until the caller's transaction ends (created at 0 if new)."""
    key = {"cluster": cluster, "tenant": tenant, "pool": pool}
    query = select(PoolUsage).filter_by(**key).with_for_update().execution_options(populate_existing=True)
    row = session.scalars(query).one_or_none()
    if row is None:
        _create(session, cluster=cluster, tenant=tenant, pool=pool, now=now)
        row = session.scalars(query).one()
    return row


def note_transition(session: Session, exp: Experiment, current: State, target: State) -> None:
    """Count the move's change of held GPUs on the session; written before commit."""
    delta = exp.gpus * ((target in NON_TERMINAL) - (current in NON_TERMINAL))
    if delta:
        session.info.setdefault(_PENDING, Counter())[(exp.cluster, exp.tenant, exp.pool)] += delta


@event.listens_for(Session, "before_commit")
def _write_deltas(session: Session) -> None:
    deltas: Counter[Key] = session.info.pop(_PENDING, Counter())
    if not deltas:
        return
    session.flush()  # the experiments' own rows first: a stale state fails here, before any counter is touched
    for (cluster, tenant, pool), delta in sorted(deltas.items()):
        if delta:
            session.execute(update(PoolUsage).where(PoolUsage.cluster == cluster, PoolUsage.tenant == tenant, PoolUsage.pool == pool)
                            .values(gpus_committed=PoolUsage.gpus_committed + delta).execution_options(synchronize_session=False))


@event.listens_for(Session, "after_rollback")
def _drop_deltas(session: Session) -> None:
    session.info.pop(_PENDING, None)


def live_sums(session: Session) -> dict[Key, int]:
    """The truth the counters stand for: GPUs of the non-terminal experiments per key."""
    rows = session.execute(select(Experiment.cluster, Experiment.tenant, Experiment.pool, func.sum(Experiment.gpus))
                           .where(Experiment.state.in_([s.value for s in NON_TERMINAL]))
                           .group_by(Experiment.cluster, Experiment.tenant, Experiment.pool)).all()
    return {(c, t, p): int(n or 0) for c, t, p, n in rows}


def counters(session: Session) -> dict[Key, int]:
    return {(r.cluster, r.tenant, r.pool): r.gpus_committed for r in session.scalars(select(PoolUsage))}


def drift(session: Session) -> set[Key]:
    """Keys whose counter differs from the sum right now (unlocked: a candidate list for ``repair``)."""
    sums, held = live_sums(session), counters(session)
    return {key for key in sums.keys() | held.keys() if sums.get(key, 0) != held.get(key, 0)}


def repair(session: Session, key: Key, *, now: datetime) -> tuple[int, int] | None:
    """Set one key's counter to the sum, under its row lock (in the caller's transaction); returns
    (was, now) when it differed. Under the lock no submit of the key is between its check and its
    commit, and a run ending concurrently subtracts relative to whatever this writes, so the sum
    read after the lock is the right value."""
    cluster, tenant, pool = key
    row = lock(session, cluster=cluster, tenant=tenant, pool=pool, now=now)
    total = session.scalar(select(func.coalesce(func.sum(Experiment.gpus), 0)).where(
        Experiment.cluster == cluster, Experiment.tenant == tenant, Experiment.pool == pool,
        Experiment.state.in_([s.value for s in NON_TERMINAL]))) or 0
    if row.gpus_committed == total:
        return None
    was, row.gpus_committed, row.updated_at = row.gpus_committed, int(total), now
    return was, int(total)
