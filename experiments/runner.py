"""The scheduler-neutral runner the control plane talks to, and its Nomad implementation.

The contract (issue 13's ``jobs.runner``): ``submit(job, meta) -> run id``,
``status(run id) -> pending|running|succeeded|failed|stopped``, ``stop(run id)``. Until that
module lands this one has the same names, with what the control plane needs on top:
``submit`` takes the idempotency key (the experiment id), and ``status`` also says whether
the run is placed, why it ended and its exit code.

``NomadRunner.submit`` mints the wrapped single-use secret_id itself, with the Vault token
of this service, and hands it straight to Nomad's dispatch: it is never returned, stored or
logged. A repeated submit with the same key returns the same run (Nomad's dispatch
idempotency token); the extra wrapping token it minted is never unwrapped and expires.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from jobs.client import NomadClient, NomadError
from jobs.render import render
from jobs.spec import FinetuneSpec
from jobs.status import RunState
from jobs.vault_mint import default_queue_seconds, mint_wrapped_secret_id


class Phase(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"


@dataclass(frozen=True)
class RunReport:
    phase: Phase
    detail: str
    placed: bool
    exit_code: int | None


class RunNotFound(Exception):
    """The scheduler no longer knows the run (garbage-collected or purged)."""


class SchedulerUnavailable(Exception):
    """The scheduler could not be asked now (5xx, timeout, refused): retry later."""


class Runner(Protocol):
    scheduler: str

    def submit(self, job: FinetuneSpec, meta: Mapping[str, str], *, idempotency_key: str) -> str: ...

    def status(self, run_id: str) -> RunReport: ...

    def stop(self, run_id: str) -> None: ...


def _split(run_id: str) -> tuple[str, str]:
    """Nomad run ids are '<namespace>/<dispatched job id>'; namespaces contain no '/'."""
    namespace, _, job_id = run_id.partition("/")
    return namespace, job_id


class NomadRunner:
    scheduler = "nomad"

    def __init__(self, client: NomadClient, vault_env: Mapping[str, str]) -> None:
        self._client = client
        self._vault_env = dict(vault_env)
        self._registered: set[tuple[str, str, str]] = set()
        self._lock = threading.Lock()

    def _ensure_registered(self, job: FinetuneSpec) -> None:
        """Register the parameterized parent once per rendered version (Nomad keeps it otherwise)."""
        import json

        key = (job.namespace, job.name, json.dumps(render(job), sort_keys=True))
        with self._lock:
            if key in self._registered:
                return
        self._client.register(job)
        with self._lock:
            self._registered.add(key)

    def submit(self, job: FinetuneSpec, meta: Mapping[str, str], *, idempotency_key: str) -> str:
        try:
            self._ensure_registered(job)
            wrapped = mint_wrapped_secret_id(job, self._vault_env, expected_queue_seconds=default_queue_seconds(job.pool))
            result = self._client.dispatch(job, meta, role_id=wrapped.role_id, wrapping_token=wrapped.wrapping_token, idempotency_token=idempotency_key)
        except NomadError as exc:
            raise SchedulerUnavailable(str(exc)) from None
        return f"{result.namespace}/{result.dispatched_job_id}"

    def status(self, run_id: str) -> RunReport:
        namespace, job_id = _split(run_id)
        try:
            status = self._client.status(job_id, namespace)
        except NomadError as exc:
            if "(404" in str(exc):
                raise RunNotFound(run_id) from None
            raise SchedulerUnavailable(str(exc)) from None
        placed = status.alloc_id is not None
        if status.detail.startswith("preempted"):
            return RunReport(Phase.FAILED, status.detail, placed, status.exit_code)
        phase = {
            RunState.PENDING: Phase.PENDING,
            RunState.RUNNING: Phase.RUNNING,
            RunState.FAILED: Phase.FAILED,
            RunState.LOST: Phase.FAILED,
        }.get(status.state)
        if phase is None:  # complete: a clean exit, or a stop
            stopped = status.detail.startswith("stopped by request")
            phase = Phase.STOPPED if stopped else Phase.SUCCEEDED
        return RunReport(phase, status.detail, placed, status.exit_code)

    def stop(self, run_id: str) -> None:
        namespace, job_id = _split(run_id)
        try:
            self._client.stop(job_id, namespace, purge=False)
        except NomadError as exc:
            if "(404" in str(exc):
                return  # already gone: nothing is billing
            raise SchedulerUnavailable(str(exc)) from None
