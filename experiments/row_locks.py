"""How transactions lock several experiment rows, so that no two of them wait on each other in a cycle.

Id order: a transaction that locks several runs (a reconcile chunk, a dispatch claim, a usage series
halved) takes them in id order, then the ``pool_usage`` rows in key order (services.pool_usage).

NO KEY UPDATE, not UPDATE: nothing ever changes an experiment's id, and every row that references
one takes ``FOR KEY SHARE`` on it when it is inserted: the foreign key's check runs ``SELECT 1 FROM
ONLY experiments x WHERE id = $1 FOR KEY SHARE OF x`` (PostgreSQL src/backend/utils/adt/ri_triggers.c,
``RI_FKey_check``), for an event, a kept log tail, a usage sample or an outbox row. ``FOR UPDATE``
conflicts with that lock, ``FOR NO KEY UPDATE`` does not (PostgreSQL docs, "Explicit Locking",
"Conflicting Row-Level Locks"); writers still exclude each other (NO KEY UPDATE conflicts with itself
and with the UPDATE every ORM flush of a row makes). With ``FOR UPDATE`` a transaction writing events
for several runs in the order a query happened to return them (the idle policy's notes, the orphan
scan's records) held one run's key share while it waited on another that a chunk of another worker
held, and that chunk wanted the first run next: a cycle PostgreSQL broke by aborting one of them.

Bookkeeping over many runs never waits (``update_unlocked``): a plain ``UPDATE experiments ... WHERE
id IN (...)`` locks its rows in the order the plan visits them (heap order), so it could hold a row a
chunk of another worker wanted next while it waited on one that chunk held. The writes there are
ones every pass makes again (the reconciled stamp, a reason why a run is not followed), so a row
another writer holds right now is skipped (``FOR NO KEY UPDATE SKIP LOCKED``, in id order) instead
of waited on; a row merely referenced by an insert in flight (an event of it) is still written.

SQLite has one writer and no row locks: there the SELECT takes none and the plain UPDATE runs.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from sqlalchemy import ColumnElement, select, update
from sqlalchemy.orm import Session

from experiments.models import Experiment


def lock_in_id_order(session: Session, ids: Collection[str]) -> dict[str, Experiment]:
    """These experiments, read fresh and locked until the caller's transaction ends (a missing id is left out)."""
    query = (select(Experiment).where(Experiment.id.in_(list(ids))).order_by(Experiment.id).with_for_update(key_share=True)
             .execution_options(populate_existing=True))
    return {e.id: e for e in session.scalars(query)}


def update_unlocked(session: Session, where: ColumnElement[bool], **values: Any) -> None:
    """``UPDATE experiments SET values WHERE where``, leaving out each row another writer holds."""
    if session.get_bind().dialect.name == "postgresql":
        free = select(Experiment.id).where(where).order_by(Experiment.id).with_for_update(skip_locked=True, key_share=True)
        where = Experiment.id.in_(free.scalar_subquery())
    session.execute(update(Experiment).where(where).values(**values).execution_options(synchronize_session=False))
