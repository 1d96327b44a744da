"""/healthz (database reachable, worker alive, each bound scheduler answering: ``degraded`` when
one does not or its identity is unconfirmed), /metrics (Prometheus text format, with
``gpufleet_scheduler_up``) and the API schema.

Only /healthz answers without a token (a load balancer's probe; it says ok or which part is
down, nothing about runs). /metrics counts every tenant's runs per state and cluster, so it
needs an admin token (Prometheus: ``authorization: {credentials_file: ...}`` in the scrape
config); the OpenAPI document needs any API token, tenant or admin (issue 22: both answered
anyone who could reach the port).
"""

from __future__ import annotations

import time

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from experiments.auth import Caller
from experiments.errors import ApiError
from experiments.routers.deps import caller

router = APIRouter()
WORKER_STALE_SECONDS = 120
SCHEMA_PATH = "/api/openapi.json"
UNOBSERVED = ("unobserved: this service has not confirmed that the scheduler it reaches is this cluster's; its runs are left alone "
              "here (why: the service log, and each run's reason)")


@router.get("/healthz")
def healthz(request: Request) -> JSONResponse:
    ctx = request.app.state.ctx
    try:
        with ctx.sessions() as session:
            session.execute(text("SELECT 1"))
    except Exception as exc:  # noqa: BLE001 - report any database failure as unhealthy
        return JSONResponse({"status": "unhealthy", "database": type(exc).__name__}, status_code=503)
    schedulers = request.app.state.schedulers.check()
    # A scheduler that does not answer degrades the service (runs wait) but does not make it
    # unhealthy: a load balancer must keep serving reads, logs and cancels recorded for later.
    # Bound clusters whose scheduler identity is not confirmed (or differs): their runs are unobserved here.
    # Only which clusters: the why names scheduler addresses and identities (the service log and
    # each run's reason, both behind authentication, carry it), and /healthz answers anyone.
    unobserved = {cluster: UNOBSERVED for cluster in sorted(getattr(ctx.runner, "blocked", {}))}
    status = "ok" if all(s["answers"] for s in schedulers.values()) and not unobserved else "degraded"
    extra = {"schedulers": schedulers, **({"unobserved": unobserved} if unobserved else {})}
    worker = request.app.state.worker
    if worker is None:
        return JSONResponse({"status": status, "database": "ok", "worker": "disabled (run gpufleet serve --worker-only)", **extra})
    beat = worker.heartbeat
    if beat is not None and time.monotonic() - beat > WORKER_STALE_SECONDS:
        return JSONResponse({"status": "unhealthy", "database": "ok", "worker": f"no pass for {time.monotonic() - beat:.0f}s", **extra}, status_code=503)
    return JSONResponse({"status": status, "database": "ok", "worker": "running" if beat is not None else "starting", **extra})


@router.get("/metrics", include_in_schema=False)
def metrics(request: Request, who: Annotated[Caller, Depends(caller)]) -> Response:
    if not who.admin:
        raise ApiError(403, "/metrics counts every tenant's runs: it needs an admin token", field="Authorization",
                       fix="scrape it with an admin token (gpufleet api token create --admin) in the scrape config's credentials_file")
    return Response(generate_latest(request.app.state.ctx.metrics.registry), media_type=CONTENT_TYPE_LATEST)


@router.get(SCHEMA_PATH, include_in_schema=False)
def openapi(request: Request, _who: Annotated[Caller, Depends(caller)]) -> JSONResponse:
    return JSONResponse(request.app.openapi())
