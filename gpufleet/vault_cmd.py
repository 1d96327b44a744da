"""Vault commands: ``gpufleet vault diff|apply|prune`` and the local ``gpufleet dev up|env|down``.

This is the only place that reads ``VAULT_*`` from the environment; everything below it
takes an hvac client. The dev server's lifecycle (state file, root-token file, stopping it)
lives in ``vault_policies.dev``; these commands parse, call it and print. hvac and the sync
are imported inside the commands to keep ``gpufleet --help`` fast.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from clusters.errors import UserError

if TYPE_CHECKING:
    import hvac

    from vault_policies.sync import Change

RepoOption = typer.Option(None, "--repo", help="Repository root holding vault_policies/ (default: the repository around the current directory).")


def _repo(path: Path | None) -> Path:
    """``--repo`` (a directory holding vault_policies/) or the repository around the current directory."""
    from clusters import repo as repo_mod

    if path is None:
        return repo_mod.root()
    if not (Path(path) / "vault_policies").is_dir():
        raise UserError(f"--repo {path}: no vault_policies/ directory in it; pass the repository root")
    return Path(path).resolve()


def _client_from_env() -> hvac.Client:
    from vault_policies.client import make_client

    addr, token = os.environ.get("VAULT_ADDR"), os.environ.get("VAULT_TOKEN")
    if not addr or not token:
        raise UserError("VAULT_ADDR and VAULT_TOKEN must be set (a token with the gpufleet-admin policy); for a local server run: eval \"$(gpufleet dev env)\"")
    return make_client(addr, token=token, cacert=os.environ.get("VAULT_CACERT"), namespace=os.environ.get("VAULT_NAMESPACE"))


def _run_sync(action: str, client: hvac.Client, repo: Path, *, local_dev: bool = False) -> tuple[Change, ...]:
    import hvac.exceptions
    import requests

    from vault_policies import sync
    from vault_policies.dev import definitions_for

    definitions = definitions_for(str(client.url), repo, local_dev=local_dev)
    try:
        return getattr(sync, action)(client, definitions)
    except hvac.exceptions.Forbidden as exc:
        raise UserError(f"Vault refused the {action}: {str(exc).splitlines()[-1].strip() or exc}; use a VAULT_TOKEN with the gpufleet-admin policy") from None
    except (requests.ConnectionError, hvac.exceptions.VaultDown) as exc:
        raise UserError(f"cannot reach Vault at {client.url} ({type(exc).__name__}); check VAULT_ADDR and VAULT_CACERT") from None


def _print_changes(title: str, changes: tuple[Change, ...], *, applied: bool) -> None:
    from gpufleet.console import make_console
    from rich.table import Table

    table = Table(title=title)
    for column in ("kind", "name", "action", "detail"):
        table.add_column(column, overflow="fold")
    styles = {"create": "green", "update": "yellow", "delete": "red", "delete (prune)": "red"}
    for change in changes:
        style = styles.get(change.action, "dim")
        table.add_row(change.kind, change.name, f"[{style}]{change.action}[/{style}]", change.detail)
    console = make_console()
    console.print(table)
    pending = [c for c in changes if c.action not in ("unchanged", "skip")]
    skipped = [c for c in changes if c.action == "skip"]
    verb = "changed" if applied else "to change"
    summary = f"{len(pending)} {verb}" if pending else "no changes"
    if skipped:
        names = ", ".join(f"{c.kind} {c.name}" for c in skipped)
        summary += f"; {len(skipped)} skipped ({names}): this token may not write them; apply those with an operator token"
    console.print(summary, soft_wrap=True)


def dev_up(repo: Path) -> dict[str, object]:
    """Start (or reuse) the local dev server, sync the repo's definitions and seed fake keys."""
    from vault_policies import dev
    from vault_policies.client import make_client

    state = dev.running_state(repo)
    if state is None:
        state = dev.start(repo)
        typer.echo(f"started OpenBao dev server at {state['addr']} (pid {state['pid']}, log {state['log']})", err=True)
    else:
        typer.echo(f"reusing OpenBao dev server at {state['addr']} (pid {state['pid']})", err=True)
    client = make_client(str(state["addr"]), token=dev.root_token(repo))
    _print_changes("vault apply (dev)", _run_sync("apply", client, repo, local_dev=True), applied=True)
    for path in dev.seed_demo_keys(client):
        typer.echo(f"seeded fake demo key secret/{path}", err=True)
    typer.echo('next: eval "$(gpufleet dev env)"', err=True)
    return state


def register(app: typer.Typer) -> None:
    vault = typer.Typer(help="Sync Vault policies and AppRole roles with vault_policies/ (VAULT_ADDR, VAULT_TOKEN, VAULT_CACERT, VAULT_NAMESPACE).", no_args_is_help=True)
    dev = typer.Typer(help="A local OpenBao dev server with the repo's policies, roles and fake demo keys.", no_args_is_help=True)

    @vault.command("render")
    def vault_render(repo: Path | None = RepoOption) -> None:
        """Regenerate the operator policies (gpufleet-admin, orchestrator) from roles.yaml and clusters/, and the Nomad PKI policies."""
        from vault_policies.nomad_pki import PKI_POLICIES_DIR
        from vault_policies.validate import render

        repo = _repo(repo)
        written = render(repo)
        for path in written:
            if path.is_relative_to(repo / PKI_POLICIES_DIR):
                cluster = path.stem.removeprefix("nomad-pki-").rsplit("-", 1)[0]
                typer.echo(f"wrote {path}; review it, then an operator applies it: gpufleet nomad pki-apply {cluster} with a root token", err=True)
            else:
                typer.echo(f"wrote {path}; review it, then an operator applies it: gpufleet vault apply with a root token", err=True)
        if not written:
            typer.echo("operator policies are up to date", err=True)

    @vault.command("diff")
    def vault_diff(repo: Path | None = RepoOption) -> None:
        """Show what apply would write and what prune would delete; writes nothing."""
        repo = _repo(repo)
        _print_changes("vault diff", _run_sync("diff", _client_from_env(), repo), applied=False)

    @vault.command("apply")
    def vault_apply(repo: Path | None = RepoOption) -> None:
        """Enable approle/ and secret/ (KV v2) if missing, write policies and roles; idempotent."""
        repo = _repo(repo)
        _print_changes("vault apply", _run_sync("apply", _client_from_env(), repo), applied=True)

    @vault.command("prune")
    def vault_prune(repo: Path | None = RepoOption) -> None:
        """Delete policies and roles gpufleet wrote that are no longer in the repo; never others'."""
        repo = _repo(repo)
        _print_changes("vault prune", _run_sync("prune", _client_from_env(), repo), applied=True)

    @dev.command("up")
    def up(repo: Path | None = RepoOption) -> None:
        """Start bao server -dev on a loopback port (or reuse it), apply, seed fake keys."""
        repo = _repo(repo)
        dev_up(repo)

    @dev.command("env")
    def env(repo: Path | None = RepoOption) -> None:
        """Print export lines for: eval "$(gpufleet dev env)"."""
        from vault_policies import dev

        repo = _repo(repo)
        state = dev.running_state(repo)
        if state is None:
            raise UserError("no local OpenBao dev server is running; start one with: gpufleet dev up")
        typer.echo(f"export VAULT_ADDR='{state['addr']}'")
        typer.echo(f"export VAULT_TOKEN='{dev.root_token(repo)}'")
        typer.echo("unset VAULT_NAMESPACE VAULT_CACERT")

    @dev.command("down")
    def down(repo: Path | None = RepoOption) -> None:
        """Stop the local dev server and forget its state (it is in-memory: keys go with it)."""
        from vault_policies import dev

        pid = dev.stop(_repo(repo))
        if pid is None:
            typer.echo("no local OpenBao dev server was running", err=True)
        else:
            typer.echo(f"stopped OpenBao dev server (pid {pid})", err=True)

    app.add_typer(vault, name="vault")
    app.add_typer(dev, name="dev")
