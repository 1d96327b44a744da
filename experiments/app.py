"""Builds the FastAPI app of ``gpufleet serve``: the database (migrated to head at start),
the runner, the catalog of checked jobs, the metrics and, unless disabled, the worker thread.

Everything is passed in (runner, clock, catalog) so tests drive the same app against the
Nomad double, a real OpenBao and a fake clock; only ``gpufleet serve`` reads the environment.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
import weakref

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException

from clusters.secrets import detect
from experiments import db
from experiments.auth import OidcSettings
from experiments.background.context import Context, Timing, log
from experiments.binding import confirm as confirm_bindings
from experiments.background.worker import Worker
from experiments.errors import ApiError
from experiments.health import SchedulerHealth
from experiments.jwks import JwksCache
from experiments.limits import MAX_BODY_BYTES, BodyLimit
from experiments.metrics import Metrics
from experiments.routers.ops import SCHEMA_PATH
from jobs.runner import Runner
from experiments.services import cost
from experiments.services.catalog import Catalog
from experiments.services.sessions import SessionSettings


def utcnow() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


@dataclass(frozen=True)
class ServiceSettings:
    db_url: str
    worker: bool = True
    timing: Timing = field(default_factory=Timing)
    oidc: OidcSettings | None = None
    max_body_bytes: int = MAX_BODY_BYTES
    sessions: SessionSettings = field(default_factory=SessionSettings)
    # Threads that run submissions (routers.deps.admission_limiter); None: ADMISSION_THREADS of the database.
    admission_threads: int | None = None


# PostgreSQL: a submit is two short round trips, so 4 threads keep the one core of this process busy,
# and more only queue for the GIL and the pool_usage row (docs/submit-path.md, "Threads"). SQLite: anyio's
# default of 40, as every route had before (its writers wait in SQLite's busy handler, off the GIL).
ADMISSION_THREADS = {"postgresql": 4, "sqlite": 40}


def _field_of(loc: tuple[Any, ...]) -> str:
    """The field path of a validation error; a key that looks like a credential is not echoed."""
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    return ".".join("<credential>" if detect(p) else p for p in parts) or "body"


_FIXES = {
    "missing": "add it",
    "extra_forbidden": "remove it; allowed fields: job, meta, deadline_hours",
    "string_type": "send a string",
    "dict_type": "send a JSON object of strings",
    "float_parsing": "send a number",
    "json_invalid": "send a JSON body",
    "model_attributes_type": "send a JSON object like {\"job\": \"finetune-llama\", \"meta\": {...}}",
}


def create_app(settings: ServiceSettings, *, runner: Runner, catalog: Catalog | None = None, clock: Callable[[], datetime] = utcnow) -> FastAPI:
    from experiments.routers import dashboard, experiments, ops

    engine = db.make_engine(settings.db_url)
    db.upgrade(engine)
    cost.prices_at_start()  # read once here: otherwise each of the first concurrent submits parses prices.yaml
    sessions = db.session_factory(engine)
    metrics = Metrics(sessions, clock, runner)
    health = SchedulerHealth(runner)
    metrics.registry.register(health)
    ctx = Context(sessions=sessions, runner=runner, catalog=catalog or Catalog(), clock=clock, metrics=metrics, timing=settings.timing)
    worker = Worker(ctx) if settings.worker else None
    jwks = JwksCache(settings.oidc.jwks_url, settings.oidc.jwks_timing) if settings.oidc is not None else None

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        confirm_bindings(runner, sessions, clock())
        for why in sorted(getattr(runner, "blocked", {}).values()):
            log.warning("starting degraded: %s", why)  # the worker keeps checking; /healthz says so meanwhile
        if worker is not None:
            worker.start()
        if jwks is not None:
            jwks.start()
        try:
            yield
        finally:
            if jwks is not None:
                jwks.stop()
            if worker is not None:
                worker.stop()
            engine.dispose()

    # No public schema or docs page: /api/openapi.json is served by ops.router to authenticated callers
    # (issue 22), and the Swagger page (scripts from a CDN, no token header) is not served at all.
    app = FastAPI(title="gpufleet experiments", version="1", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.ctx = ctx
    app.state.worker = worker
    app.state.schedulers = health
    app.state.engine = engine
    app.state.oidc = settings.oidc
    app.state.jwks = jwks
    app.state.session_settings = settings.sessions
    app.state.admission_threads = settings.admission_threads or ADMISSION_THREADS[engine.dialect.name]
    app.state.admission_limiters = weakref.WeakKeyDictionary()  # event loop -> its limiter
    # Outermost (added last): the limit holds before authentication and before any body parsing.
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    def _unavailable() -> JSONResponse:
        return JSONResponse({"error": "the database is unavailable right now", "field": None,
                             "fix": "retry in a few seconds; a submission retried with the same Idempotency-Key returns its experiment if it was created"},
                            status_code=503, headers={"Retry-After": "2"})

    @app.exception_handler(OperationalError)
    async def _database_unavailable(_request: Request, exc: OperationalError) -> JSONResponse:
        """The database connection failed under a request: a restart, a terminated backend, a server
        not accepting connections yet (issue 28 dropped pre-ping: an idle connection the server closed is
        replaced at checkout, one killed while in use fails here). A 503 with Retry-After, never the
        exception's text: it carries the SQL, its parameters and the server's context lines. A submission's
        one statement may have committed before the answer was lost, so the fix names the key."""
        log.warning("database error under a request, answered 503: %s (SQLSTATE %s)", type(exc.orig).__name__, getattr(exc.orig, "sqlstate", None))
        return _unavailable()

    @app.exception_handler(PoolTimeout)
    async def _pool_exhausted(_request: Request, exc: PoolTimeout) -> JSONResponse:
        """No pooled connection came free within the pool's timeout (30 s). On SQLite the 40 admission
        threads and anyio's 40 default ones share a pool of 60, so under a long write lock 80 requests may
        wait for one. The database is unavailable for now: the same 503, not a 500 with a traceback."""
        log.warning("no database connection free under a request, answered 503: %s", type(exc).__name__)
        return _unavailable()

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        loc = tuple(first.get("loc", ()))
        kind = str(first.get("type", ""))
        media = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if loc[:1] == ("body",) and media != "application/json":
            return JSONResponse({"error": f"body: sent as {media or 'no Content-Type'}, not JSON", "field": "body",
                                 "fix": "send the body as JSON with the header Content-Type: application/json"}, status_code=422)
        if kind == "json_invalid":
            offset = loc[1] if len(loc) > 1 and isinstance(loc[1], int) else 0
            text = (await request.body())[:offset].decode("utf-8", errors="replace")
            line, column = text.count("\n") + 1, offset - (text.rfind("\n") + 1) + 1
            why = str((first.get("ctx") or {}).get("error", "invalid JSON"))
            return JSONResponse({"error": f"body: not valid JSON at line {line}, column {column} ({why})", "field": "body",
                                 "fix": "send one JSON object like {\"job\": \"finetune-llama\", \"meta\": {...}}"}, status_code=422)
        where = _field_of(loc)
        error = f"{where}: {'missing' if kind == 'missing' else 'not allowed' if kind == 'extra_forbidden' else 'wrong type or value'}"
        return JSONResponse({"error": error, "field": where, "fix": _FIXES.get(kind, f"see GET {SCHEMA_PATH} (with your token) for the request schema")}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        fix = (f"see GET {SCHEMA_PATH} (with your token) for the routes" if exc.status_code in (404, 405)
               else f"send a smaller body: a submission is a job name (or a job file of at most {settings.max_body_bytes // 1024} KiB), meta and a deadline" if exc.status_code == 413 else "retry later")
        return JSONResponse({"error": str(exc.detail).lower(), "field": None, "fix": fix}, status_code=exc.status_code)

    app.include_router(experiments.router)
    app.include_router(ops.router)
    app.include_router(dashboard.router)
    return app
