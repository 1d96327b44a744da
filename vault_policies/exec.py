"""``gpufleet-exec -- <command...>``: run a training command with its API keys from Vault.

The wrapper, not the training code, owns the Vault token: it logs in from the wrapped
secret_id, hands the keys to the child only as the environment variables named in
``GPUFLEET_SECRETS`` (never printed), forwards SIGTERM/SIGINT/SIGHUP so Nomad's kill
signal reaches the trainer, revokes the token when the child ends, and exits with the
child's code (128+N when the child died of signal N).

If the token can no longer be renewed (the role's token_max_ttl is about to pass), the
child is sent SIGTERM: the role states the longest run it allows, and a run outliving
it should stop with a clear message rather than continue unaccounted for.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from types import FrameType

from vault_policies.client import ENV_WRAPPED_SECRET_ID, TokenRenewalError, TaskConfig, VaultClientError, start_task

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
EXIT_USAGE = 2
EXIT_VAULT = 78
# Nomad also exposes every dispatch meta key as NOMAD_META_<key> (as given and upper-cased);
# the wrapping token is spent by now, but the training process has no reason to see it.
HIDDEN_FROM_CHILD = (
    ENV_WRAPPED_SECRET_ID,
    "VAULT_TOKEN",
    "NOMAD_META_gpufleet_vault_wrapped_secret_id",
    "NOMAD_META_GPUFLEET_VAULT_WRAPPED_SECRET_ID",
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


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        _say("usage: gpufleet-exec -- <command> [args...]")
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
        returncode = signals.child.wait()
        return returncode if returncode >= 0 else 128 - returncode
    finally:
        if session.close():
            _say("token revoked")
