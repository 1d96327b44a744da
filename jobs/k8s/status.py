"""A GKE run's state from its Job and its Kueue Workload, in the scheduler-neutral words.

Kueue decides *whether* a Job may run (the Workload's QuotaReserved / Admitted / Evicted /
Finished conditions, ``apis/kueue/v1beta2/workload_types.go``); the Job controller reports
*how* it ran (Complete / Failed with reason DeadlineExceeded, PodFailurePolicy,
BackoffLimitExceeded; ``batch/v1`` JobStatus). Users want one of pending / running /
succeeded / failed / stopped and one line of why.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from jobs import failures
from jobs.k8s.render import DISPATCH_ANNOTATION, PREFLIGHT_CONTAINER
from jobs.timestamps import rfc3339

if TYPE_CHECKING:
    from jobs.k8s.client import K8sClient

# Exit code gpufleet-exec uses for a Vault error (an already-unwrapped wrapping token included).
EXIT_VAULT_ERROR = 78
# The Job controller's PodFailurePolicy message: "Container train for pod ns/x failed with exit code 3 matching FailJob rule at index 1" (index 0 in Jobs made before the disruption rule came first).
_EXIT_CODE = re.compile(r"failed with exit code (\d+)")
# A failed GPU health pre-flight (jobs.k8s.render.PREFLIGHT_CONTAINER): the node, not the job, is at fault.
_PREFLIGHT = re.compile(rf"Container {PREFLIGHT_CONTAINER} for pod (\S+) failed with exit code (\d+)")
INFRASTRUCTURE_FAILURE = "infrastructure failure (GPU health gate)"
# The Job controller's message when a pod condition rule fails the Job (kubernetes
# pkg/controller/job/pod_failure_policy.go: "Pod %s/%s has condition %v matching %v rule at index %d").
_POD_CONDITION = re.compile(r"Pod (\S+) has condition DisruptionTarget matching FailJob rule")
# The pod condition and its reasons, as kubernetes writes them (staging/src/k8s.io/api/core/v1/types.go,
# the PodConditionType DisruptionTarget and the PodReason* constants; pkg/apis/core/types.go likewise).
# Every one of them is the fleet taking the pod away, never the training command: infrastructure.
DISRUPTION_TARGET = "DisruptionTarget"
DISRUPTION_REASONS = ("PreemptionByScheduler", "DeletionByTaintManager", "EvictionByEvictionAPI", "DeletionByPodGC", "TerminationByKubelet")
# Kueue's Workload conditions (kubernetes-sigs/kueue apis/kueue/v1beta1/workload_types.go:654 WorkloadEvicted
# "Evicted", :661 WorkloadPreempted "Preempted"; Evicted reasons :697 "Preempted", :701 "PodsReadyTimeout",
# :705 "AdmissionCheck", :709 "ClusterQueueStopped", :717 "NodeFailures"; Preempted reasons :675-687
# "InClusterQueue", "InCohortReclamation", "InCohortFairSharing", "InCohortReclaimWhileBorrowing").
WORKLOAD_EVICTED = "Evicted"
WORKLOAD_PREEMPTED = "Preempted"


class State(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"


TERMINAL = frozenset({State.SUCCEEDED, State.FAILED, State.STOPPED})


@dataclass(frozen=True)
class K8sRunStatus:
    run: str
    state: State
    reason: str
    queue: str | None = None
    flavor: str | None = None
    # Kueue admitted it and the Job controller made its pods (what costs money).
    placed: bool = False
    # 0 when every rank succeeded; the failing container's code when the Job says which.
    exit_code: int | None = None
    # The name of the Kueue Workload that admits it (None until Kueue made one).
    workload: str | None = None
    # Pods ready (the Job's status.ready) out of the ranks it runs (spec.parallelism).
    ready: int = 0
    ranks: int = 1
    # The run failed because of a node (the GPU health gate), not its own code.
    infrastructure: bool = False
    # The API server's own clock: when the Job started (Kueue unsuspended it) and, once it ended, when.
    placed_at: datetime | None = None
    ended_at: datetime | None = None
    # jobs.failures' short cause when ``infrastructure`` (or why Kueue took the run's quota back).
    cause: str | None = None


def _conditions(obj: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """Conditions by type; only the True/False ones that are set (Unknown says nothing)."""
    items = ((obj or {}).get("status") or {}).get("conditions") or []
    return {c["type"]: c for c in items if c.get("status") in ("True", "False")}


def _true(conditions: dict[str, dict[str, Any]], kind: str) -> dict[str, Any] | None:
    condition = conditions.get(kind)
    return condition if condition and condition["status"] == "True" else None


def _why(condition: dict[str, Any]) -> str:
    return f"{condition.get('reason') or 'no reason'}: {condition.get('message') or 'no message'}"


def _failure(job: dict[str, Any], condition: dict[str, Any], evicted_before: bool) -> str:
    reason = condition.get("reason")
    if reason == "DeadlineExceeded":
        seconds = job["spec"].get("activeDeadlineSeconds")
        return f"ran past max_run_hours (activeDeadlineSeconds {seconds}): {condition.get('message') or 'deadline exceeded'}"
    text = f"{_why(condition)}"
    if "exit code 137" in (condition.get("message") or ""):
        text += " (exit 137 is SIGKILL: usually the container hit its memory limit, OOMKilled; raise memory_mb or lower the batch size)"
    if f"exit code {EXIT_VAULT_ERROR}" in (condition.get("message") or ""):
        text += f" (exit {EXIT_VAULT_ERROR} is gpufleet-exec's Vault error; see the pod log"
        text += "; this run was evicted by Kueue and resumed, so its pods presented an already-used secret_id: re-dispatch it)" if evicted_before else ")"
    return text


def _ended_at(status: dict[str, Any], conditions: dict[str, dict[str, Any]]) -> datetime | None:
    """``status.completionTime`` (set only when the Job succeeds), else the Complete/Failed condition's
    ``lastTransitionTime`` (k8s.io/api batch/v1 types.go JobStatus.CompletionTime, JobCondition)."""
    ended = rfc3339(status.get("completionTime"))
    if ended is None:
        ended = next((rfc3339(c.get("lastTransitionTime")) for kind in ("Complete", "Failed")
                      if (c := _true(conditions, kind)) is not None), None)
    return ended


def summarize(job: dict[str, Any], workloads: list[dict[str, Any]]) -> K8sRunStatus:
    """Pure: the Job and its Workloads (as the API returns them) in, one status out."""
    meta, spec, status = job["metadata"], job.get("spec") or {}, job.get("status") or {}
    run = meta["name"]
    workload = max(workloads, key=lambda w: int(w["metadata"].get("resourceVersion") or 0), default=None)
    wl = _conditions(workload)
    admission = ((workload or {}).get("status") or {}).get("admission") or {}
    queue = admission.get("clusterQueue")
    flavors = sorted({f for a in admission.get("podSetAssignments") or [] for f in (a.get("flavors") or {}).values()})
    flavor = ",".join(flavors) or None
    jc = _conditions(job)
    evicted_before = bool(wl.get("Evicted")) or bool(wl.get("Preempted"))

    placed = bool(status.get("startTime") or status.get("active") or status.get("succeeded") or status.get("failed"))

    def out(state: State, reason: str, exit_code: int | None = None) -> K8sRunStatus:
        ended = _ended_at(status, jc) if state in TERMINAL else None
        return K8sRunStatus(run, state, reason, queue, flavor, placed, exit_code, (workload or {}).get("metadata", {}).get("name"),
                            int(status.get("ready") or 0), int(spec.get("parallelism") or 1), placed_at=rfc3339(status.get("startTime")),
                            ended_at=ended)

    if meta.get("deletionTimestamp"):
        return out(State.STOPPED, "stopped by request; Kubernetes is terminating its pods")
    if complete := _true(jc, "Complete"):
        return out(State.SUCCEEDED, f"all {spec.get('completions', 1)} rank(s) succeeded ({complete.get('reason') or 'Complete'})", 0)
    if failed := (_true(jc, "Failed") or _true(jc, "FailureTarget")):
        if gate := _PREFLIGHT.search(failed.get("message") or ""):
            return dataclasses.replace(out(State.FAILED, f"{INFRASTRUCTURE_FAILURE}: pod {gate[1]} failed the pre-flight GPU check (dcgmi diag exit"
                                                       f" {gate[2]}) before any rank started training; its node has a GPU fault: submit the run"
                                                       " again (on other nodes) and have the node drained and repaired", None),
                                       infrastructure=True, cause=failures.GPU_HEALTH_GATE)
        if pod := _POD_CONDITION.search(failed.get("message") or ""):
            # The reason is on the pod (disruption_cause reads it): until then, a disruption of unknown kind.
            return dataclasses.replace(out(State.FAILED, f"pod {pod[1]} was disrupted ({DISRUPTION_TARGET}): {_why(failed)}"),
                                       infrastructure=True, cause=failures.disruption(""))
        code = _EXIT_CODE.search(failed.get("message") or "")
        exit_code = int(code[1]) if code else None
        status_ = out(State.FAILED, _failure(job, failed, evicted_before), exit_code)
        if failures.hardware_exit(exit_code):
            return dataclasses.replace(status_, infrastructure=True, cause=failures.HARDWARE_EXIT)
        return status_
    if workload is None:
        return out(State.PENDING, "waiting for Kueue to create its Workload (is Kueue running, and the job's LocalQueue there?)")
    if finished := _true(wl, "Finished"):
        state = State.SUCCEEDED if finished.get("reason") == "Succeeded" else State.FAILED
        return out(state, f"Kueue: {_why(finished)}")
    if workload.get("spec", {}).get("active") is False:
        return out(State.STOPPED, "its Kueue Workload was deactivated; the Job will not be admitted again")
    if _true(wl, "Admitted") and not spec.get("suspend"):
        ranks = spec.get("parallelism", 1)
        return out(State.RUNNING, f"admitted to ClusterQueue {queue} on flavor {flavor}; {status.get('ready', 0)}/{ranks} rank(s) ready, {status.get('active', 0)} active")
    if evicted := _true(wl, WORKLOAD_EVICTED):
        preempted = _true(wl, WORKLOAD_PREEMPTED)
        detail = _why(preempted) if preempted else _why(evicted)
        return dataclasses.replace(out(State.PENDING, f"evicted by Kueue ({evicted.get('reason')}; {detail}) and queued again; "
                                                     "a run whose pods had started cannot resume with its spent secret_id: the control plane"
                                                     " retries it as a new attempt; one dispatched by hand: stop it and re-dispatch"),
                                   cause=failures.kueue_eviction(f"{evicted.get('reason') or ''}{'/' + str(preempted.get('reason')) if preempted else ''}"))
    if _true(wl, "QuotaReserved"):
        return out(State.PENDING, "quota reserved; waiting for admission checks")
    reserved = wl.get("QuotaReserved")
    if reserved is not None:
        return out(State.PENDING, f"waiting for quota: {_why(reserved)}")
    return out(State.PENDING, f"queued in LocalQueue {workload.get('spec', {}).get('queueName')}; Kueue has not evaluated it yet")


def disruption_cause(pods: list[dict[str, Any]]) -> str | None:
    """The reason of the first True ``DisruptionTarget`` condition among the run's pods (a failed
    Job's pods stay until it is deleted), as a jobs.failures cause; None if no pod has one."""
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        for condition in (pod.get("status") or {}).get("conditions") or []:
            if condition.get("type") == DISRUPTION_TARGET and condition.get("status") == "True":
                return failures.disruption(condition.get("reason") or "")
    return None


def dispatch_id(job: dict[str, Any]) -> str | None:
    return (job["metadata"].get("annotations") or {}).get(DISPATCH_ANNOTATION)


def follow(api: K8sClient, namespace: str, run: str, *, current: K8sRunStatus, interval: float) -> Iterator[K8sRunStatus]:
    """Each status of ``run`` read after ``current``, until a terminal one (``status --watch``).

    The watch wakes on every Job change; Workload-only changes (quota, eviction reasons) show when
    the watch times out after ``interval`` and the status is read again.
    """
    while current.state not in TERMINAL:
        started = time.monotonic()
        for _ in api.watch_job(namespace, run, timeout_seconds=max(1, int(interval))):
            current = api.status(namespace, run)
            yield current
            if current.state in TERMINAL:
                break
        else:
            time.sleep(max(0.0, interval - (time.monotonic() - started)))
            current = api.status(namespace, run)
            yield current
