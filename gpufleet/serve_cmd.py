"""``gpufleet serve`` (the experiments control plane) and ``gpufleet api token create|list|revoke``.

The service reads NOMAD_*, KUBECONFIG/GPUFLEET_KUBE_CONTEXT (GKE) and VAULT_ADDR/VAULT_TOKEN
(the orchestrator's token: it lives only in this process) from its environment. ``--db`` picks the database: empty for SQLite in
.gpufleet/experiments.db, or a postgresql:// URL.
"""

from __future__ import annotations

from pathlib import Path

import typer
from gpufleet.console import make_console
from rich.table import Table

from clusters.errors import UserError

console = make_console()
DbOption = typer.Option(None, "--db", envvar="GPUFLEET_DB", help="postgresql://user@host/db or sqlite:///file.db (default .gpufleet/experiments.db).")


def _trusted_jwks_url(url: str) -> bool:
    """https anywhere, plain http only to this machine's loopback (a local test issuer). The host
    is parsed, not prefix-matched: ``http://127.0.0.1@attacker.example/`` is attacker.example."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        host = parts.hostname
        parts.port  # noqa: B018  (raises on a malformed port)
    except ValueError:
        return False
    if not host or parts.username is not None or parts.password is not None:
        return False
    return parts.scheme == "https" or (parts.scheme == "http" and host in ("127.0.0.1", "::1", "localhost"))


def _oidc(path: Path | None):  # type: ignore[no-untyped-def]
    if path is None:
        return None
    from ruamel.yaml import YAML

    from experiments.auth import OidcSettings

    if not path.is_file():
        raise UserError(f"--oidc-config {path} is not a file; write issuer, audience, jwks_url, claim and tenants (claim value: tenant) in YAML")
    data = YAML(typ="safe").load(path.read_text()) or {}
    missing = [k for k in ("issuer", "audience", "jwks_url", "claim", "tenants") if k not in data]
    if missing:
        raise UserError(f"{path}: missing {', '.join(missing)}; required: issuer, audience, jwks_url, claim, tenants (claim value -> tenant), optional admin_values")
    if not _trusted_jwks_url(str(data["jwks_url"])):
        raise UserError(f"{path}: jwks_url {data['jwks_url']!r} must be https:// (keys fetched over plain http could be swapped); use the issuer's https JWKS URL")
    return OidcSettings(issuer=str(data["issuer"]), audience=str(data["audience"]), jwks_url=str(data["jwks_url"]), claim=str(data["claim"]),
                        tenants=tuple(sorted((str(k), str(v)) for k, v in dict(data["tenants"]).items())),
                        admin_values=tuple(sorted(str(v) for v in data.get("admin_values") or ())))


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
    log_tail_kib: int = typer.Option(256, "--log-tail-kib", envvar="GPUFLEET_LOG_TAIL_KIB", min=1, max=16384,
                                     help="KiB of each run's output kept in the database per rank and stream (docs/logs.md)."),
) -> None:
    """Run the experiments control plane: API, dashboard at /, and the background worker."""
    import logging

    from experiments.app import ServiceSettings, create_app
    from experiments.background.context import Timing
    from experiments.db import database_url
    from experiments.runner_local import vault_env

    if no_worker and worker_only:
        raise UserError("--no-worker and --worker-only exclude each other; pick one")
    runner = _runner(scheduler, vault_env(), nomad_cluster=nomad_cluster, gke_cluster=gke_cluster)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = ServiceSettings(db_url=database_url(db), worker=not no_worker, timing=Timing(poll_seconds=poll_seconds, log_tail_bytes=log_tail_kib * 1024), oidc=_oidc(oidc_config))
    app = create_app(settings, runner=runner)
    if worker_only:
        import time

        from experiments.background.worker import run_once

        console.print("worker only: dispatch, reconcile and reap (Ctrl-C stops)")
        try:
            while True:
                run_once(app.state.ctx)
                time.sleep(poll_seconds)
        except KeyboardInterrupt:
            return
    import uvicorn

    uvicorn.run(app, host=host, port=port, log_level="info", access_log=False)


def _runner(scheduler: str, environ: dict[str, str], *, nomad_cluster: str | None = None, gke_cluster: str | None = None):  # type: ignore[no-untyped-def]
    if scheduler == "local":
        from experiments.runner_local import LocalRunner

        return LocalRunner(environ)
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
    from clusters.derive.tenants import derive_tenants
    from experiments import db as database
    from experiments.app import utcnow
    from experiments.auth import create_token
    from experiments.services.lifecycle import record

    if (tenant is None) == (not admin):
        raise UserError("give exactly one of --tenant <tenant> or --admin")
    if tenant is not None:
        known = sorted({t.name for c in load_all() for t in derive_tenants(c)})
        if tenant not in known:
            raise UserError(f"--tenant {tenant!r} is not a tenant of any cluster file; allowed: {', '.join(known)}")
    engine = database.make_engine(database.database_url(db))
    database.upgrade(engine)
    with database.session_factory(engine)() as session, session.begin():
        token_id, token = create_token(session, tenant=tenant, admin=admin, name=name, now=utcnow())
        record(session, experiment_id=None, actor=_operator(), kind="token", message=f"created token {token_id} for {'admin' if admin else 'tenant ' + str(tenant)}", now=utcnow())
    engine.dispose()
    if quiet:
        print(token)
        return
    console.print(f"token {token_id} for {'admin' if admin else 'tenant ' + str(tenant)} (shown once, stored as a SHA-256 hash):")
    print(token)


def cmd_token_list(db: str | None = DbOption) -> None:
    """Tokens by id, tenant and state (never the tokens themselves)."""
    from sqlalchemy import select

    from experiments import db as database
    from experiments.models import ApiToken

    engine = database.make_engine(database.database_url(db))
    database.upgrade(engine)
    table = Table(title="API tokens")
    for column in ("id", "tenant", "admin", "name", "created", "revoked"):
        table.add_column(column)
    with database.session_factory(engine)() as session:
        for row in session.scalars(select(ApiToken).order_by(ApiToken.created_at)):
            table.add_row(row.id, row.tenant or "-", "yes" if row.admin else "", row.name, f"{row.created_at:%Y-%m-%d %H:%M}", f"{row.revoked_at:%Y-%m-%d %H:%M}" if row.revoked_at else "")
    engine.dispose()
    console.print(table)


def cmd_token_revoke(token_id: str = typer.Argument(..., help="The id shown by `token create` / `token list`."), db: str | None = DbOption) -> None:
    """Revoke a token at once; requests with it get 401."""
    from experiments import db as database
    from experiments.app import utcnow
    from experiments.models import ApiToken
    from experiments.services.lifecycle import record

    engine = database.make_engine(database.database_url(db))
    database.upgrade(engine)
    with database.session_factory(engine)() as session, session.begin():
        row = session.get(ApiToken, token_id)
        if row is None:
            raise UserError(f"no token {token_id!r}; list them with gpufleet api token list")
        row.revoked_at = row.revoked_at or utcnow()
        record(session, experiment_id=None, actor=_operator(), kind="token", message=f"revoked token {token_id}", now=utcnow())
    engine.dispose()
    console.print(f"revoked token {token_id}")


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


