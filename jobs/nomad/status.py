"""A dispatched run's state from Nomad's evaluations and allocations, in five words.

Nomad spreads a run's fate over the job (Status, Stop), its evaluations (blocked when no
client fits) and its allocations (ClientStatus, per-task events). Users want one of
pending / running / complete / failed / lost, and for a failure the failing task's last
event ("Terminated: Exit Code: 1"), not a page of JSON.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from jobs import failures
from jobs.nomad.placement import explain
from jobs.spec import GpuRequest
from jobs.timestamps import rfc3339, unix_nanos

if TYPE_CHECKING:
    from jobs.nomad.client import NomadClient
    from jobs.spec import FinetuneSpec


class RunState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETE = "complete"
    FAILED = "failed"
    LOST = "lost"


TERMINAL = frozenset({RunState.COMPLETE, RunState.FAILED, RunState.LOST})
# "unknown" is a disconnected client (Nomad >= 1.6): the run may come back, but nobody can see it now.
_CLIENT_STATUS = {
    "pending": RunState.PENDING,
    "running": RunState.RUNNING,
    "complete": RunState.COMPLETE,
    "failed": RunState.FAILED,
    "lost": RunState.LOST,
    "unknown": RunState.LOST,
}


@dataclass(frozen=True)
class RunStatus:
    job_id: str
    state: RunState
    detail: str
    alloc_id: str | None
    node: str | None
    # The task's exit code from its last Terminated event (None while it runs or if unknown).
    exit_code: int | None = None
    # Nomad's own clock: when the allocation was placed and, once it is terminal, when it ended.
    placed_at: datetime | None = None
    ended_at: datetime | None = None
    # The fleet, not the task, ended it (jobs.failures): a lost node, a preemption, a reschedule, a GPU fault.
    infrastructure: bool = False
    cause: str | None = None


def _latest(items: list[dict[str, Any]]) -> dict[str, Any] | None:
    return max(items, key=lambda item: (item.get("CreateIndex", 0), item.get("ID", "")), default=None)


def _event_text(event: dict[str, Any]) -> str:
    message = event.get("DisplayMessage") or event.get("DriverError") or event.get("Message") or ""
    return f"{event.get('Type', 'event')}: {message}".rstrip(": ")


def _terminated(alloc: dict[str, Any]) -> dict[str, Any] | None:
    """The last Terminated task event (Nomad's TaskEvent: ExitCode, Details.exit_code/oom_killed)."""
    events = [e for state in (alloc.get("TaskStates") or {}).values() for e in state.get("Events") or [] if e.get("Type") == "Terminated"]
    return max(events, key=lambda e: e.get("Time", 0), default=None)


def _exit_code(alloc: dict[str, Any]) -> int | None:
    event = _terminated(alloc)
    if event is None:
        return None
    details = event.get("Details") or {}
    raw = details.get("exit_code", event.get("ExitCode"))
    try:
        return int(raw)
    except (TypeError, ValueError):
        return None


def _times(alloc: dict[str, Any], state: RunState) -> tuple[datetime | None, datetime | None]:
    """(placed, ended) from Nomad's own timestamps: the allocation's ``CreateTime`` (int64 Unix ns), and
    for a terminal one the tasks' latest ``FinishedAt`` (time.Time), else its ``ModifyTime``
    (hashicorp/nomad api/allocations.go AllocationListStub: TaskStates, CreateTime, ModifyTime; api/tasks.go
    TaskState: StartedAt, FinishedAt). Placement falls back to the earliest task ``StartedAt``."""
    tasks = (alloc.get("TaskStates") or {}).values()
    started = [t for t in (rfc3339(s.get("StartedAt")) for s in tasks) if t is not None]
    placed = unix_nanos(alloc.get("CreateTime")) or min(started, default=None)
    if state not in TERMINAL:
        return placed, None
    finished = [t for t in (rfc3339(s.get("FinishedAt")) for s in tasks) if t is not None]
    return placed, max(finished, default=None) or unix_nanos(alloc.get("ModifyTime"))


def _failing_task(alloc: dict[str, Any]) -> str:
    states = alloc.get("TaskStates") or {}
    failed = sorted(name for name, state in states.items() if state.get("Failed"))
    for name in failed or sorted(states):
        events = states[name].get("Events") or []
        if events:
            return f"task {name}: {_event_text(events[-1])}"
    return alloc.get("ClientDescription") or "no task events"


def _moved(alloc: dict[str, Any]) -> bool:
    """Nomad is moving the allocation off its node (a drain, a reschedule): api/allocations.go
    AllocationListStub.DesiredTransition {Migrate, Reschedule, ForceReschedule} (*bool, :572-583) and
    NextAllocation (:400, set once a replacement was made)."""
    transition = alloc.get("DesiredTransition") or {}
    return bool(alloc.get("NextAllocation")) or any(transition.get(k) for k in ("Migrate", "Reschedule", "ForceReschedule"))


def _infrastructure(allocations: list[dict[str, Any]], latest: dict[str, Any], exit_code: int | None) -> str | None:
    """The cause when the fleet, not the task, ended the run; values as hashicorp/nomad writes them
    (api/allocations.go :25 AllocDesiredStatusEvict "evict", :33-34 AllocClientStatusLost "lost" /
    AllocClientStatusUnknown "unknown", :403 AllocationListStub.PreemptedByAllocation; a lost node's
    allocation says scheduler/structs/const.go:22 "alloc is lost since its node is down").

    Any allocation of the run counts, not only the newest: the run's single-use secret_id went with
    its first allocation, so a replacement Nomad made elsewhere cannot log in and the attempt is over."""
    if any(a.get("PreemptedByAllocation") or a.get("DesiredStatus") == "evict" for a in allocations):
        return failures.PREEMPTED
    if any(a.get("ClientStatus") in ("lost", "unknown") for a in allocations):
        return failures.NODE_LOST
    if any(_moved(a) for a in allocations):
        return failures.RESCHEDULED
    if latest.get("ClientStatus") == "failed" and failures.hardware_exit(exit_code):
        return failures.HARDWARE_EXIT
    return None


def summarize(
    job_id: str,
    job: dict[str, Any],
    evaluations: list[dict[str, Any]],
    allocations: list[dict[str, Any]],
    *,
    pool: str | None = None,
    gpu: GpuRequest | None = None,
) -> RunStatus:
    """Pure: the API answers in, one status out (tests feed recorded answers)."""
    alloc = _latest(allocations)
    if alloc is not None:
        state = _CLIENT_STATUS.get(alloc.get("ClientStatus", ""), RunState.PENDING)
        node = alloc.get("NodeName") or alloc.get("NodeID")
        if alloc.get("PreemptedByAllocation"):
            detail = f"preempted by allocation {alloc['PreemptedByAllocation']} (a higher-priority job needed the GPUs)"
        elif state == RunState.FAILED and ((_terminated(alloc) or {}).get("Details") or {}).get("oom_killed") == "true":
            detail = f"OOM killed: {_failing_task(alloc)}"
        elif state == RunState.FAILED:
            detail = _failing_task(alloc)
        elif state == RunState.LOST:
            why = alloc.get("DesiredDescription") or alloc.get("ClientDescription") or "its client stopped reporting"
            detail = f"allocation {alloc.get('ID')} on {node} is {alloc.get('ClientStatus')}: {why}"
        elif alloc.get("DesiredStatus") == "stop" and state == RunState.COMPLETE:
            detail = "stopped by request"
        else:
            detail = _failing_task(alloc) if state == RunState.COMPLETE else f"on {node}"
        code = _exit_code(alloc)
        cause = _infrastructure(allocations, alloc, code)
        if cause in (failures.NODE_LOST, failures.RESCHEDULED) and state != RunState.LOST:
            lost = next((a for a in allocations if a.get("ClientStatus") in ("lost", "unknown") or _moved(a)), alloc)
            detail = (f"allocation {lost.get('ID')} on {lost.get('NodeName') or lost.get('NodeID')} was "
                      f"{'lost' if cause == failures.NODE_LOST else 'moved off its node'} ({lost.get('ClientDescription') or lost.get('DesiredDescription') or 'no description'})")
            state = RunState.LOST
        return RunStatus(job_id, state, detail, alloc.get("ID"), node, code, *_times(alloc, state), infrastructure=cause is not None, cause=cause)
    evaluation = _latest(evaluations)
    if job.get("Stop"):
        return RunStatus(job_id, RunState.COMPLETE, "stopped by request before it was placed", None, None)
    if evaluation is None:
        return RunStatus(job_id, RunState.PENDING, "waiting for the scheduler", None, None)
    if evaluation.get("Status") == "failed":
        return RunStatus(job_id, RunState.FAILED, f"evaluation failed: {evaluation.get('StatusDescription') or 'no reason given'}", None, None)
    # A failed placement completes its evaluation with FailedTGAllocs and leaves a blocked one behind.
    ordered = sorted(evaluations, key=lambda e: e.get("CreateIndex", 0), reverse=True)
    failed = next((e["FailedTGAllocs"] for e in ordered if e.get("FailedTGAllocs")), None)
    if failed and pool is not None and gpu is not None:
        return RunStatus(job_id, RunState.PENDING, f"waiting for capacity: {explain(failed, pool=pool, gpu=gpu)}", None, None)
    if failed or any(e.get("Status") == "blocked" for e in evaluations):
        return RunStatus(job_id, RunState.PENDING, "waiting for capacity (blocked evaluation)", None, None)
    return RunStatus(job_id, RunState.PENDING, f"evaluation {evaluation.get('Status', 'pending')}", None, None)


def follow(api: NomadClient, job_id: str, namespace: str, spec: FinetuneSpec | None, *, current: RunStatus,
           interval: float) -> Iterator[RunStatus]:
    """Each status of ``job_id`` read after ``current``, one per ``interval``, until a terminal one
    (``status --watch``)."""
    while current.state not in TERMINAL:
        time.sleep(interval)
        current = api.status(job_id, namespace, spec)
        yield current
