"""The dashboard at ``/``: server-rendered HTML (Jinja2, autoescaped), no JavaScript, no build step.

The browser signs in by pasting an API token once; it gets a server-side session (a random id in
an HttpOnly, SameSite=Strict, Secure cookie; see services.sessions), never the token itself. The
session acts for its token, so the dashboard shows a tenant exactly what the API would. Every
POST form (sign-in, sign-out, a run's cancel button) carries a CSRF token and must come from this
service's own origin (routers.origin); otherwise it is refused with 403. Cancelling from a run's
page is the API's cancel (``services.experiments.cancel``) for the session's caller: another
tenant's run is a 404 there as everywhere.

A little plain JavaScript (inline, no build step) keeps the pages alive: tables marked
``data-refresh`` are fetched again every few seconds, and a run's page reads its log tail from
``/experiments/{id}/log-tail``, a session-authenticated twin of the API's logs read (the browser
holds a session cookie, never the bearer token the API wants), until the run has ended.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qs, urlencode

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool

from clusters.derive.pools import derive_gpu_pools
from clusters.derive.tenants import derive_tenants
from experiments.auth import Caller, token_row
from experiments.background.context import Context
from experiments.errors import ApiError
from experiments.models import Experiment
from experiments.routers.deps import context
from experiments.routers.origin import same_origin
from experiments.services import experiments as service
from experiments.services import logs as run_logs
from experiments.services import usage as run_usage
from experiments.services import sessions
from experiments.services.sessions import SessionSettings
from experiments.states import NON_TERMINAL, TERMINAL, State

router = APIRouter()
_templates = Environment(loader=FileSystemLoader(Path(__file__).resolve().parent.parent / "templates"), autoescape=select_autoescape(["html"]))


LOGIN_FORM_SECONDS = 3600  # how long a sign-in page may stay open before its form token expires


def _page(name: str, status: int = 200, **values: Any) -> HTMLResponse:
    """no-store: the pages carry CSRF tokens and a tenant's experiments; no cache keeps them."""
    return HTMLResponse(_templates.get_template(name).render(**values), status_code=status, headers={"Cache-Control": "no-store"})


def _settings(request: Request) -> SessionSettings:
    return request.app.state.session_settings


def _set_cookie(response: Response, settings: SessionSettings, name: str, value: str, max_age: int | None = None) -> None:
    response.set_cookie(name, value, max_age=max_age, path="/", httponly=True, samesite="strict", secure=settings.secure_cookie)


def _drop_cookie(response: Response, settings: SessionSettings, name: str) -> None:
    """With the same attributes: a browser ignores a ``__Host-`` cookie's deletion without Secure."""
    response.delete_cookie(name, path="/", httponly=True, samesite="strict", secure=settings.secure_cookie)


def _session(request: Request, ctx: Context) -> tuple[Caller, str] | None:
    """The caller of the browser's live session and its id, or None (then: sign in)."""
    settings = _settings(request)
    raw = request.cookies.get(settings.session_cookie)
    if not raw:
        return None
    with ctx.sessions() as session, session.begin():
        who = sessions.resume(session, raw, ctx.clock(), settings)
    return (who, raw) if who is not None else None


def _field(form: dict[str, list[str]], name: str) -> str:
    return (form.get(name) or [""])[0]


def _login_page(request: Request, status: int = 200, error: str | None = None) -> HTMLResponse:
    """Every rendering gets a new pre-session secret: its cookie and the form's token go together."""
    settings = _settings(request)
    secret = sessions.new_secret()
    response = _page("login.html", status=status, error=error, csrf=sessions.form_token(secret, "login"))
    _set_cookie(response, settings, settings.login_cookie, secret, max_age=LOGIN_FORM_SECONDS)
    return response


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request) -> HTMLResponse:
    return _login_page(request)


@router.post("/login")
async def login(request: Request, ctx: Annotated[Context, Depends(context)]) -> Response:
    settings = _settings(request)
    form = parse_qs((await request.body()).decode(errors="replace"))  # first: an oversized body is a 413 (limits.BodyLimit)
    if not same_origin(request, settings.public_origin):
        return _login_page(request, status=403, error="sign-in refused: the form was not posted from this service's own page; sign in below")
    if not sessions.form_token_ok(request.cookies.get(settings.login_cookie), "login", _field(form, "csrf")):
        return _login_page(request, status=403, error="the sign-in form expired or was not this page's: sign in again below")
    token = _field(form, "token").strip()

    def sign_in() -> str:
        with ctx.sessions() as session, session.begin():
            row = token_row(session, token)
            fixed = request.cookies.get(settings.session_cookie)
            if fixed:
                sessions.end(session, fixed, ctx.clock(), "session replaced by a new sign-in")  # an id from before sign-in is never reused
            return sessions.start(session, row, ctx.clock(), settings)

    try:
        raw = await run_in_threadpool(sign_in)
    except ApiError as exc:
        return _login_page(request, status=401, error=f"{exc.error}: sign in with an API token from `gpufleet api token create --tenant <tenant>`")
    response = RedirectResponse("/", status_code=303)
    _set_cookie(response, settings, settings.session_cookie, raw)
    _drop_cookie(response, settings, settings.login_cookie)
    return response


@router.post("/logout")
async def logout(request: Request, ctx: Annotated[Context, Depends(context)]) -> Response:
    settings = _settings(request)
    form = parse_qs((await request.body()).decode(errors="replace"))  # first: an oversized body is a 413 (limits.BodyLimit)
    if not same_origin(request, settings.public_origin):
        return _page("error.html", status=403, error="sign-out refused: the form was not posted from this service's own page",
                     fix="sign out with the button on the dashboard page")
    raw = request.cookies.get(settings.session_cookie)
    if raw is None or not sessions.form_token_ok(raw, "session", _field(form, "csrf")):
        return _page("error.html", status=403, error="sign-out refused: the form's CSRF token is missing or not this session's",
                     fix="sign out with the button on the dashboard page")

    def sign_out() -> None:
        with ctx.sessions() as session, session.begin():
            sessions.end(session, raw, ctx.clock(), "sign-out")

    await run_in_threadpool(sign_out)
    response = RedirectResponse("/login", status_code=303)
    _drop_cookie(response, settings, settings.session_cookie)
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
    signed_in = _session(request, ctx)
    if signed_in is None:
        return RedirectResponse("/login", status_code=303)
    who, raw = signed_in
    state = status if status in {s.value for s in State} else None
    now = ctx.clock()
    try:
        with ctx.sessions() as session:
            rows, total = service.list_visible(session, who, state=state, tenant=tenant or None, job=job or None, limit=100, offset=max(0, offset))
            items = [service.view(e, now=now) for e in rows]
            costs = service.cost_totals(session, who, now=now, configs=ctx.catalog.configs)
    except ApiError as exc:
        return _page("error.html", status=exc.status, error=exc.error, fix=exc.fix)
    for item, exp in zip(items, rows, strict=True):
        item["age"] = _age((now - exp.created_at).total_seconds())
    filters = {"status": state or "", "tenant": tenant or "", "job": job or ""}
    return _page("index.html", who=who, csrf=sessions.form_token(raw, "session"), items=items, total=total, offset=offset, filters=filters, states=[s.value for s in State],
                 capacity=_capacity(ctx, who), costs=costs, next_page=urlencode({**filters, "offset": offset + 100}) if offset + 100 < total else None)


@router.get("/experiments/{experiment_id}", response_class=HTMLResponse)
def detail(experiment_id: str, request: Request, ctx: Annotated[Context, Depends(context)]) -> Response:
    signed_in = _session(request, ctx)
    if signed_in is None:
        return RedirectResponse("/login", status_code=303)
    who, _raw = signed_in
    try:
        with ctx.sessions() as session:
            exp = service.get_visible(session, who, experiment_id)
            item = service.view(exp, now=ctx.clock())
            attempts = service.attempts_of(session, exp, now=ctx.clock())
            events = [service.event_view(e) for e in service.events_of(session, exp)]
            points = run_usage.series(session, exp.id)
    except ApiError as exc:
        return _page("error.html", status=exc.status, error=exc.error, fix=exc.fix)
    return _page("detail.html", who=who, item=item, attempts=attempts, events=events, usage=run_usage.summarize(points), chart=_chart(points),
                 csrf=sessions.form_token(_raw, "session"), cancellable=State(item["status"]) not in TERMINAL)


@router.post("/experiments/{experiment_id}/cancel")
async def cancel(experiment_id: str, request: Request, ctx: Annotated[Context, Depends(context)]) -> Response:
    """The run page's cancel button: the session's own form token (the one sign-out uses) and this
    service's origin, else 403 before anything is read; then the API's cancel for the session's caller."""
    settings = _settings(request)
    form = parse_qs((await request.body()).decode(errors="replace"))  # first: an oversized body is a 413 (limits.BodyLimit)
    fix = "cancel with the button on the run's page (reload it first)"
    if not same_origin(request, settings.public_origin):
        return _page("error.html", status=403, error="cancel refused: the form was not posted from this service's own page", fix=fix)
    raw = request.cookies.get(settings.session_cookie)
    if raw is None or not sessions.form_token_ok(raw, "session", _field(form, "csrf")):
        return _page("error.html", status=403, error="cancel refused: the form's CSRF token is missing or not this session's", fix=fix)

    def cancel_as_caller() -> Response:
        signed_in = _session(request, ctx)
        if signed_in is None:
            return RedirectResponse("/login", status_code=303)
        who, _ = signed_in
        with ctx.sessions() as session:
            exp = service.cancel(session, who, experiment_id, now=ctx.clock())
            return RedirectResponse(f"/experiments/{exp.id}", status_code=303)

    try:
        return await run_in_threadpool(cancel_as_caller)
    except ApiError as exc:
        return _page("error.html", status=exc.status, error=exc.error, fix=exc.fix)


LOG_TAIL_LINES = 200  # what a run's page shows: the API and the CLI read more


@router.get("/experiments/{experiment_id}/log-tail", response_class=PlainTextResponse)
def log_tail(experiment_id: str, request: Request, ctx: Annotated[Context, Depends(context)]) -> Response:
    """The run's last stdout lines of rank 0, masked (``services.logs.read`` passes every line
    through the secret detector), as text for the run page's script; tenant-scoped like the page
    (another tenant's run is a 404). ``X-Gpufleet-Run-Ended`` tells the script to stop following."""
    signed_in = _session(request, ctx)
    if signed_in is None:
        return PlainTextResponse("sign in again\n", status_code=401, headers={"Cache-Control": "no-store"})
    who, _raw = signed_in
    query = run_logs.LogQuery(rank=0, stderr=False, tail_lines=LOG_TAIL_LINES, since_seconds=None, tail_bytes=ctx.timing.log_tail_bytes)
    try:
        with ctx.sessions() as session:
            exp = service.get_visible(session, who, experiment_id)
            answer = run_logs.read(session, ctx.runner, exp, query)
            ended = State(exp.state) in TERMINAL
    except ApiError as exc:
        return PlainTextResponse(f"{exc.error}\n", status_code=exc.status, headers={"Cache-Control": "no-store"})
    return PlainTextResponse("".join(f"{line}\n" for line in answer["lines"]), headers={
        "Cache-Control": "no-store", "X-Gpufleet-Log-Source": answer["source"], "X-Gpufleet-Run-Ended": "true" if ended else "false"})


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
