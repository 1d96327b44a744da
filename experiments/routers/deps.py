"""Request-scoped dependencies: the context, a session, and the authenticated caller."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import anyio
from fastapi import Request
from sqlalchemy.orm import Session

from experiments.auth import TOKEN_PREFIX, Caller, bearer, caller_for_token
from experiments.background.context import Context


async def context(request: Request) -> Context:
    """Async: it only reads app state, and FastAPI would run a plain ``def`` dependency on a thread of
    anyio's pool, a thread hop (and a wait for a free thread) on every request."""
    return request.app.state.ctx


def session(request: Request) -> Iterator[Session]:
    with request.app.state.ctx.sessions() as s:
        yield s


def authenticate(request: Request, token: str) -> Caller:
    return caller_for_token(request.app.state.engine, token, request.app.state.oidc, request.app.state.jwks)


def caller(request: Request) -> Caller:
    return authenticate(request, bearer(request.headers.get("Authorization")))


def admission_limiter(request: Request) -> anyio.CapacityLimiter:
    """The threads that run submissions (their token lookup and their admission), apart from anyio's
    default pool of 40 that every other sync route shares: a route that waits on a slow scheduler
    (a log read) never holds back a submit, and a submit burst is not spread over 40 threads. On
    PostgreSQL a submit is two short round trips; 50 of them on 40 threads only queue for the GIL and
    for the one ``pool_usage`` row, and each wake-up costs CPU (docs/submit-path.md, "Threads").
    One limiter per event loop (a test client may run each request on a loop of its own)."""
    limiters = request.app.state.admission_limiters
    loop = asyncio.get_running_loop()
    limiter = limiters.get(loop)
    if limiter is None:
        limiter = limiters[loop] = anyio.CapacityLimiter(request.app.state.admission_threads)
    return limiter


async def admission_caller(request: Request) -> Caller:
    """``caller`` for the submit route: an API token's lookup on the admission threads, anything else
    (an OIDC JWT, or garbage that looks like one) on anyio's default pool, where every route checked
    it before. An OIDC check may wait up to ``JwksTiming.wait_seconds`` for a stalled issuer, and
    ``max_waiters`` (4) of them may wait at once: on the admission threads (4 on PostgreSQL), four
    unauthenticated garbage JWTs would stall every tenant's submit (review of issue 28, round 4)."""
    token = bearer(request.headers.get("Authorization"))
    limiter = admission_limiter(request) if token.startswith(TOKEN_PREFIX) else None
    return await anyio.to_thread.run_sync(authenticate, request, token, limiter=limiter)
