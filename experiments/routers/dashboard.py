"""The dashboard at ``/``: server-rendered HTML (Jinja2, autoescaped), no JavaScript, no build step.

The browser signs in by pasting an API token once; it is kept in an HttpOnly, SameSite=Strict
cookie and checked like a bearer token on every page, so the dashboard shows a tenant exactly
what the API would. The pages only read; cancelling stays an API/CLI action.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qs, urlencode

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape
from sqlalchemy import select

from clusters.derive.pools import derive_gpu_pools
from clusters.derive.tenants import derive_tenants
from experiments.auth import Caller
from experiments.background.context import Context
from experiments.errors import ApiError
from experiments.models import Experiment
from experiments.routers.deps import SESSION_COOKIE, authenticate, context
from experiments.services import experiments as service
from experiments.services import usage as run_usage
from experiments.states import NON_TERMINAL, State

router = APIRouter()
_templates = Environment(loader=FileSystemLoader(Path(__file__).resolve().parent.parent / "templates"), autoescape=select_autoescape(["html"]))


def _page(name: str, status: int = 200, **values: Any) -> HTMLResponse:
    return HTMLResponse(_templates.get_template(name).render(**values), status_code=status)


def _caller(request: Request) -> Caller | None:
    token = request.cookies.get(SESSION_COOKIE)
    if not token:
        return None
    try:
        return authenticate(request, token)
    except ApiError:
        return None


@router.get("/login", response_class=HTMLResponse)
def login_form() -> HTMLResponse:
    return _page("login.html", error=None)


@router.post("/login")
async def login(request: Request) -> Response:
    form = parse_qs((await request.body()).decode(errors="replace"))
    token = (form.get("token") or [""])[0].strip()
    try:
        authenticate(request, token)
    except ApiError as exc:
        return _page("login.html", status=401, error=f"{exc.error}: {exc.fix}")
    response = RedirectResponse("/", status_code=303)
    response.set_cookie(SESSION_COOKIE, token, httponly=True, samesite="strict", secure=request.url.scheme == "https")
    return response


@router.post("/logout")
def logout() -> Response:
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE)
    return response


def _capacity(ctx: Context, who: Caller) -> list[dict[str, Any]]:
    with ctx.sessions() as session:
        held = session.execute(select(Experiment.cluster, Experiment.pool, Experiment.tenant, Experiment.gpus).where(
            Experiment.state.in_([s.value for s in NON_TERMINAL]))).all()
    in_use: dict[tuple[str, str, str], int] = {}
    for cluster, pool, tenant, gpus in held:
        in_use[(cluster, pool, tenant)] = in_use.get((cluster, pool, tenant), 0) + gpus
    rows = []
    for config in sorted(ctx.catalog.configs, key=lambda c: c.name):
        for pool in derive_gpu_pools(config):
            for tenant in derive_tenants(config):
                quota = dict(tenant.gpu_quota).get(pool.name, 0)
                if not who.may_see(tenant.name) or not quota:
                    continue
                rows.append({"cluster": config.name, "pool": pool.name, "gpu": pool.gpu_model, "capacity": pool.capacity_gpus,
                             "tenant": tenant.name, "quota": quota, "in_use": in_use.get((config.name, pool.name, tenant.name), 0)})
    return rows


@router.get("/", response_class=HTMLResponse)
def index(request: Request, ctx: Annotated[Context, Depends(context)], status: str | None = None, tenant: str | None = None,
          job: str | None = None, offset: int = 0) -> Response:
    who = _caller(request)
    if who is None:
        return RedirectResponse("/login", status_code=303)
    state = status if status in {s.value for s in State} else None
    now = ctx.clock()
    try:
        with ctx.sessions() as session:
            rows, total = service.list_visible(session, who, state=state, tenant=tenant or None, job=job or None, limit=100, offset=max(0, offset))
            items = [service.view(e, now=now) for e in rows]
            costs = service.cost_totals(session, who, now=now)
    except ApiError as exc:
        return _page("error.html", status=exc.status, error=exc.error, fix=exc.fix)
    for item, exp in zip(items, rows, strict=True):
        item["age"] = _age((now - exp.created_at).total_seconds())
    filters = {"status": state or "", "tenant": tenant or "", "job": job or ""}
    return _page("index.html", who=who, items=items, total=total, offset=offset, filters=filters, states=[s.value for s in State],
                 capacity=_capacity(ctx, who), costs=costs, next_page=urlencode({**filters, "offset": offset + 100}) if offset + 100 < total else None)


@router.get("/experiments/{experiment_id}", response_class=HTMLResponse)
def detail(experiment_id: str, request: Request, ctx: Annotated[Context, Depends(context)]) -> Response:
    who = _caller(request)
    if who is None:
        return RedirectResponse("/login", status_code=303)
    try:
        with ctx.sessions() as session:
            exp = service.get_visible(session, who, experiment_id)
            item = service.view(exp, now=ctx.clock())
            events = [service.event_view(e) for e in service.events_of(session, exp)]
            points = run_usage.series(session, exp.id)
    except ApiError as exc:
        return _page("error.html", status=exc.status, error=exc.error, fix=exc.fix)
    return _page("detail.html", who=who, item=item, events=events, usage=run_usage.summarize(points), chart=_chart(points))


CHART_WIDTH, CHART_HEIGHT = 320, 80


def _chart(points: list[dict[str, Any]]) -> str:
    """SVG polyline coordinates of mean utilization (0-100 %) over the run's samples, drawn by the
    server (no JavaScript, no build step); an unknown point breaks nothing, it is left out."""
    known = [(p["at"], p["util_mean_pct"]) for p in points if p["util_mean_pct"] is not None]
    if not known:
        return ""
    step = CHART_WIDTH / max(len(known) - 1, 1)
    return " ".join(f"{i * step:.1f},{CHART_HEIGHT - CHART_HEIGHT * min(max(v, 0.0), 100.0) / 100:.1f}" for i, (_, v) in enumerate(known))


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"
