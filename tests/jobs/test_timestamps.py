"""jobs.timestamps and the scheduler times the status summaries take from them (issue 25's cost of
runs the reconciler did not see placed). Field names: hashicorp/nomad api/allocations.go
AllocationListStub (CreateTime, ModifyTime: int64 Unix ns; TaskStates), api/tasks.go TaskState
(StartedAt, FinishedAt: time.Time); k8s.io/api batch/v1 types.go JobStatus (startTime, completionTime,
conditions[].lastTransitionTime)."""

from __future__ import annotations

from datetime import datetime

from jobs.k8s.status import State, summarize as k8s_summarize
from jobs.nomad.status import RunState, summarize as nomad_summarize
from jobs.timestamps import rfc3339, unix_nanos

T0 = datetime(2026, 12, 3, 8, 0, 0)


def test_go_and_kubernetes_times_read_as_naive_utc():
    assert rfc3339("2026-12-03T08:00:00.123456789Z") == T0.replace(microsecond=123456)
    assert rfc3339("2026-12-03T09:00:00+01:00") == T0
    assert rfc3339("2026-12-03T08:00:00Z") == T0
    assert rfc3339("0001-01-01T00:00:00Z") is None  # Go's zero time: never happened
    assert rfc3339("yesterday") is None and rfc3339(None) is None
    assert unix_nanos(0) is None and unix_nanos(None) is None
    assert unix_nanos(1_796_284_800_000_000_000) == datetime(2026, 12, 3, 8, 0, 0)


def test_a_nomad_allocation_gives_its_placement_and_the_tasks_finish():
    alloc = {"ID": "a1", "ClientStatus": "complete", "DesiredStatus": "run", "CreateIndex": 1, "CreateTime": 1_796_284_800_000_000_000,
             "ModifyTime": 1_796_292_000_000_000_000,
             "TaskStates": {"train": {"State": "dead", "StartedAt": "2026-12-03T08:00:30Z", "FinishedAt": "2026-12-03T09:59:00.5Z", "Events": []}}}
    status = nomad_summarize("j", {}, [], [alloc])
    assert (status.placed_at, status.ended_at) == (T0, datetime(2026, 12, 3, 9, 59, 0, 500000))
    running = nomad_summarize("j", {}, [], [{**alloc, "ClientStatus": "running"}])
    assert running.state == RunState.RUNNING and (running.placed_at, running.ended_at) == (T0, None)
    no_finish = {**alloc, "TaskStates": {"train": {"State": "dead", "FinishedAt": "0001-01-01T00:00:00Z", "Events": []}}}
    assert nomad_summarize("j", {}, [], [no_finish]).ended_at == datetime(2026, 12, 3, 10, 0, 0)  # ModifyTime


def test_a_failed_kubernetes_job_ends_at_its_failed_condition():
    """completionTime is set only on success; a failed Job's end is its Failed condition's transition."""
    job = {"metadata": {"name": "r"}, "spec": {"parallelism": 1},
           "status": {"startTime": "2026-12-03T08:00:00Z", "failed": 1, "conditions": [
               {"type": "Failed", "status": "True", "reason": "PodFailurePolicy", "message": "failed with exit code 1",
                "lastTransitionTime": "2026-12-03T08:30:00Z"}]}}
    status = k8s_summarize(job, [])
    assert status.state == State.FAILED and (status.placed_at, status.ended_at) == (T0, datetime(2026, 12, 3, 8, 30, 0))
