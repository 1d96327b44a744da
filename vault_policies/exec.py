"""``gpufleet-exec -- <command...>``: run a training command with its API keys from Vault.

The wrapper, not the training code, owns the Vault token: it logs in from the wrapped
secret_id, hands the keys to the child only as the environment variables named in
``GPUFLEET_SECRETS`` (never printed), forwards SIGTERM/SIGINT/SIGHUP so Nomad's kill
signal reaches the trainer, revokes the token when the child ends, and exits with the
child's code (128+N when the child died of signal N).

The run limit is enforced here, not left to Nomad: MaxRunDuration is only honoured by Nomad
>= 2.0.3 and the fleet's clients run 1.10, while a role's token_max_ttl may be longer than
the job's max_run_hours. When the command has run for ``GPUFLEET_MAX_RUN_SECONDS`` it gets
SIGTERM, then SIGKILL after ``GPUFLEET_KILL_GRACE_SECONDS`` (the job's kill_timeout), and
gpufleet-exec exits with EXIT_MAX_RUN (124, as timeout(1) does).

If the token can no longer be renewed (the role's token_max_ttl is about to pass), the
child is sent SIGTERM as well: a run outliving its role should stop with a clear message
rather than continue unaccounted for.

Exit codes: the child's own, 128+N (child killed by signal N), 2 usage or a malformed run
limit, 78 Vault refused (spent wrapping token, denied path), 124 max run time exceeded,
127 command not found.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from types import FrameType

from vault_policies.client import TokenRenewalError, TaskConfig, VaultClientError, start_task
from vault_policies.layout import ENV_KILL_GRACE_SECONDS, ENV_MAX_RUN_SECONDS, ENV_WRAPPED_SECRET_ID, META_WRAPPED_SECRET_ID

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
EXIT_USAGE = 2
EXIT_VAULT = 78
EXIT_MAX_RUN = 124
DEFAULT_KILL_GRACE_SECONDS = 30
# Nomad also exposes every dispatch meta key as NOMAD_META_<key> (as given and upper-cased);
# the wrapping token is spent by now, but the training process has no reason to see it.
HIDDEN_FROM_CHILD = (
    ENV_WRAPPED_SECRET_ID,
    "VAULT_TOKEN",
    f"NOMAD_META_{META_WRAPPED_SECRET_ID}",
    f"NOMAD_META_{META_WRAPPED_SECRET_ID.upper()}",
)


def _say(message: str) -> None:
    print(f"gpufleet-exec: {message}", file=sys.stderr, flush=True)


class _Signals:
    """Remembers signals that arrive before the child exists and forwards the rest."""

    def __init__(self) -> None:
        self.child: subprocess.Popen[bytes] | None = None
        self.pending: list[int] = []

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)
        else:
            self.pending.append(signum)

    def install(self) -> None:
        for sig in FORWARDED_SIGNALS:
            signal.signal(sig, self.handle)


def child_env(environ: dict[str, str], secrets: dict[str, str]) -> dict[str, str]:
    env = {key: value for key, value in environ.items() if key not in HIDDEN_FROM_CHILD}
    env.update(secrets)
    return env


class UsageError(Exception):
    """A malformed run limit: refused before login, so the wrapping token is not spent on it."""


def _seconds(environ: Mapping[str, str], name: str) -> int | None:
    raw = environ.get(name, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise UsageError(f"{name}={raw!r} is not a whole number of seconds >= 1; the jobs layer renders it from max_run_hours / kill_timeout, so re-render the job (gpufleet jobs render)")
    return int(raw)


def run_limits(environ: Mapping[str, str]) -> tuple[int | None, int]:
    """(max run seconds or None for no limit, SIGTERM-to-SIGKILL grace seconds)."""
    return _seconds(environ, ENV_MAX_RUN_SECONDS), _seconds(environ, ENV_KILL_GRACE_SECONDS) or DEFAULT_KILL_GRACE_SECONDS


def _wait(child: subprocess.Popen[bytes], max_run: int | None, grace: int) -> int:
    """The child's exit status, or EXIT_MAX_RUN once it was stopped for running too long.

    The limit counts from the command's start, so the Vault login does not eat into it.
    """
    try:
        return _status(child.wait(timeout=max_run))
    except subprocess.TimeoutExpired:
        pass
    _say(f"error: the command ran longer than max_run_hours ({ENV_MAX_RUN_SECONDS}={max_run}); sending SIGTERM, SIGKILL in {grace}s; exiting {EXIT_MAX_RUN}")
    child.send_signal(signal.SIGTERM)
    try:
        child.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        _say(f"error: the command ignored SIGTERM for {grace}s ({ENV_KILL_GRACE_SECONDS}); sending SIGKILL")
        child.kill()
        child.wait()
    return EXIT_MAX_RUN


def _status(returncode: int) -> int:
    return returncode if returncode >= 0 else 128 - returncode


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        _say("usage: gpufleet-exec -- <command> [args...]")
        return EXIT_USAGE
    try:
        max_run, grace = run_limits(os.environ)
    except UsageError as exc:
        _say(f"error: {exc}")
        return EXIT_USAGE
    signals = _Signals()
    signals.install()

    def on_renewal_failure(exc: TokenRenewalError) -> None:
        _say(f"error: {exc}; stopping the command")
        signals.handle(signal.SIGTERM, None)

    try:
        session = start_task(TaskConfig.from_env(os.environ), on_renewal_failure=on_renewal_failure)
    except VaultClientError as exc:
        _say(f"error: {exc}")
        return EXIT_VAULT
    try:
        if signals.pending:
            _say(f"received signal {signals.pending[0]} before the command started; not starting it")
            return 128 + signals.pending[0]
        _say(f"logged in (policies {', '.join(session.policies)}); passing {', '.join(sorted(session.secrets)) or 'no keys'} to {args[0]}")
        try:
            signals.child = subprocess.Popen(args, env=child_env(dict(os.environ), session.secrets))
        except OSError as exc:
            _say(f"error: cannot start {args[0]!r}: {exc.strerror}")
            return 127
        for signum in signals.pending:
            signals.child.send_signal(signum)
        return _wait(signals.child, max_run, grace)
    finally:
        if session.close():
            _say("token revoked")
