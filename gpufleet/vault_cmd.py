"""Vault commands: ``gpufleet vault diff|apply|prune`` and the local ``gpufleet dev up|env|down``.

This is the only place that reads ``VAULT_*`` from the environment; everything below it
takes an hvac client. hvac and the sync are imported inside the commands to keep
``gpufleet --help`` fast.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from clusters.errors import UserError

if TYPE_CHECKING:
    import hvac

    from vault_policies.sync import Change

DEV_DIR = Path(".gpufleet/dev")
DEMO_KEYS = {
    "ml-api-keys/huggingface": {"token": "fake-hf-demo-0000"},
    "ml-api-keys/wandb": {"api_key": "fake-wandb-demo-0000"},
    "ml-api-keys/openai": {"api_key": "fake-openai-demo-0000"},
}
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
    from vault_policies.validate import load_definitions

    definitions = load_definitions(repo)
    state = None if local_dev else _read_dev_state(repo)
    if local_dev or (state is not None and str(state.get("addr", "")).rstrip("/") == str(client.url).rstrip("/")):
        # This repo's own `gpufleet dev up` server: its roles also accept the loopback address.
        definitions = definitions.for_local_dev()
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


def _dev_dir(repo: Path) -> Path:
    return repo / DEV_DIR


def _read_dev_state(repo: Path) -> dict[str, object] | None:
    path = _dev_dir(repo) / "state.json"
    if not path.exists():
        return None
    return json.loads(path.read_text())


def _is_our_bao(pid: int) -> bool:
    """The pid is alive and still a ``bao server`` (not a recycled pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(part.endswith(b"bao") for part in cmdline[:1]) and b"server" in cmdline


def _running_state(repo: Path) -> dict[str, object] | None:
    from vault_policies.devserver import is_healthy

    state = _read_dev_state(repo)
    if state and _is_our_bao(int(state["pid"])) and is_healthy(str(state["addr"])):
        return state
    return None


def _root_token(repo: Path) -> str:
    return (_dev_dir(repo) / "root-token").read_text().strip()


def _seed_demo_keys(client: hvac.Client) -> list[str]:
    import hvac.exceptions

    from vault_policies.layout import KV_MOUNT

    seeded = []
    for path, data in sorted(DEMO_KEYS.items()):
        try:
            client.secrets.kv.v2.read_secret_version(path, mount_point=KV_MOUNT, raise_on_deleted_version=True)
        except hvac.exceptions.InvalidPath:
            client.secrets.kv.v2.create_or_update_secret(path, secret=data, mount_point=KV_MOUNT)
            seeded.append(path)
    return seeded


def dev_up(repo: Path) -> dict[str, object]:
    """Start (or reuse) the local dev server, sync the repo's definitions and seed fake keys."""
    from vault_policies.client import make_client
    from vault_policies.devserver import start_dev_server

    directory = _dev_dir(repo)
    state = _running_state(repo)
    if state is None:
        directory.mkdir(parents=True, exist_ok=True)
        os.chmod(directory, 0o700)
        server = start_dev_server(directory / "bao.log", detach=True)
        token_file = directory / "root-token"
        token_file.touch(mode=0o600)
        os.chmod(token_file, 0o600)
        token_file.write_text(server.root_token + "\n")
        state = {"pid": server.process.pid, "addr": server.addr, "log": str(server.log_path)}
        (directory / "state.json").write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
        typer.echo(f"started OpenBao dev server at {server.addr} (pid {server.process.pid}, log {server.log_path})", err=True)
    else:
        typer.echo(f"reusing OpenBao dev server at {state['addr']} (pid {state['pid']})", err=True)
    client = make_client(str(state["addr"]), token=_root_token(repo))
    _print_changes("vault apply (dev)", _run_sync("apply", client, repo, local_dev=True), applied=True)
    for path in _seed_demo_keys(client):
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
        repo = _repo(repo)
        state = _running_state(repo)
        if state is None:
            raise UserError("no local OpenBao dev server is running; start one with: gpufleet dev up")
        typer.echo(f"export VAULT_ADDR='{state['addr']}'")
        typer.echo(f"export VAULT_TOKEN='{_root_token(repo)}'")
        typer.echo("unset VAULT_NAMESPACE VAULT_CACERT")

    @dev.command("down")
    def down(repo: Path | None = RepoOption) -> None:
        """Stop the local dev server and forget its state (it is in-memory: keys go with it)."""
        repo = _repo(repo)
        directory = _dev_dir(repo)
        state = _read_dev_state(repo)
        if state and _is_our_bao(int(state["pid"])):
            pid = int(state["pid"])
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while _is_our_bao(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _is_our_bao(pid):
                os.kill(pid, signal.SIGKILL)
            typer.echo(f"stopped OpenBao dev server (pid {pid})", err=True)
        else:
            typer.echo("no local OpenBao dev server was running", err=True)
        for name in ("state.json", "root-token", "bao.log"):
            (directory / name).unlink(missing_ok=True)

    app.add_typer(vault, name="vault")
    app.add_typer(dev, name="dev")
