"""Dashboard sessions and the CSRF tokens of the dashboard's forms.

Why server-side sessions: the cookie used to be the raw API token (admin too), valid until the
token was revoked and sent to every service on the same host name. Now the cookie holds a random
id (``secrets.token_urlsafe``) whose SHA-256 is a row that expires (idle and absolute limits),
ends at logout and ends with its API token; the token itself is never put in a cookie.

Why CSRF tokens beside ``SameSite=Strict``: SameSite is the browser's promise, a form token is the
server's check. Login has one too (login CSRF: a page of the attacker's posting the attacker's token
would sign the victim in as the attacker's tenant): a pre-session cookie set by ``GET /login`` and
a form field derived from it must arrive together. Forms of a signed-in page carry a token derived
from the session id. Both are HMACs keyed by a secret only the victim's browser holds (in an HttpOnly
cookie), so they need no server key and work across replicas.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, or_, select
from sqlalchemy.orm import Session

from experiments.auth import Caller
from experiments.models import ApiToken, DashboardSession
from experiments.services.lifecycle import record

TOUCH_EVERY = timedelta(minutes=1)  # last_seen_at is written at most this often per session
MAX_SESSIONS_PER_TOKEN = 20  # a token's 21st live session ends its oldest


@dataclass(frozen=True)
class SessionSettings:
    idle_hours: float = 8.0
    max_hours: float = 24.0
    secure_cookie: bool = True  # only a loopback-bound service may turn it off (gpufleet serve --insecure-cookie)
    public_origin: str | None = None  # the browser's scheme://host[:port] of the dashboard behind a proxy (gpufleet serve --public-origin)

    @property
    def session_cookie(self) -> str:
        """``__Host-``: the browser takes it only Secure, host-only and with Path=/, so a sibling
        host name cannot plant or overwrite it (cookie tossing)."""
        return "__Host-gpufleet_session" if self.secure_cookie else "gpufleet_session"

    @property
    def login_cookie(self) -> str:
        return "__Host-gpufleet_login" if self.secure_cookie else "gpufleet_login"


def _sha256(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def form_token(secret: str, purpose: str) -> str:
    """The hidden form field for a cookie-held secret: unguessable without the secret, and not the
    secret itself, so a page that leaks (a cache, a screenshot) does not leak the cookie."""
    return hmac.new(secret.encode(), f"gpufleet-csrf:{purpose}".encode(), hashlib.sha256).hexdigest()


def form_token_ok(secret: str | None, purpose: str, sent: str | None) -> bool:
    """Compared as bytes: ``hmac.compare_digest`` raises TypeError on a str that is not ASCII, and
    the field is the caller's (a non-ASCII one was an unauthenticated 500)."""
    if not secret or not sent:
        return False
    return hmac.compare_digest(form_token(secret, purpose).encode(), sent.encode("utf-8", "replace"))


def new_secret() -> str:
    return secrets.token_urlsafe(32)


def start(session: Session, token: ApiToken, now: datetime, settings: SessionSettings) -> str:
    """A new session for a valid token; returns the id for the cookie (stored only hashed).
    Expired sessions of every token are swept here, so the table holds only live ones, and a token
    keeps at most ``MAX_SESSIONS_PER_TOKEN`` (the oldest end): any holder of a token could sign in
    without end, each sign-in a row kept up to a day."""
    session.execute(delete(DashboardSession).where(or_(DashboardSession.expires_at <= now,
                                                       DashboardSession.last_seen_at <= now - timedelta(hours=settings.idle_hours))))
    raw = new_secret()
    session.add(DashboardSession(id_sha256=_sha256(raw), token_id=token.id, created_at=now, last_seen_at=now,
                                 expires_at=now + timedelta(hours=settings.max_hours)))
    session.flush()
    oldest = session.scalars(select(DashboardSession.id_sha256).where(DashboardSession.token_id == token.id)
                             .order_by(DashboardSession.created_at.desc(), DashboardSession.last_seen_at.desc())
                             .offset(MAX_SESSIONS_PER_TOKEN)).all()
    if oldest:
        session.execute(delete(DashboardSession).where(DashboardSession.id_sha256.in_(oldest)))
    record(session, experiment_id=None, actor=f"token:{token.id}", kind="session", message="dashboard sign-in", now=now)
    return raw


def resume(session: Session, raw: str | None, now: datetime, settings: SessionSettings) -> Caller | None:
    """The caller of a live session, or None; an expired or orphaned session is deleted on sight."""
    if not raw:
        return None
    row = session.get(DashboardSession, _sha256(raw))
    if row is None:
        return None
    token = session.get(ApiToken, row.token_id)
    if token is None or token.revoked_at is not None or now >= row.expires_at or now - row.last_seen_at >= timedelta(hours=settings.idle_hours):
        session.delete(row)
        return None
    if now - row.last_seen_at >= TOUCH_EVERY:
        row.last_seen_at = now
    return Caller(subject=f"token:{token.id}", tenant=token.tenant, admin=token.admin)


def end(session: Session, raw: str, now: datetime, why: str) -> None:
    row = session.get(DashboardSession, _sha256(raw))
    if row is not None:
        record(session, experiment_id=None, actor=f"token:{row.token_id}", kind="session", message=f"dashboard {why}", now=now)
        session.delete(row)


def end_all_of_token(session: Session, token_id: str) -> int:
    """Called when a token is revoked; returns how many sessions ended."""
    return session.execute(delete(DashboardSession).where(DashboardSession.token_id == token_id)).rowcount or 0
