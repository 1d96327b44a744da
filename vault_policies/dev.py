"""The local development Vault of one repository (``gpufleet dev up|env|down``).

A detached ``bao server -dev`` whose pid, address and log live in ``.gpufleet/dev/state.json``
and whose root token lives beside it in a 0600 file (never in the state file, never in argv),
so ``dev env`` can print it and ``dev down`` can stop exactly the server it started. The
command layer only parses, calls these and prints.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

from vault_policies.devserver import is_healthy, start_dev_server

if TYPE_CHECKING:
    import hvac

    from vault_policies.validate import VaultDefinitions

DEV_DIR = Path(".gpufleet/dev")
DEMO_KEYS = {
    "ml-api-keys/huggingface": {"token": "fake-hf-demo-0000"},
    "ml-api-keys/wandb": {"api_key": "fake-wandb-demo-0000"},
    "ml-api-keys/openai": {"api_key": "fake-openai-demo-0000"},
    "ml-api-keys/openai-dev": {"api_key": "fake-openai-dev-demo-0000"},
}
STOP_TIMEOUT_SECONDS = 10.0


def dev_dir(repo: Path) -> Path:
    return repo / DEV_DIR


def read_state(repo: Path) -> dict[str, object] | None:
    """The recorded dev server of ``repo`` (pid, addr, log), alive or not; None when none was started."""
    path = dev_dir(repo) / "state.json"
    if not path.exists():
        return None
    return json.loads(path.read_text())


def is_our_bao(pid: int) -> bool:
    """The pid is alive and still a ``bao server`` (not a recycled pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(part.endswith(b"bao") for part in cmdline[:1]) and b"server" in cmdline


def running_state(repo: Path) -> dict[str, object] | None:
    """The recorded dev server when it is still our ``bao`` and healthy, else None."""
    state = read_state(repo)
    if state and is_our_bao(int(state["pid"])) and is_healthy(str(state["addr"])):
        return state
    return None


def root_token(repo: Path) -> str:
    return (dev_dir(repo) / "root-token").read_text().strip()


def start(repo: Path) -> dict[str, object]:
    """Start a detached dev server for ``repo`` and record it; the root token goes to a 0600 file."""
    directory = dev_dir(repo)
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    server = start_dev_server(directory / "bao.log", detach=True)
    token_file = directory / "root-token"
    token_file.touch(mode=0o600)
    os.chmod(token_file, 0o600)
    token_file.write_text(server.root_token + "\n")
    state = {"pid": server.process.pid, "addr": server.addr, "log": str(server.log_path)}
    (directory / "state.json").write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    return state


def stop(repo: Path) -> int | None:
    """Stop the recorded dev server (SIGTERM, SIGKILL after 10 s) and forget its files.

    Returns the pid stopped, or None when no server of ours was running. The pid is checked
    against /proc before each signal so a recycled pid is never killed.
    """
    state = read_state(repo)
    stopped = None
    if state and is_our_bao(int(state["pid"])):
        stopped = int(state["pid"])
        os.kill(stopped, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
        while is_our_bao(stopped) and time.monotonic() < deadline:
            time.sleep(0.1)
        if is_our_bao(stopped):
            os.kill(stopped, signal.SIGKILL)
    for name in ("state.json", "root-token", "bao.log"):
        (dev_dir(repo) / name).unlink(missing_ok=True)
    return stopped


def definitions_for(client_url: str, repo: Path, *, local_dev: bool = False) -> VaultDefinitions:
    """The repo's definitions, with the loopback bindings when the target is this repo's dev server.

    ``gpufleet dev up`` syncs with ``local_dev``; a later ``vault diff|apply`` against the same
    address (read from the state file) must see the same definitions, or it would report the
    loopback bindings as drift.
    """
    from vault_policies.validate import load_definitions

    definitions = load_definitions(repo)
    state = None if local_dev else read_state(repo)
    if local_dev or (state is not None and str(state.get("addr", "")).rstrip("/") == client_url.rstrip("/")):
        return definitions.for_local_dev()
    return definitions


def seed_demo_keys(client: hvac.Client) -> list[str]:
    """Write the fake demo keys that are missing (never overwrite); returns the paths written."""
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
