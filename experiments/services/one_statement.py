"""Admission as one PostgreSQL statement: the counter, the quota check and the three inserts.

Why: 50 clients submitting to one tenant and pool all take the same ``pool_usage`` row. In a
transaction of several statements that row stays locked from its ``UPDATE`` until the client's
``COMMIT`` arrives, which on 2 busy cores is one network round trip plus the Python thread
waiting for the GIL among dozens of others: the row's holder queues behind the very requests
that queue behind it, and throughput is capped by that hold time. Here one autocommit statement
(data-modifying CTEs) increments the counter only if the quota still holds, and inserts the
experiment, its outbox row and its event only if the counter moved; the row is locked for the
statement's execution and commit inside the server, with no round trip and no Python in between.

What keeps the guarantees of the transactional path (``experiments.submit`` for SQLite and for
tenants with a money budget):

- Quota: ``gpus_committed + gpus <= quota`` is in the ``UPDATE``'s WHERE. Under READ COMMITTED a
  concurrent updater makes this one wait for the row and re-evaluate the condition on the
  committed version, so racing submissions admit exactly as many as fit.
- Exactly once: it is one statement, so the counter and the three rows commit together or not
  at all; the unique index on (tenant, idempotency_key) makes a second experiment for a key fail
  the statement (nothing of it stays), and the caller answers with the first experiment.
- ``pool_usage`` invariant: the counter grows by the experiment's GPUs in the commit that makes
  the experiment live.

``admit`` returns False when nothing was written (the quota did not hold, or the key's counter
row does not exist yet); the caller then looks, with ordinary reads, at which one it was.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

from sqlalchemy import Connection, Select, Table, bindparam, cast, insert, select, update
from sqlalchemy.sql.elements import ColumnElement

from experiments.models import Event, Experiment, Outbox, PoolUsage

# The columns each row is written with; the statement is built once for them (``_statement``), so a
# submit only binds values: building and cache-keying a fresh tree of CTEs costs more CPU than the rest of the request.
EXPERIMENT_COLUMNS = ("id", "tenant", "job", "cluster", "pool", "gpus", "meta", "state", "scheduler", "submitted_by", "idempotency_key",
                      "request_hash", "job_spec", "job_spec_sha256", "deadline_hours", "price_per_gpu_hour", "price_kind", "attempt",
                      "prior_gpu_hours", "created_at", "updated_at")
OUTBOX_COLUMNS = ("created_at", "attempts", "next_attempt_at")
EVENT_COLUMNS = ("at", "actor", "kind", "from_state", "to_state", "message", "attempt")


def _values(table: Table, prefix: str, names: tuple[str, ...]) -> list[ColumnElement[Any]]:
    """Each value as a bind parameter cast to its column's type, so PostgreSQL types the SELECT list
    of an ``INSERT ... SELECT`` like the columns (a bare NULL or string parameter would be ``text``)."""
    return [cast(bindparam(f"{prefix}{name}", type_=table.c[name].type), table.c[name].type).label(name) for name in names]


@cache
def _statement() -> Select[Any]:
    experiments, outboxes, events = Experiment.__table__, Outbox.__table__, Event.__table__
    gpus = bindparam("e_gpus", type_=PoolUsage.gpus_committed.type)
    counted = (update(PoolUsage)
               .where(PoolUsage.cluster == bindparam("e_cluster"), PoolUsage.tenant == bindparam("e_tenant"), PoolUsage.pool == bindparam("e_pool"),
                      PoolUsage.gpus_committed + gpus <= bindparam("quota", type_=PoolUsage.gpus_committed.type))
               .values(gpus_committed=PoolUsage.gpus_committed + gpus, updated_at=bindparam("e_created_at", type_=PoolUsage.updated_at.type))
               .returning(PoolUsage.gpus_committed)
               .cte("counted"))
    admitted = (insert(experiments).from_select(list(EXPERIMENT_COLUMNS), select(*_values(experiments, "e_", EXPERIMENT_COLUMNS)).select_from(counted))
                .returning(experiments.c.id).cte("admitted"))
    queued = insert(outboxes).from_select(["experiment_id", *OUTBOX_COLUMNS], select(admitted.c.id, *_values(outboxes, "o_", OUTBOX_COLUMNS))).cte("queued")
    recorded = insert(events).from_select(["experiment_id", *EVENT_COLUMNS], select(admitted.c.id, *_values(events, "v_", EVENT_COLUMNS))).cte("recorded")
    return select(admitted.c.id).add_cte(counted, queued, recorded)


def admit(connection: Connection, *, experiment: Mapping[str, Any], outbox: Mapping[str, Any], event: Mapping[str, Any], quota: int) -> bool:
    """Run the one statement on ``connection`` (in AUTOCOMMIT: the statement is the transaction).
    True when the experiment was admitted and committed. ``outbox`` and ``event`` are their rows
    without the experiment's id. Raises IntegrityError when the tenant's Idempotency-Key is taken."""
    values = {"quota": quota, **{f"e_{k}": experiment[k] for k in EXPERIMENT_COLUMNS}, **{f"o_{k}": outbox[k] for k in OUTBOX_COLUMNS},
              **{f"v_{k}": event[k] for k in EVENT_COLUMNS}}
    return connection.execute(_statement(), values).first() is not None
