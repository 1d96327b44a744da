"""A development runner: each experiment runs on this machine exactly like
``gpufleet jobs run-local`` (same Vault flow: a wrapped single-use secret_id minted with this
service's VAULT_TOKEN, unwrapped by gpufleet-exec in the child; same Nomad-shaped environment),
but in the background, so ``make demo`` can drive it through the API.

Runs live in this process: a restarted service forgets them (the reconciler then fails them
with "the scheduler no longer knows run ..."). Production uses ``NomadRunner``. Each run's
directory is kept under ``.gpufleet/runs/`` with its output as Nomad names it
(``alloc/logs/train.stdout.0``, ``train.stderr.0``), so ``gpufleet exp logs`` shows it after the
run ended.

Each attempt of an experiment (experiments.attempts) gets GPUFLEET_ATTEMPT and the same
GPUFLEET_CHECKPOINT_URI, ``.gpufleet/checkpoints/<experiment id>``, so a retried run resumes
from its last checkpoint. For demos, ``xid_at_step`` makes every first attempt fail like a GPU
fault (the task exits with ``EXIT_HARDWARE`` at that step; jobs/tasks/tiny_finetune.py), which the
reconciler counts as an infrastructure failure and retries.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
import threading
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from jobs import failures
from jobs.logs import LogsFilterRefused, last_lines
from experiments.attempts import experiment_of
from jobs.local import CHECKPOINTS_DIR, REPO_ROOT, local_argv, task_environment
from jobs.logs import DEFAULT_TAIL_BYTES, tail_text
from jobs.runner import Phase, RunNotFound, RunReport
from jobs.spec import TASK, FinetuneSpec
from jobs.vault_mint import mint_wrapped_secret_id, platform_meta
from vault_policies.layout import META_ATTEMPT


RUNS_DIR = REPO_ROOT / ".gpufleet" / "runs"
# The demo knob tiny_finetune.py reads: exit EXIT_HARDWARE at this step (set only on a first attempt).
ENV_XID_AT_STEP = "GPUFLEET_LOCAL_XID_AT_STEP"
FOLLOW_POLL_SECONDS = 0.2


def _drop_secrets(root: Path) -> None:
    """Once a run ended keep only its logs: the rest of its directory (secrets, task scratch) goes."""
    for child in root.iterdir():
        if child.name != "alloc":
            shutil.rmtree(child, ignore_errors=True) if child.is_dir() else child.unlink(missing_ok=True)
    for child in (root / "alloc").iterdir():
        if child.name != "logs":
            shutil.rmtree(child, ignore_errors=True) if child.is_dir() else child.unlink(missing_ok=True)


@dataclass
class _Run:
    process: subprocess.Popen[bytes]
    root: Path
    stopped: bool = False
    # Naive UTC, like the other schedulers' placement and end times: a run that ends between two
    # reconciler passes (the tutorial's takes about a second) is still charged its GPU time.
    started_at: datetime | None = None
    ended_at: datetime | None = None


def _utcnow() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


class LocalRunner:
    scheduler = "local"

    def __init__(self, vault_env: Mapping[str, str], *, xid_at_step: int | None = None) -> None:
        # Which service's runs these are (experiments.scheduler.run_scheduler): a task is a child of
        # this process, so no other service can tell whether it still runs.
        self.instance = secrets.token_hex(4)
        self._environ = dict(vault_env)
        self._xid_at_step = xid_at_step
        self._runs: dict[str, _Run] = {}
        self._by_key: dict[str, str] = {}
        self._lock = threading.Lock()

    def submit(self, job: FinetuneSpec, meta: Mapping[str, str], *, idempotency_key: str, attempt: int = 1) -> str:
        with self._lock:
            if idempotency_key in self._by_key:
                return self._by_key[idempotency_key]
        wrapped = mint_wrapped_secret_id(job, self._environ, expected_queue_seconds=0)
        run_id = f"local/{job.name}/dispatch-{secrets.token_hex(4)}"
        RUNS_DIR.mkdir(parents=True, exist_ok=True)
        root = Path(tempfile.mkdtemp(prefix=f"{job.name}-", dir=RUNS_DIR))
        platform = {**platform_meta(wrapped), META_ATTEMPT: str(attempt)}
        env = task_environment(job, {**meta, **platform}, job_id=run_id.removeprefix("local/"), alloc_id=str(uuid.uuid4()), alloc_root=root, environ=self._environ,
                               checkpoint_dir=CHECKPOINTS_DIR / experiment_of(idempotency_key))
        if self._xid_at_step is not None and attempt == 1:
            env[ENV_XID_AT_STEP] = str(self._xid_at_step)
        logs = root / "alloc" / "logs"
        with (logs / f"{TASK}.stdout.0").open("ab") as out, (logs / f"{TASK}.stderr.0").open("ab") as err:
            started_at = _utcnow()
            process = subprocess.Popen(local_argv(job), cwd=REPO_ROOT, env=env, stdout=out, stderr=err)
        with self._lock:
            self._runs[run_id] = _Run(process, root, started_at=started_at)
            self._by_key[idempotency_key] = run_id
        return run_id

    def status(self, run_id: str) -> RunReport:
        with self._lock:
            run = self._runs.get(run_id)
        if run is None:
            raise RunNotFound(run_id)
        code = run.process.poll()
        if code is None:
            return RunReport(Phase.RUNNING, f"pid {run.process.pid} on this machine", True, None)
        _drop_secrets(run.root)
        if run.ended_at is None:
            run.ended_at = _utcnow()  # at most one pass late: the process exited before this poll
        times = {"placed_at": run.started_at, "ended_at": run.ended_at}
        if run.stopped:
            return RunReport(Phase.STOPPED, "stopped by request", True, code, **times)
        if code == 0:
            return RunReport(Phase.SUCCEEDED, "exited 0", True, 0, **times)
        hardware = failures.hardware_exit(code)  # the wrapper's GPU-fault code: infrastructure, as on the clusters
        return RunReport(Phase.FAILED, f"task train: Terminated: Exit Code: {code}", True, code, infrastructure=hardware,
                         cause=failures.HARDWARE_EXIT if hardware else None, **times)

    def logs(self, run_id: str, *, rank: int = 0, stderr: bool = False, tail_bytes: int = DEFAULT_TAIL_BYTES, tail_lines: int | None = None,
             since_seconds: int | None = None, follow: bool = False, stop: threading.Event | None = None) -> Iterator[bytes]:
        """The run's own file; a follow reads what was added every FOLLOW_POLL_SECONDS until the process exited."""
        with self._lock:
            run = self._runs.get(run_id)
        if run is None:
            raise RunNotFound(run_id)
        if rank != 0:
            raise LogsFilterRefused(f"run {run_id} runs on this machine with one rank (0); drop --rank {rank}")
        if since_seconds is not None:
            raise LogsFilterRefused("the local runner's log files carry no timestamps; use --tail N instead of --since")
        path = run.root / "alloc" / "logs" / f"{TASK}.{'stderr' if stderr else 'stdout'}.0"
        return self._read(run, path, tail_bytes=tail_bytes, tail_lines=tail_lines, follow=follow, stop=stop or threading.Event())

    @staticmethod
    def _read(run: _Run, path: Path, *, tail_bytes: int, tail_lines: int | None, follow: bool, stop: threading.Event) -> Iterator[bytes]:
        try:
            handle = path.open("rb")
        except FileNotFoundError:
            return
        with handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(0, size - tail_bytes - 1))  # one byte more: tail_text sees a cut first line
            first = tail_text(handle.read(), tail_bytes).encode()
            yield last_lines(first, tail_lines) if follow else first
            while follow and not stop.is_set():
                ended = run.process.poll() is not None
                yield handle.read()  # b"" when nothing was added: a tick
                if ended:
                    return
                stop.wait(FOLLOW_POLL_SECONDS)

    def find(self, job: FinetuneSpec, idempotency_key: str) -> str | None:
        with self._lock:
            return self._by_key.get(idempotency_key)

    def stop(self, run_id: str) -> None:
        with self._lock:
            run = self._runs.get(run_id)
        if run is None or run.process.poll() is not None:
            return
        run.stopped = True
        run.process.terminate()  # gpufleet-exec forwards SIGTERM and revokes the run's Vault token
        try:
            run.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            run.process.kill()


def vault_env(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """What a runner may pass on: PATH-like basics and the Vault connection, nothing else."""
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "TERM", "USER", "VAULT_ADDR", "VAULT_TOKEN", "VAULT_CACERT", "VAULT_NAMESPACE")
    return {k: environ[k] for k in keep if k in environ}
