"""API tokens as the operator manages them (``gpufleet api token create|list|revoke``).

Each change is written with its audit event in one transaction, so a token never exists (or
stops working) without the record of who did it. The token itself is returned once by
``create_token`` and stored only as its hash (``experiments.auth``); ``list_tokens`` never
returns it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import select

from clusters.errors import UserError
from experiments import auth
from experiments import db as database
from experiments.models import ApiToken
from experiments.services.lifecycle import record

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from clusters.schema import ClusterConfig


@dataclass(frozen=True)
class TokenInfo:
    id: str
    tenant: str | None
    admin: bool
    name: str
    created_at: datetime
    revoked_at: datetime | None


@contextmanager
def _session(db_url: str, *, write: bool) -> Iterator[Session]:
    """A session on an upgraded database; the engine is disposed afterwards (a CLI run is short)."""
    engine = database.make_engine(db_url)
    database.upgrade(engine)
    try:
        with database.session_factory(engine)() as session:
            if write:
                with session.begin():
                    yield session
            else:
                yield session
    finally:
        engine.dispose()


def holder(*, tenant: str | None, admin: bool) -> str:
    return "admin" if admin else f"tenant {tenant}"


def check_holder(*, tenant: str | None, admin: bool, load_configs: Callable[[], Iterable[ClusterConfig]]) -> None:
    """Exactly one of a tenant (one some cluster file defines) or admin; the cluster files are
    read only for a tenant token, so an admin token can be made while one of them is broken."""
    from clusters.derive.tenants import derive_tenants

    if (tenant is None) == (not admin):
        raise UserError("give exactly one of --tenant <tenant> or --admin")
    if tenant is not None:
        known = sorted({t.name for c in load_configs() for t in derive_tenants(c)})
        if tenant not in known:
            raise UserError(f"--tenant {tenant!r} is not a tenant of any cluster file; allowed: {', '.join(known)}")


def create_token(db_url: str, *, tenant: str | None, admin: bool, name: str, load_configs: Callable[[], Iterable[ClusterConfig]],
                 actor: str, now: datetime) -> tuple[str, str]:
    """(token id, the token): checked, stored as a hash, audited."""
    check_holder(tenant=tenant, admin=admin, load_configs=load_configs)
    with _session(db_url, write=True) as session:
        token_id, token = auth.create_token(session, tenant=tenant, admin=admin, name=name, now=now)
        record(session, experiment_id=None, actor=actor, kind="token", message=f"created token {token_id} for {holder(tenant=tenant, admin=admin)}", now=now)
    return token_id, token


def list_tokens(db_url: str) -> list[TokenInfo]:
    """Every token, oldest first, without the token."""
    with _session(db_url, write=False) as session:
        return [TokenInfo(row.id, row.tenant, row.admin, row.name, row.created_at, row.revoked_at)
                for row in session.scalars(select(ApiToken).order_by(ApiToken.created_at))]


def revoke_token(db_url: str, token_id: str, *, actor: str, now: datetime) -> int:
    """Revoke at once (requests with it get 401) and end its dashboard sessions; revoking twice
    keeps the first time. Returns how many sessions ended."""
    from experiments.services.sessions import end_all_of_token

    with _session(db_url, write=True) as session:
        row = session.get(ApiToken, token_id)
        if row is None:
            raise UserError(f"no token {token_id!r}; list them with gpufleet api token list")
        row.revoked_at = row.revoked_at or now
        ended = end_all_of_token(session, token_id)
        record(session, experiment_id=None, actor=actor, kind="token", message=f"revoked token {token_id} (ended {ended} dashboard sessions)", now=now)
    return ended
