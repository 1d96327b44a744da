"""Who is calling: a per-tenant bearer token (stored as SHA-256, shown once) or an OIDC JWT.

A tenant caller submits only its tenant's jobs and sees and cancels only its tenant's
experiments; an admin caller sees all. OIDC maps one claim of a verified token (signature
against the issuer's JWKS, ``iss``, ``aud``, ``exp``) to a tenant through an explicit table,
so a CI workload identity can submit without a stored secret. Any other claim value is 403.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import Engine, bindparam, select
from sqlalchemy.orm import Session

from experiments.db import single_statements
from experiments.errors import ApiError
from experiments.jwks import JwksCache, JwksTiming, KeysUnavailable, UnknownKey
from experiments.models import ApiToken

TOKEN_PREFIX = "gfx_"


@dataclass(frozen=True)
class Caller:
    subject: str
    tenant: str | None
    admin: bool

    def may_see(self, tenant: str) -> bool:
        return self.admin or self.tenant == tenant


@dataclass(frozen=True)
class OidcSettings:
    issuer: str
    audience: str
    jwks_url: str
    claim: str
    tenants: tuple[tuple[str, str], ...]  # claim value -> tenant
    admin_values: tuple[str, ...] = ()
    algorithms: tuple[str, ...] = ("RS256", "ES256")
    jwks_timing: JwksTiming = field(default_factory=JwksTiming)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(session: Session, *, tenant: str | None, admin: bool, name: str, now: datetime) -> tuple[str, str]:
    """Returns (token id, the token). Only the hash is stored; the token is shown once."""
    token_id = secrets.token_hex(6)
    token = f"{TOKEN_PREFIX}{secrets.token_urlsafe(32)}"
    session.add(ApiToken(id=token_id, token_sha256=hash_token(token), tenant=tenant, admin=admin, name=name, created_at=now))
    return token_id, token


def _unauthorized(error: str) -> ApiError:
    return ApiError(401, error, field="Authorization", fix="send 'Authorization: Bearer <token>' with a token from `gpufleet api token create --tenant <tenant>` (or an OIDC token from a configured issuer)")


def bearer(header: str | None) -> str:
    if not header:
        raise _unauthorized("no bearer token")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise _unauthorized("the Authorization header is not 'Bearer <token>'")
    return token.strip()


def token_row(session: Session, token: str) -> ApiToken:
    """The live row of an API token (what a dashboard session acts for)."""
    row = session.scalar(select(ApiToken).where(ApiToken.token_sha256 == hash_token(token))) if token.startswith(TOKEN_PREFIX) else None
    if row is None or row.revoked_at is not None:
        raise _unauthorized("unknown or revoked token")
    return row


# The columns a request's caller needs, as plain rows: every API call runs this lookup, and loading an
# ApiToken entity (identity map, instance state) costs more CPU than the query itself.
_CALLER_OF_TOKEN = select(ApiToken.id, ApiToken.tenant, ApiToken.admin, ApiToken.revoked_at).where(ApiToken.token_sha256 == bindparam("sha256"))


def caller_for_token(engine: Engine, token: str, oidc: OidcSettings | None, jwks: JwksCache | None) -> Caller:
    """API tokens are looked up in the database (one statement, ``db.single_statements``) and never wait
    on the issuer's keys; an OIDC token does not take a database connection at all."""
    if token.startswith(TOKEN_PREFIX):
        with single_statements(engine) as connection:
            row = connection.execute(_CALLER_OF_TOKEN, {"sha256": hash_token(token)}).first()
        if row is None or row.revoked_at is not None:
            raise _unauthorized("unknown or revoked token")
        return Caller(subject=f"token:{row.id}", tenant=row.tenant, admin=row.admin)
    if oidc is not None and jwks is not None and token.count(".") == 2:
        return _oidc_caller(token, oidc, jwks)
    raise _unauthorized("unknown or revoked token")


def _oidc_caller(token: str, oidc: OidcSettings, jwks: JwksCache) -> Caller:
    import jwt

    try:
        key = jwks.key(jwt.get_unverified_header(token).get("kid"))
        claims = jwt.decode(token, key.key, algorithms=list(oidc.algorithms), audience=oidc.audience, issuer=oidc.issuer,
                            options={"require": ["exp", "iss", "aud", "sub"]})
    except KeysUnavailable:
        raise ApiError(503, "the OIDC issuer's signing keys are not available right now", field="Authorization",
                       fix="retry in a minute; API tokens (gfx_...) keep working meanwhile") from None
    except UnknownKey:
        raise _unauthorized("the OIDC token was refused (no key of the issuer matches its kid)") from None
    except jwt.PyJWTError as exc:
        raise _unauthorized(f"the OIDC token was refused ({type(exc).__name__})") from None
    value = str(claims.get(oidc.claim, ""))
    subject = f"oidc:{claims['sub']}"
    if value in oidc.admin_values:
        return Caller(subject=subject, tenant=None, admin=True)
    tenant = dict(oidc.tenants).get(value)
    if tenant is None:
        raise ApiError(403, f"claim {oidc.claim}={value!r} maps to no tenant", field="Authorization",
                       fix=f"add {value!r} to the OIDC tenant map of this service, or use a token of a mapped identity")
    return Caller(subject=subject, tenant=tenant, admin=False)
