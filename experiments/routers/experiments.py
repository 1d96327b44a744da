"""/api/v1/experiments: parse, authorize, call services.experiments; nothing else."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from experiments.auth import Caller
from experiments.background.context import Context
from experiments.errors import ApiError
from experiments.routers.deps import caller, context
from experiments.scheduler import run_scheduler
from experiments.services import experiments as service
from experiments.services import logs as run_logs
from experiments.services import usage as run_usage
from experiments.states import State

router = APIRouter(prefix="/api/v1")


class SubmitRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    job: str = Field(min_length=1, max_length=128)
    meta: dict[str, str] = Field(default_factory=dict)
    deadline_hours: float | None = None


async def no_duplicate_keys(request: Request, _who: Annotated[Caller, Depends(caller)]) -> None:
    """A JSON body naming a key twice is refused: parsed last-wins, a body naming one job first
    would be submitted as another. Runs after authentication (it depends on ``caller``), and each
    object is checked with a set, so a body of many keys costs its length, not its square."""
    if request.headers.get("content-type", "").split(";")[0].strip().lower() != "application/json":
        return

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: set[str] = set()
        for key, _value in items:
            if key in seen:
                raise ApiError(422, f"body: the key {key!r} appears twice", field=key, fix="send each key once")
            seen.add(key)
        return dict(items)

    try:
        json.loads(await request.body(), object_pairs_hook=pairs)
    except ValueError:
        return  # not JSON: the body's own validation says where


@router.post("/experiments", status_code=202, dependencies=[Depends(no_duplicate_keys)])
def submit(body: SubmitRequest, who: Annotated[Caller, Depends(caller)], ctx: Annotated[Context, Depends(context)],
           idempotency_key: Annotated[str | None, Header(max_length=255)] = None) -> JSONResponse:
    with ctx.sessions() as session:
        exp, created = service.submit(session, ctx.catalog, who, job=body.job, meta=body.meta, deadline_hours=body.deadline_hours,
                                      idempotency_key=idempotency_key, scheduler=run_scheduler(ctx.runner), now=ctx.clock(),
                                      clusters=getattr(ctx.runner, "clusters", None))
    return JSONResponse(service.view(exp, now=ctx.clock()), status_code=202 if created else 200)


@router.get("/experiments")
def list_experiments(who: Annotated[Caller, Depends(caller)], ctx: Annotated[Context, Depends(context)],
                     status: State | None = None, tenant: str | None = None, job: str | None = None,
                     limit: Annotated[int, Query(ge=1, le=service.MAX_PAGE)] = 50, offset: Annotated[int, Query(ge=0)] = 0) -> dict[str, Any]:
    now = ctx.clock()
    with ctx.sessions() as session:
        rows, total = service.list_visible(session, who, state=status.value if status else None, tenant=tenant, job=job, limit=limit, offset=offset)
        items = [service.view(e, now=now) for e in rows]
    return {"items": items, "total": total, "limit": limit, "offset": offset,
            "totals": service.totals(items)}


@router.get("/experiments/{experiment_id}")
def show(experiment_id: str, who: Annotated[Caller, Depends(caller)], ctx: Annotated[Context, Depends(context)]) -> dict[str, Any]:
    with ctx.sessions() as session:
        exp = service.get_visible(session, who, experiment_id)
        return {**service.view(exp, now=ctx.clock()), "gpu_utilization": run_usage.summary(session, exp.id)}


@router.get("/experiments/{experiment_id}/usage")
def usage(experiment_id: str, who: Annotated[Caller, Depends(caller)], ctx: Annotated[Context, Depends(context)]) -> dict[str, Any]:
    """The run's downsampled GPU utilization series and its summary (null where unknown, never 0)."""
    with ctx.sessions() as session:
        exp = service.get_visible(session, who, experiment_id)
        points = run_usage.series(session, exp.id)
        return {"id": exp.id, "summary": run_usage.summarize(points), "series": points}


@router.get("/experiments/{experiment_id}/events")
def events(experiment_id: str, who: Annotated[Caller, Depends(caller)], ctx: Annotated[Context, Depends(context)]) -> dict[str, Any]:
    with ctx.sessions() as session:
        exp = service.get_visible(session, who, experiment_id)
        return {"id": exp.id, "events": [service.event_view(e) for e in service.events_of(session, exp)]}


@router.get("/experiments/{experiment_id}/logs")
def logs(experiment_id: str, who: Annotated[Caller, Depends(caller)], ctx: Annotated[Context, Depends(context)],
         stderr: bool = False, tail: Annotated[int | None, Query(ge=0, le=100_000)] = None) -> dict[str, Any]:
    """The run's stdout (or stderr): live from its scheduler, else the tail kept when it ended."""
    with ctx.sessions() as session:
        exp = service.get_visible(session, who, experiment_id)
        return run_logs.read(session, ctx.runner, exp, stderr=stderr, tail_lines=tail)


@router.post("/experiments/{experiment_id}/cancel", status_code=202)
def cancel(experiment_id: str, who: Annotated[Caller, Depends(caller)], ctx: Annotated[Context, Depends(context)]) -> dict[str, Any]:
    with ctx.sessions() as session:
        exp = service.cancel(session, who, experiment_id, now=ctx.clock())
        return service.view(exp, now=ctx.clock())


@router.get("/costs")
def costs(who: Annotated[Caller, Depends(caller)], ctx: Annotated[Context, Depends(context)]) -> dict[str, Any]:
    """GPU-hours and estimated cost per tenant and per job, over every visible experiment."""
    with ctx.sessions() as session:
        return service.cost_totals(session, who, now=ctx.clock())
