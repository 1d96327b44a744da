"""Request-scoped dependencies: the context, a session, and the authenticated caller."""

from __future__ import annotations

from collections.abc import Iterator

from fastapi import Request
from sqlalchemy.orm import Session

from experiments import db
from experiments.auth import Caller, bearer, caller_for_token
from experiments.background.context import Context


def context(request: Request) -> Context:
    return request.app.state.ctx


def session(request: Request) -> Iterator[Session]:
    with request.app.state.ctx.sessions() as s:
        yield s


def authenticate(request: Request, token: str) -> Caller:
    ctx: Context = request.app.state.ctx
    with ctx.sessions() as s:
        return caller_for_token(db.single_statements(s), token, request.app.state.oidc, request.app.state.jwks)


def caller(request: Request) -> Caller:
    return authenticate(request, bearer(request.headers.get("Authorization")))
