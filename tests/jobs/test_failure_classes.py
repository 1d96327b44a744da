"""Failure classes (issue 25): which scheduler states are the fleet's doing (infrastructure, retried)
and which are the run's own (user), read from the fields upstream writes. Pure: recorded API answers
in, one status out. Sources: hashicorp/nomad api/allocations.go (AllocClientStatusLost :33,
AllocClientStatusUnknown :34, AllocDesiredStatusEvict :25, AllocationListStub.PreemptedByAllocation
:403, NextAllocation :400, DesiredTransition :572-583), scheduler/structs/const.go:22; kubernetes
staging/src/k8s.io/api/core/v1/types.go (DisruptionTarget and its PodReason* values),
pkg/controller/job/pod_failure_policy.go (the FailJob message); kubernetes-sigs/kueue
apis/kueue/v1beta1/workload_types.go:654-717 (Evicted, Preempted and their reasons).
"""

from __future__ import annotations

from typing import Any

import pytest

from jobs import failures
from jobs.k8s.status import DISRUPTION_REASONS, State, disruption_cause, summarize as k8s_summarize
from jobs.nomad.status import RunState, summarize as nomad_summarize

JOB = {"ID": "ft/dispatch-1", "Status": "dead"}


def _alloc(**fields: Any) -> dict[str, Any]:
    return {"ID": "a1", "NodeName": "gpu-1", "ClientStatus": "running", "DesiredStatus": "run", "CreateIndex": 1, "TaskStates": {}, **fields}


def _terminated(code: int, *, oom: bool = False) -> dict[str, Any]:
    details = {"exit_code": str(code), **({"oom_killed": "true"} if oom else {})}
    return {"train": {"State": "dead", "Failed": True, "Events": [{"Type": "Terminated", "Time": 1, "ExitCode": code, "Details": details}]}}


@pytest.mark.parametrize(("alloc", "cause"), [
    (_alloc(ClientStatus="lost", DesiredStatus="stop", DesiredDescription="alloc is lost since its node is down"), failures.NODE_LOST),
    (_alloc(ClientStatus="unknown"), failures.NODE_LOST),
    (_alloc(ClientStatus="complete", DesiredStatus="evict", PreemptedByAllocation="b2"), failures.PREEMPTED),
    (_alloc(DesiredTransition={"Migrate": True}), failures.RESCHEDULED),
    (_alloc(ClientStatus="failed", NextAllocation="a2"), failures.RESCHEDULED),
    (_alloc(ClientStatus="failed", TaskStates=_terminated(75)), failures.HARDWARE_EXIT),
])
def test_nomad_infrastructure_failures(alloc: dict[str, Any], cause: str) -> None:
    status = nomad_summarize("ft/dispatch-1", JOB, [], [alloc])
    assert status.infrastructure and status.cause == cause and status.state in (RunState.LOST, RunState.FAILED, RunState.COMPLETE)


@pytest.mark.parametrize("alloc", [
    _alloc(ClientStatus="failed", TaskStates=_terminated(1)),
    _alloc(ClientStatus="failed", TaskStates=_terminated(137, oom=True)),
    _alloc(ClientStatus="failed", TaskStates=_terminated(124)),  # gpufleet-exec's max run time: the deadline
])
def test_nomad_user_failures(alloc: dict[str, Any]) -> None:
    status = nomad_summarize("ft/dispatch-1", JOB, [], [alloc])
    assert status.state == RunState.FAILED and not status.infrastructure and status.cause is None


def test_a_replacement_allocation_does_not_hide_the_lost_one() -> None:
    """Nomad placed a replacement after the node was lost; the attempt is still over (its secret_id is spent)."""
    lost = _alloc(ClientStatus="lost", NextAllocation="a2")
    replacement = _alloc(ID="a2", CreateIndex=2, ClientStatus="running")
    status = nomad_summarize("ft/dispatch-1", JOB, [], [lost, replacement])
    assert status.state == RunState.LOST and status.cause == failures.NODE_LOST and "a1 on gpu-1 was lost" in status.detail


def _job(conditions: list[dict[str, Any]], **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "ft-1", "namespace": "research"}, "spec": {"parallelism": 2, "completions": 2},
            "status": {"conditions": conditions, **status}}


def _cond(kind: str, reason: str, message: str = "") -> dict[str, Any]:
    return {"type": kind, "status": "True", "reason": reason, "message": message}


def test_a_disruption_target_failure_is_infrastructure_and_its_pod_says_which() -> None:
    message = "Pod research/ft-1-1-abcde has condition DisruptionTarget matching FailJob rule at index 0"
    status = k8s_summarize(_job([_cond("Failed", "PodFailurePolicy", message)], failed=1), [])
    assert status.state == State.FAILED and status.infrastructure and status.cause == failures.disruption("")
    for reason in DISRUPTION_REASONS:
        pod = {"metadata": {"name": "ft-1-1-abcde"}, "status": {"conditions": [_cond("DisruptionTarget", reason)]}}
        assert disruption_cause([pod]) == f"disruption-{reason}"


@pytest.mark.parametrize(("message", "infrastructure"), [
    ("Container train for pod research/ft-1-0-x failed with exit code 75 matching FailJob rule at index 1", True),
    ("Container train for pod research/ft-1-0-x failed with exit code 1 matching FailJob rule at index 1", False),
    ("Container train for pod research/ft-1-0-x failed with exit code 137 matching FailJob rule at index 1", False),  # OOMKilled
])
def test_k8s_exit_codes(message: str, infrastructure: bool) -> None:
    status = k8s_summarize(_job([_cond("Failed", "PodFailurePolicy", message)], failed=1), [])
    assert status.state == State.FAILED and status.infrastructure is infrastructure


def test_a_deadline_is_the_runs_own() -> None:
    job = _job([_cond("Failed", "DeadlineExceeded", "Job was active longer than specified deadline")], failed=1)
    job["spec"]["activeDeadlineSeconds"] = 60
    status = k8s_summarize(job, [])
    assert status.state == State.FAILED and not status.infrastructure


@pytest.mark.parametrize(("evicted", "preempted", "cause"), [
    ("Preempted", "InCohortReclamation", "kueue-Preempted/InCohortReclamation"),
    ("NodeFailures", None, "kueue-NodeFailures"),
    ("PodsReadyTimeout", None, "kueue-PodsReadyTimeout"),
])
def test_a_kueue_eviction_names_its_reason(evicted: str, preempted: str | None, cause: str) -> None:
    conditions = [_cond("Evicted", evicted)] + ([_cond("Preempted", preempted)] if preempted else [])
    workload = {"metadata": {"name": "wl", "resourceVersion": "2"}, "spec": {"queueName": "q"}, "status": {"conditions": conditions}}
    status = k8s_summarize(_job([]), [workload])
    assert status.state == State.PENDING and status.cause == cause
