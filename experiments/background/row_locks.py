"""How a transaction locks several experiment rows: in id order, ``FOR NO KEY UPDATE``.

Id order: a reconcile chunk and a dispatch claim each lock many runs, so two of them never wait on
each other in a cycle; the ``pool_usage`` rows come after, in key order (services.pool_usage).

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
SQLite has one writer and no row locks: there the SELECT takes none.
"""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy import select
from sqlalchemy.orm import Session

from experiments.models import Experiment


def lock_in_id_order(session: Session, ids: Collection[str]) -> dict[str, Experiment]:
    """These experiments, read fresh and locked until the caller's transaction ends (a missing id is left out)."""
    query = (select(Experiment).where(Experiment.id.in_(list(ids))).order_by(Experiment.id).with_for_update(key_share=True)
             .execution_options(populate_existing=True))
    return {e.id: e for e in session.scalars(query)}
