"""``gpufleet-exec -- <command...>``: run a training command with its API keys from Vault.

The wrapper, not the training code, owns the Vault token: it logs in from the wrapped
secret_id, hands the keys to the child only as the environment variables named in
``GPUFLEET_SECRETS`` (never printed), forwards SIGTERM/SIGINT/SIGHUP so Nomad's kill
signal reaches the trainer, revokes the token when the child ends, and exits with the
child's code (128+N when the child died of signal N).

The run limit is enforced here, not left to Nomad: MaxRunDuration is only honoured by Nomad
>= 2.0.3 and the fleet's clients run 1.10, while a role's token_max_ttl may be longer than
the job's max_run_hours. When the command has run for the smaller of ``GPUFLEET_MAX_RUN_SECONDS``
(the job's max_run_hours) and ``GPUFLEET_RUN_DEADLINE_SECONDS`` (what was left of the experiment's
deadline at dispatch; absent, empty or an uninterpolated ``${NOMAD_META_...}`` when the dispatch
carried no deadline) it gets SIGTERM, then SIGKILL after ``GPUFLEET_KILL_GRACE_SECONDS`` (the job's
kill_timeout), and gpufleet-exec exits with EXIT_MAX_RUN (124, as timeout(1) does).

If the token can no longer be renewed (revoked: Vault answers 403; or the role's
token_max_ttl is about to pass), the child gets SIGTERM at once and SIGKILL after the kill
grace, and gpufleet-exec exits non-zero whatever the child does.

Hardening: the wrapper makes itself non-dumpable (``PR_SET_DUMPABLE=0``), so the child, with
the same uid, cannot read the live token from ``/proc/<ppid>/mem``; the child gets
``PR_SET_PDEATHSIG=SIGKILL`` (set by a small launcher before it execs the command), so if the
wrapper is SIGKILLed the child and its keys die with it, and the role's short token TTL
(renewed at least every minute) lets the orphaned token expire within minutes.

A job without ``secrets:`` is rendered with ``GPUFLEET_NO_VAULT=1`` and no Vault variable: the
wrapper then skips the login (there is no role and no wrap) and keeps everything else, the run limit
and the signal handling; that variable beside a role_id, a wrap or ``GPUFLEET_SECRETS`` is refused.

Exit codes (docs/training-side.md, docs/reference/exit-codes.md): the child's own; 128+N child killed by signal N;
2 usage or malformed environment (nothing sent to Vault, the wrap is not spent);
69 Vault unreachable or a server error; 78 Vault refused (denied path, missing key, host
outside the role's CIDRs); 79 POSSIBLE INTERCEPTION (wrap already used, swapped, or login
refused right after unwrapping); 80 token revoked during the run; 81 token could not be
renewed further (token_max_ttl, or Vault unreachable until expiry); 124 max run time
exceeded; 127 command not found. A child that exits 75 (``layout.EXIT_HARDWARE``: its GPU failed,
e.g. an XID) is passed through like any code; the control plane retries that run as an
infrastructure failure.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from types import FrameType

from vault_policies.client import (
    MalformedEnvironment,
    PossibleInterception,
    TaskConfig,
    TokenRenewalError,
    TokenRevoked,
    VaultClientError,
    VaultUnavailable,
    start_task,
)
from vault_policies.layout import (
    ENV_KILL_GRACE_SECONDS,
    ENV_MAX_RUN_SECONDS,
    ENV_NO_VAULT,
    ENV_ROLE_ID,
    ENV_RUN_DEADLINE_SECONDS,
    ENV_SECRETS,
    ENV_WRAPPED_SECRET_ID,
    ENV_WRAPPED_SECRET_ID_FILE,
    META_WRAPPED_SECRET_ID,
)

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
EXIT_USAGE = 2
EXIT_VAULT_UNAVAILABLE = 69
EXIT_VAULT = 78
EXIT_INTERCEPTED = 79
EXIT_REVOKED = 80
EXIT_TOKEN_LOST = 81
EXIT_MAX_RUN = 124
EXIT_NOT_FOUND = 127
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
# Runs between fork and the command's exec: parent-death signal first, then check that the
# parent did not die before it was set, then exec (the signal setting survives exec).
_LAUNCHER = (
    "import ctypes, os, sys\n"
    "try:\n"
    f"    ctypes.CDLL(None, use_errno=True).prctl({PR_SET_PDEATHSIG}, 9, 0, 0, 0)\n"
    "except AttributeError:\n"
    "    pass  # not Linux: no parent-death signal\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os._exit(137)\n"
    "try:\n"
    "    os.execvp(sys.argv[2], sys.argv[2:])\n"
    "except OSError as exc:\n"
    "    print(f'gpufleet-exec: error: cannot start {sys.argv[2]!r}: {exc.strerror}', file=sys.stderr, flush=True)\n"
    f"    os._exit({EXIT_NOT_FOUND})\n"
)
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
            _signal_group(self.child, signum)
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


def _seconds(environ: Mapping[str, str], name: str,
             fix: str = "the jobs layer renders it from max_run_hours / kill_timeout, so re-render the job (gpufleet jobs render)") -> int | None:
    raw = environ.get(name, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise UsageError(f"{name}={raw!r} is not a whole number of seconds >= 1; {fix}")
    return int(raw)


def _deadline_seconds(environ: Mapping[str, str]) -> int | None:
    """ENV_RUN_DEADLINE_SECONDS, or None when the dispatch carried no deadline: Nomad leaves
    ``${NOMAD_META_<key>}`` as written when the optional meta key is absent (helper/args/args.go
    ReplaceEnv :12-26 at v1.10.5), so that literal means "none", like unset or empty."""
    raw = environ.get(ENV_RUN_DEADLINE_SECONDS, "").strip()
    if raw.startswith("${") and raw.endswith("}"):
        return None
    return _seconds(environ, ENV_RUN_DEADLINE_SECONDS, "the control plane sets it at dispatch from the experiment's deadline; "
                    "dispatch without the gpufleet_run_deadline_seconds meta key for the job's max_run_hours alone")


def run_limits(environ: Mapping[str, str]) -> tuple[int | None, int]:
    """(run seconds or None for no limit, SIGTERM-to-SIGKILL grace seconds): the run seconds are
    the smaller of the job's max_run (ENV_MAX_RUN_SECONDS) and what was left of the experiment's
    deadline at dispatch (ENV_RUN_DEADLINE_SECONDS), whichever are set."""
    bounds = [b for b in (_seconds(environ, ENV_MAX_RUN_SECONDS), _deadline_seconds(environ)) if b is not None]
    return min(bounds, default=None), _seconds(environ, ENV_KILL_GRACE_SECONDS) or DEFAULT_KILL_GRACE_SECONDS


def without_vault(environ: Mapping[str, str]) -> bool:
    """True for a job without ``secrets:`` (ENV_NO_VAULT=1): no login, no keys, nothing to revoke.
    Vault variables beside it mean a mixed-up environment, refused before anything starts."""
    if environ.get(ENV_NO_VAULT, "") == "":
        return False
    if environ[ENV_NO_VAULT] != "1":
        raise UsageError(f"{ENV_NO_VAULT}={environ[ENV_NO_VAULT]!r}; the jobs layer sets it to 1 for a job without secrets, so re-render the job (gpufleet jobs render)")
    mixed = [name for name in (ENV_ROLE_ID, ENV_WRAPPED_SECRET_ID, ENV_WRAPPED_SECRET_ID_FILE, ENV_SECRETS) if environ.get(name)]
    if mixed:
        raise UsageError(f"{ENV_NO_VAULT}=1 (a job without secrets) but {', '.join(mixed)} also set; re-render the job (gpufleet jobs render)")
    return True


def _signal_group(child: subprocess.Popen[bytes], signum: int) -> None:
    """Signal the command's process group (the command and whatever it started)."""
    try:
        os.killpg(child.pid, signum)
    except ProcessLookupError:
        pass


def _stop(child: subprocess.Popen[bytes], grace: int) -> None:
    _signal_group(child, signal.SIGTERM)
    try:
        child.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        _say(f"error: the command ignored SIGTERM for {grace}s ({ENV_KILL_GRACE_SECONDS}); sending SIGKILL")
    _signal_group(child, signal.SIGKILL)
    child.wait()


def _wait(child: subprocess.Popen[bytes], max_run: int | None, grace: int, lost: threading.Event, code: list[int]) -> int:
    """The child's exit status; EXIT_MAX_RUN once it was stopped for running too long; the
    token-loss code once the token could not be renewed (``lost`` set by the renewer).

    The limit counts from the command's start, so the Vault login does not eat into it.
    """
    deadline = None if max_run is None else time.monotonic() + max_run
    while True:
        step = 0.2 if deadline is None else max(0.0, min(0.2, deadline - time.monotonic()))
        try:
            return _status(child.wait(timeout=step))
        except subprocess.TimeoutExpired:
            pass
        if lost.is_set():
            _stop(child, grace)
            return code[0]
        if deadline is not None and time.monotonic() >= deadline:
            _say(f"error: the command ran longer than its run limit ({max_run}s: the smaller of {ENV_MAX_RUN_SECONDS} and {ENV_RUN_DEADLINE_SECONDS}); "
                 f"sending SIGTERM, SIGKILL in {grace}s; exiting {EXIT_MAX_RUN}")
            _stop(child, grace)
            return EXIT_MAX_RUN


def _not_dumpable() -> None:
    """Keep same-uid processes (the child included) out of /proc/<pid>/mem of the token holder."""
    try:
        if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl failed")
    except (OSError, AttributeError) as exc:
        _say(f"warning: cannot make this process non-dumpable ({exc}); the child could read the Vault token from /proc")


def _exit_code(exc: VaultClientError) -> int:
    if isinstance(exc, MalformedEnvironment):
        return EXIT_USAGE
    if isinstance(exc, PossibleInterception):
        return EXIT_INTERCEPTED
    if isinstance(exc, VaultUnavailable):
        return EXIT_VAULT_UNAVAILABLE
    return EXIT_VAULT


def _status(returncode: int) -> int:
    return returncode if returncode >= 0 else 128 - returncode


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        _say("usage: gpufleet-exec -- <command> [args...]")
        return EXIT_USAGE
    _not_dumpable()
    try:
        max_run, grace = run_limits(os.environ)
        no_vault = without_vault(os.environ)
    except UsageError as exc:
        _say(f"error: {exc}")
        return EXIT_USAGE
    signals = _Signals()
    signals.install()
    lost = threading.Event()
    lost_code = [EXIT_TOKEN_LOST]

    def on_renewal_failure(exc: TokenRenewalError) -> None:
        lost_code[0] = EXIT_REVOKED if isinstance(exc, TokenRevoked) else EXIT_TOKEN_LOST
        _say(f"error: {exc}; stopping the command (SIGTERM, SIGKILL after {grace}s); exiting {lost_code[0]}")
        lost.set()

    try:
        session = None if no_vault else start_task(TaskConfig.from_env(os.environ), on_renewal_failure=on_renewal_failure)
    except VaultClientError as exc:
        code = _exit_code(exc)
        _say(f"error: {exc} (exit {code})")
        return code
    keys = session.secrets if session is not None else {}
    try:
        if signals.pending:
            _say(f"received signal {signals.pending[0]} before the command started; not starting it")
            return 128 + signals.pending[0]
        if session is None:
            _say(f"job without secrets: no Vault login; starting {args[0]}")
        else:
            _say(f"logged in (policies {', '.join(session.policies)}); passing {', '.join(sorted(keys)) or 'no keys'} to {args[0]}")
        # The interpreter running this wrapper, by its magic link (its path may not be
        # traversable for the task's uid); -I -S: no site, no PYTHON* from the environment.
        interpreter = "/proc/self/exe" if os.path.exists("/proc/self/exe") else sys.executable
        launcher = [interpreter, "-I", "-S", "-c", _LAUNCHER, str(os.getpid()), *args]
        # Its own process group, so stop signals reach the command's children too.
        signals.child = subprocess.Popen(launcher, env=child_env(dict(os.environ), keys), process_group=0)
        for signum in signals.pending:
            _signal_group(signals.child, signum)
        return _wait(signals.child, max_run, grace, lost, lost_code)
    finally:
        if signals.child is not None:
            _signal_group(signals.child, signal.SIGKILL)  # leftovers of the command hold its keys
        if session is not None and session.close():
            _say("token revoked")
