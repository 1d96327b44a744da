"""/healthz (database reachable, worker alive, each bound scheduler answering: ``degraded`` when
one does not) and /metrics (Prometheus text format, with ``gpufleet_scheduler_up``)."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

router = APIRouter()
WORKER_STALE_SECONDS = 120


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
    status = "ok" if all(s["answers"] for s in schedulers.values()) else "degraded"
    worker = request.app.state.worker
    if worker is None:
        return JSONResponse({"status": status, "database": "ok", "worker": "disabled (run gpufleet serve --worker-only)", "schedulers": schedulers})
    beat = worker.heartbeat
    if beat is not None and time.monotonic() - beat > WORKER_STALE_SECONDS:
        return JSONResponse({"status": "unhealthy", "database": "ok", "worker": f"no pass for {time.monotonic() - beat:.0f}s", "schedulers": schedulers},
                            status_code=503)
    return JSONResponse({"status": status, "database": "ok", "worker": "running" if beat is not None else "starting", "schedulers": schedulers})


@router.get("/metrics")
def metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.ctx.metrics.registry), media_type=CONTENT_TYPE_LATEST)
