"""/api/v1/experiments: parse, authorize, call services.experiments; nothing else."""

from __future__ import annotations

import json
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from experiments.auth import Caller
from experiments.background.context import Context
from experiments.errors import ApiError
from experiments.limits import MAX_BODY_BYTES
from experiments.routers.deps import admission_caller, admission_limiter, caller, context
from experiments.scheduler import run_scheduler
from experiments.services import experiments as service
from experiments.services import logs as run_logs
from experiments.services import usage as run_usage
from experiments.states import State
from jobs.durations import NS_PER_SECOND, parse_duration_ns

router = APIRouter(prefix="/api/v1")


class SubmitRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    job: str | None = Field(default=None, min_length=1, max_length=128)
    job_file: str | None = Field(default=None, min_length=1, max_length=MAX_BODY_BYTES,
                                 description="an ad-hoc job file's YAML text, instead of job (tenants with adhoc_jobs: true)")
    meta: dict[str, str] = Field(default_factory=dict)
    deadline_hours: float | None = None


async def no_duplicate_keys(request: Request, _who: Annotated[Caller, Depends(admission_caller)]) -> None:
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
async def submit(request: Request, body: SubmitRequest, who: Annotated[Caller, Depends(admission_caller)], ctx: Annotated[Context, Depends(context)],
                 idempotency_key: Annotated[str | None, Header(max_length=255)] = None) -> JSONResponse:
    # Authenticated and admitted on the admission threads (``deps.admission_limiter``); a submit that would
    # wait on its tenant's budget lock is admitted on anyio's default pool (``service.waits_on_a_budget_lock``).
    # A comment, not the docstring: FastAPI publishes a route's docstring as its API description.
    if (body.job is None) == (body.job_file is None):
        what = "add it" if body.job is None else "send one of them, not both"
        raise ApiError(422, "job: required field is missing" if body.job is None else "job and job_file together", field="job",
                       fix=f"{what}: job names a file of jobs/; job_file is instead an ad-hoc job file's text (gpufleet exp submit -f)")

    def admit(on_admission_threads: bool) -> JSONResponse | None:
        with ctx.sessions() as session:
            if on_admission_threads and service.waits_on_a_budget_lock(session, ctx.catalog, who, body.job if body.job_file is None else None):
                return None  # it would wait on its tenant's budget lock: on the default pool (below), not on these threads
            exp, created = service.submit(session, ctx.catalog, who, job=body.job, job_file=body.job_file, meta=body.meta,
                                          deadline_hours=body.deadline_hours, idempotency_key=idempotency_key, scheduler=run_scheduler(ctx.runner),
                                          now=ctx.clock(), clusters=getattr(ctx.runner, "clusters", None))
        return JSONResponse(service.view(exp, now=ctx.clock()), status_code=202 if created else 200)

    answer = await anyio.to_thread.run_sync(admit, True, limiter=admission_limiter(request))
    if answer is None:
        answer = await anyio.to_thread.run_sync(admit, False)
    return answer


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
        return {**service.view(exp, now=ctx.clock()), "attempts": service.attempts_of(session, exp, now=ctx.clock()),
                "gpu_utilization": run_usage.summary(session, exp.id)}


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


@router.get("/experiments/{experiment_id}/logs", response_model=None)
def logs(experiment_id: str, who: Annotated[Caller, Depends(caller)], ctx: Annotated[Context, Depends(context)],
         stderr: bool = False, tail: Annotated[int | None, Query(ge=0, le=100_000)] = None,
         rank: Annotated[int | None, Query(ge=0, le=10_000)] = None, all_ranks: bool = False,
         since: Annotated[str | None, Query(max_length=32)] = None, follow: bool = False) -> dict[str, Any] | StreamingResponse:
    """The run's stdout (or stderr) per rank: live from its scheduler, else the tail kept in the
    database; ``follow=true`` streams text/plain lines until the run ended."""
    query = run_logs.LogQuery(rank=None if all_ranks else (rank or 0), stderr=stderr, tail_lines=tail, since_seconds=_seconds(since),
                              tail_bytes=ctx.timing.log_tail_bytes)
    if all_ranks and rank is not None:
        raise ApiError(422, "rank and all_ranks together", field="rank", fix="give one rank (rank=N) or all_ranks=true, not both")
    with ctx.sessions() as session:
        exp = service.get_visible(session, who, experiment_id)
        lines = run_logs.follow(ctx.sessions, ctx.runner, exp, query, limit=ctx.timing.max_follows_per_tenant) if follow else None
        if lines is None:
            answer = run_logs.read(session, ctx.runner, exp, query)
            if not follow:
                return answer
            return StreamingResponse(iter(["".join(f"{line}\n" for line in answer["lines"])]), media_type="text/plain; charset=utf-8",
                                     headers={"X-Gpufleet-Log-Source": answer["source"]})
    return StreamingResponse(lines, media_type="text/plain; charset=utf-8", headers={"X-Gpufleet-Log-Source": "scheduler"})


def _seconds(since: str | None) -> int | None:
    """``since`` as people write durations ("90s", "10m", "2h"), in whole seconds."""
    if since is None:
        return None
    try:
        return max(1, parse_duration_ns(since) // NS_PER_SECOND)
    except ValueError as exc:
        raise ApiError(422, f"since: {exc}", field="since", fix="write a duration like 90s, 10m or 2h") from None


@router.post("/experiments/{experiment_id}/cancel", status_code=202)
def cancel(experiment_id: str, who: Annotated[Caller, Depends(caller)], ctx: Annotated[Context, Depends(context)]) -> dict[str, Any]:
    with ctx.sessions() as session:
        exp = service.cancel(session, who, experiment_id, now=ctx.clock())
        return service.view(exp, now=ctx.clock())


@router.get("/costs")
def costs(who: Annotated[Caller, Depends(caller)], ctx: Annotated[Context, Depends(context)]) -> dict[str, Any]:
    """GPU-hours and estimated cost per tenant and per job, over every visible experiment, and each visible tenant's budget this month."""
    with ctx.sessions() as session:
        return service.cost_totals(session, who, now=ctx.clock(), configs=ctx.catalog.configs)
