"""Bulk writes to experiments that never wait on a row lock.

Every transaction that locks several experiment rows takes them in id order (a reconcile chunk,
a dispatch batch), then the ``pool_usage`` rows in key order, so no two of them wait on each
other in a cycle. A plain ``UPDATE experiments ... WHERE id IN (...)`` locks its rows in the
order the plan visits them (heap order on PostgreSQL), so next to those it can close a cycle:
it holds a row a chunk of another worker wants next while it waits on one that chunk holds,
and PostgreSQL aborts one of them (``deadlock detected``). The writes here are bookkeeping
that every pass makes again (the reconciled stamp, a reason why a run is not followed), so a
row another transaction holds right now is skipped (``FOR NO KEY UPDATE SKIP LOCKED``, in id
order) instead of waited on: this statement never waits, and so never closes a cycle. NO KEY
UPDATE is the writers' lock (background.row_locks), so a row that is merely referenced by an
insert in flight (an event of it) is stamped, not skipped. SQLite has one
writer and no row locks; there the plain UPDATE runs.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, select, update
from sqlalchemy.orm import Session

from experiments.models import Experiment


def update_unlocked(session: Session, where: ColumnElement[bool], **values: Any) -> None:
    """``UPDATE experiments SET values WHERE where``, leaving out each row another transaction holds."""
    if session.get_bind().dialect.name == "postgresql":
        free = select(Experiment.id).where(where).order_by(Experiment.id).with_for_update(skip_locked=True, key_share=True)
        where = Experiment.id.in_(free.scalar_subquery())
    session.execute(update(Experiment).where(where).values(**values).execution_options(synchronize_session=False))
