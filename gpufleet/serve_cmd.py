"""``gpufleet serve`` (the experiments control plane) and ``gpufleet api token create|list|revoke``.

The service reads NOMAD_*, KUBECONFIG/GPUFLEET_KUBE_CONTEXT (GKE), GPUFLEET_PROMETHEUS_URL (GKE
runs' GPU utilization, docs/observe.md) and VAULT_ADDR/VAULT_TOKEN (the orchestrator's token: it
lives only in this process) from its environment. ``--db`` picks the database: empty for SQLite in
.gpufleet/experiments.db, or a postgresql:// URL. The token work lives in
``experiments.services.tokens`` and the ``--oidc-config`` reader in ``experiments.oidc_settings``;
these commands parse, call and print.
"""

from __future__ import annotations

from pathlib import Path

import typer
from gpufleet.console import make_console
from rich.table import Table

from clusters.errors import UserError

console = make_console()
DbOption = typer.Option(None, "--db", envvar="GPUFLEET_DB", help="postgresql://user@host/db or sqlite:///file.db (default .gpufleet/experiments.db).")


def _session_settings(host: str, *, insecure_cookie: bool, idle_hours: float, max_hours: float, public_origin: str | None = None):  # type: ignore[no-untyped-def]
    """Secure cookies unless the operator asks otherwise for a service only this machine reaches:
    on any other address a cookie without Secure would travel in clear over plain http."""
    import ipaddress

    from experiments.routers.origin import origin_key
    from experiments.services.sessions import SessionSettings

    if public_origin is not None and (origin_key(public_origin) is None or public_origin.rstrip("/").count("/") != 2):
        raise UserError(f"--public-origin {public_origin}: not an origin; give the scheme, host and port the browser uses and nothing else, "
                        "e.g. --public-origin https://gpufleet.example.com")
    if insecure_cookie:
        try:
            loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise UserError(f"--insecure-cookie with --host {host}: dashboard cookies without Secure are allowed only on a loopback address; "
                            "drop --insecure-cookie (serve https, e.g. behind a TLS proxy) or bind --host 127.0.0.1")
    if idle_hours > max_hours:
        raise UserError(f"--session-idle-hours {idle_hours:g} is longer than --session-max-hours {max_hours:g}; the idle limit must not exceed the absolute one")
    return SessionSettings(idle_hours=idle_hours, max_hours=max_hours, secure_cookie=not insecure_cookie,
                           public_origin=public_origin.rstrip("/") if public_origin else None)


def cmd_serve(
    db: str | None = DbOption,
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8080, "--port", min=1, max=65535),
    scheduler: str = typer.Option("clusters", "--scheduler", help="clusters: each job to its cluster's scheduler (Nomad via NOMAD_ADDR..., GKE via kubeconfig); local: runs on this machine like jobs run-local (development only)."),
    nomad_cluster: str | None = typer.Option(None, "--nomad-cluster", envvar="GPUFLEET_NOMAD_CLUSTER", help="The Nomad cluster NOMAD_ADDR points at (default: the only Nomad cluster in clusters/)."),
    gke_cluster: str | None = typer.Option(None, "--gke-cluster", envvar="GPUFLEET_GKE_CLUSTER", help="The GKE cluster the kubeconfig context (GPUFLEET_KUBE_CONTEXT, or in-cluster) points at; without it GKE jobs are refused."),
    no_worker: bool = typer.Option(False, "--no-worker", help="Serve the API only; run the dispatcher/reconciler elsewhere (--worker-only)."),
    worker_only: bool = typer.Option(False, "--worker-only", help="Run only the dispatcher, reconciler and reaper, no HTTP."),
    poll_seconds: float = typer.Option(2.0, "--poll-seconds", min=0.1, help="Seconds between background passes."),
    oidc_config: Path | None = typer.Option(None, "--oidc-config", help="YAML: issuer, audience, jwks_url, claim, tenants (claim value: tenant), admin_values."),
    session_idle_hours: float = typer.Option(8.0, "--session-idle-hours", min=0.05, help="A dashboard session unused this long ends."),
    session_max_hours: float = typer.Option(24.0, "--session-max-hours", min=0.05, help="A dashboard session ends this long after sign-in, used or not."),
    insecure_cookie: bool = typer.Option(False, "--insecure-cookie", help="Dashboard cookies without Secure, for a browser that refuses Secure cookies on plain http://127.0.0.1; only with a loopback --host."),
    public_origin: str | None = typer.Option(None, "--public-origin", help="The dashboard's origin as the browser sees it (e.g. https://gpufleet.example.com) when a proxy stands in front; sign-in and sign-out are accepted only from it. Default: the request's own scheme and Host."),
    retry_backoff_seconds: float = typer.Option(30.0, "--retry-backoff-seconds", min=0.0,
                                                help="Wait before a retried run's next attempt, doubled per attempt up to 10 minutes (docs/survive.md)."),
    local_xid_at_step: int | None = typer.Option(None, "--local-xid-at-step", min=1,
                                                 help="--scheduler local only, for demos: the first attempt of each run exits as if its GPU failed (XID) at this training step."),
    log_tail_kib: int = typer.Option(256, "--log-tail-kib", envvar="GPUFLEET_LOG_TAIL_KIB", min=1, max=16384,
                                     help="KiB of each run's output kept in the database per rank and stream (docs/logs.md)."),
    max_follows: int = typer.Option(32, "--max-follows-per-tenant", envvar="GPUFLEET_MAX_FOLLOWS_PER_TENANT", min=1, max=10000,
                                    help="Log follows of one tenant's runs open at once; one more is a 429 (docs/logs.md)."),
    allow_degraded: bool = typer.Option(False, "--allow-degraded", envvar="GPUFLEET_ALLOW_DEGRADED",
                                        help="Start even when a bound cluster's scheduler does not answer; /healthz and gpufleet_scheduler_up say so until it does."),
) -> None:
    """Run the experiments control plane: API, dashboard at /, and the background worker."""
    import logging

    from experiments.app import ServiceSettings, create_app
    from experiments.background.context import Timing
    from experiments.db import database_url
    from experiments.oidc_settings import load_oidc_settings
    from experiments.runner_local import vault_env

    if no_worker and worker_only:
        raise UserError("--no-worker and --worker-only exclude each other; pick one")
    sessions = _session_settings(host, insecure_cookie=insecure_cookie, idle_hours=session_idle_hours, max_hours=session_max_hours,
                                 public_origin=public_origin)
    if local_xid_at_step is not None and scheduler != "local":
        raise UserError("--local-xid-at-step is a demo knob of --scheduler local; drop it or add --scheduler local")
    runner = _runner(scheduler, vault_env(), nomad_cluster=nomad_cluster, gke_cluster=gke_cluster, xid_at_step=local_xid_at_step)
    _refuse_silent_schedulers(runner, allow_degraded=allow_degraded)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = ServiceSettings(db_url=database_url(db), worker=not no_worker, timing=Timing(poll_seconds=poll_seconds, log_tail_bytes=log_tail_kib * 1024,
                                                                                           retry_backoff_seconds=retry_backoff_seconds,
                                                                                           max_follows_per_tenant=max_follows),
                               oidc=load_oidc_settings(oidc_config, _fleet_tenants), sessions=sessions)
    app = create_app(settings, runner=runner)
    if worker_only:
        import signal

        worker = app.state.worker  # the lifespan that would start it runs only under uvicorn
        console.print("worker only: dispatch in one loop, reconcile and reap in another (Ctrl-C stops)")
        signal.signal(signal.SIGTERM, _interrupt)  # systemd and Kubernetes stop with SIGTERM: leave cleanly, as Ctrl-C does
        try:  # start() writes the first heartbeat: a SIGTERM from then on must leave cleanly too
            worker.start()
            worker.wait()
        except KeyboardInterrupt:
            worker.stop()
        return
    import uvicorn

    uvicorn.run(app, host=host, port=port, log_level="info", access_log=False)


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def _fleet_tenants() -> list[str]:
    """Every tenant some cluster file defines (what an OIDC claim value may map to)."""
    from clusters import load_all
    from clusters.derive.tenants import derive_tenants

    return [t.name for config in load_all() for t in derive_tenants(config)]


def _refuse_silent_schedulers(runner: object, *, allow_degraded: bool) -> None:
    """Ask each bound cluster's scheduler once before serving: a service that would accept runs it
    cannot dispatch refuses to start (one line, the fix), unless ``--allow-degraded`` says to serve
    anyway; the worker keeps asking and /healthz reports it meanwhile (experiments.binding)."""
    from jobs.runner import SchedulerUnavailable

    for cluster, member in sorted(getattr(runner, "members", {}).items()):
        kind = runner.clusters[cluster]  # type: ignore[attr-defined]
        try:
            member.identity()
        except SchedulerUnavailable as exc:
            where = "NOMAD_ADDR, NOMAD_TOKEN and NOMAD_CACERT/NOMAD_CLIENT_CERT" if kind == "nomad" else "the kube context (GPUFLEET_KUBE_CONTEXT)"
            why = " ".join(str(exc).split())[:300]
            if not allow_degraded:
                raise UserError(f"cluster {cluster}: its {kind} scheduler does not answer ({why}); check {where} (gpufleet doctor checks them),"
                                " or start with --allow-degraded to serve anyway (/healthz says degraded until it answers)") from None
            console.print(f"warning: cluster {cluster}: its {kind} scheduler does not answer ({why}); starting degraded (--allow-degraded)")


def _runner(scheduler: str, environ: dict[str, str], *, nomad_cluster: str | None = None, gke_cluster: str | None = None,  # type: ignore[no-untyped-def]
            xid_at_step: int | None = None):
    if scheduler == "local":
        from experiments.runner_local import LocalRunner

        return LocalRunner(environ, xid_at_step=xid_at_step)
    if scheduler in ("clusters", "nomad"):  # "nomad": the option's value before GKE (same routing; GKE only with --gke-cluster)
        from clusters import load_all
        from experiments.scheduler import build_runners, describe

        runners = build_runners(load_all(), environ, nomad_cluster=nomad_cluster, gke_cluster=gke_cluster)
        console.print(f"dispatching to: {describe(runners.clusters)}")
        return runners
    raise UserError(f"--scheduler {scheduler!r} is not supported; allowed: clusters (each job to its cluster's scheduler), local")


def cmd_token_create(
    tenant: str | None = typer.Option(None, "--tenant", help="The tenant this token acts for."),
    admin: bool = typer.Option(False, "--admin", help="A token that sees and cancels every tenant's experiments."),
    name: str = typer.Option("", "--name", help="A note for `token list`, e.g. who holds it."),
    db: str | None = DbOption,
    quiet: bool = typer.Option(False, "--quiet", help="Print only the token (for scripts)."),
) -> None:
    """Create a bearer token; it is shown once and stored only as a hash."""
    from clusters import load_all
    from experiments.app import utcnow
    from experiments.db import database_url
    from experiments.services.tokens import create_token, holder

    token_id, token = create_token(database_url(db), tenant=tenant, admin=admin, name=name, load_configs=load_all, actor=_operator(), now=utcnow())
    if quiet:
        print(token)
        return
    console.print(f"token {token_id} for {holder(tenant=tenant, admin=admin)} (shown once, stored as a SHA-256 hash):")
    print(token)


def cmd_token_list(db: str | None = DbOption,
                   as_json: bool = typer.Option(False, "--json", help="Print a JSON list instead of the table (for scripts).")) -> None:
    """Tokens by id, tenant and state (never the tokens themselves)."""
    import json

    from experiments.db import database_url
    from experiments.services.tokens import list_tokens

    if as_json:
        rows = [{"id": row.id, "tenant": row.tenant, "admin": row.admin, "name": row.name, "created_at": row.created_at.isoformat(),
                 "revoked_at": row.revoked_at.isoformat() if row.revoked_at else None} for row in list_tokens(database_url(db))]
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table(title="API tokens")
    for column in ("id", "tenant", "admin", "name", "created", "revoked"):
        table.add_column(column)
    for row in list_tokens(database_url(db)):
        table.add_row(row.id, row.tenant or "-", "yes" if row.admin else "", row.name, f"{row.created_at:%Y-%m-%d %H:%M}", f"{row.revoked_at:%Y-%m-%d %H:%M}" if row.revoked_at else "")
    console.print(table)


def cmd_token_revoke(token_id: str = typer.Argument(..., help="The id shown by `token create` / `token list`."), db: str | None = DbOption) -> None:
    """Revoke a token at once; requests with it get 401 and its dashboard sessions end."""
    from experiments.app import utcnow
    from experiments.db import database_url
    from experiments.services.tokens import revoke_token

    ended = revoke_token(database_url(db), token_id, actor=_operator(), now=utcnow())
    console.print(f"revoked token {token_id}; ended {ended} dashboard sessions")


def _operator() -> str:
    """Who ran a token command, for the audit trail (the OS user; tokens are made on the service host)."""
    import getpass

    return f"cli:{getpass.getuser()}"


def register(app: typer.Typer) -> None:
    app.command("serve")(cmd_serve)
    api = typer.Typer(help="The control plane's API access: tokens.", no_args_is_help=True)
    token = typer.Typer(help="Bearer tokens per tenant: create (shown once), list, revoke.", no_args_is_help=True)
    token.command("create")(cmd_token_create)
    token.command("list")(cmd_token_list)
    token.command("revoke")(cmd_token_revoke)
    api.add_typer(token, name="token")
    app.add_typer(api, name="api")


