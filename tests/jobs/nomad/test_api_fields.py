"""What gpufleet sends Nomad uses only field names of Nomad's api package structs, read from
hashicorp/nomad's source (vendored extract ``vendor/nomad_api_fields.json``, with its tags and
commits; regenerate with ``vendor/extract_nomad_api.py``): the rendered jobs, and the plan,
register and dispatch bodies the client puts on the wire (recorded by the API double)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from jobs.nomad.client import NomadClient
from jobs.loader import load_all
from jobs.nomad.render import render

VENDORED = json.loads((Path(__file__).parent.parent / "vendor" / "nomad_api_fields.json").read_text())
OLD, NEW = "v1.10.5", "v2.0.5"  # the version the fleet installs, and the newest read
# Nothing is sent that the fleet's version lacks (MaxRunDuration, honoured only from 2.0.3, was
# dropped; gpufleet-exec enforces the same limit).
NEWER_ONLY: set[tuple[str, str]] = set()
CHILDREN = {
    "Job": {"TaskGroups": "TaskGroup", "Constraints": "Constraint", "Affinities": "Affinity", "ParameterizedJob": "ParameterizedJobConfig",
            "Reschedule": "ReschedulePolicy"},
    "TaskGroup": {"Tasks": "Task", "Constraints": "Constraint", "Affinities": "Affinity", "RestartPolicy": "RestartPolicy",
                  "ReschedulePolicy": "ReschedulePolicy", "EphemeralDisk": "EphemeralDisk"},
    "Task": {"Resources": "Resources", "Constraints": "Constraint", "Affinities": "Affinity", "RestartPolicy": "RestartPolicy"},
    "Resources": {"Devices": "RequestedDevice"},
    "RequestedDevice": {"Constraints": "Constraint", "Affinities": "Affinity"},
}


def field_errors(value: Any, struct: str, where: str) -> list[str]:
    errors = []
    for key, item in value.items():
        if key not in VENDORED[NEW][struct] and key not in VENDORED[OLD][struct]:
            errors.append(f"{where}.{key}: not a field of Nomad's api.{struct}")
        elif key not in VENDORED[OLD][struct] and (struct, key) not in NEWER_ONLY:
            errors.append(f"{where}.{key}: api.{struct} has it only after {OLD}, the version the fleet runs")
        child = CHILDREN.get(struct, {}).get(key)
        if child and item is not None:
            for i, element in enumerate(item if isinstance(item, list) else [item]):
                errors += field_errors(element, child, f"{where}.{key}[{i}]")
    return errors


def test_vendored_extract_names_its_source() -> None:
    assert VENDORED["_provenance"]["repo"] == "hashicorp/nomad"
    assert VENDORED["_provenance"]["tags"][OLD] == "a3b86c697f38ab032e1acaae8503ed10815bc4a2"
    assert "MaxRunDuration" in VENDORED[NEW]["TaskGroup"] and "MaxRunDuration" not in VENDORED[OLD]["TaskGroup"]


@pytest.mark.parametrize("spec", load_all(), ids=lambda s: s.name)
def test_rendered_jobs_use_only_api_fields(spec) -> None:
    assert field_errors(render(spec)["Job"], "Job", "Job") == []


def test_field_check_fails_on_an_unknown_field() -> None:
    assert field_errors({"TaskGroups": [{"Name": "t", "MaxRunTime": 1}]}, "Job", "Job") == ["Job.TaskGroups[0].MaxRunTime: not a field of Nomad's api.TaskGroup"]


def test_request_bodies_on_the_wire_use_only_api_fields(nomad, client_for) -> None:
    client: NomadClient = client_for(nomad)
    spec = next(s for s in load_all() if s.name == "finetune-llama")
    client.plan(spec)
    client.register(spec)
    client.dispatch(spec, {"dataset_uri": "hf://d/x@v1", "run_id": "r"}, role_id="r", wrapping_token="w", idempotency_token="i")
    plan, register, dispatch = nomad.requests[:3]
    for body, request in ((plan.body, "JobPlanRequest"), (register.body, "JobRegisterRequest"), (dispatch.body, "JobDispatchRequest")):
        assert set(body) <= set(VENDORED[OLD][request]), (request, set(body) - set(VENDORED[OLD][request]))
    assert field_errors(plan.body["Job"], "Job", "plan.Job") == [] and field_errors(register.body["Job"], "Job", "register.Job") == []


# What the control plane's batch reconcile (jobs.runner.NomadRunner.poll) reads from the list answers.
READ_FROM_LISTS = {"JobListStub": {"ID", "Status", "Stop", "ModifyIndex", "JobModifyIndex", "JobSummary"},
                   "AllocationListStub": {"ID", "JobID", "ClientStatus", "DesiredStatus", "ModifyIndex", "PreemptedByAllocation", "TaskStates",
                                          "NodeName", "NodeID", "CreateIndex", "ClientDescription"},
                   "TaskState": {"Events", "Failed"}, "TaskEvent": {"Type", "Time", "ExitCode", "Details", "DisplayMessage", "DriverError", "Message"}}
LIST_CHILDREN = {"JobListStub": {"JobSummary": "JobSummary"}, "AllocationListStub": {"TaskStates": "TaskState"}, "TaskState": {"Events": "TaskEvent"}}


def _answer_errors(value: dict[str, Any], struct: str, where: str) -> list[str]:
    errors = [f"{where}.{key}: not a field of api.{struct} in {OLD}" for key in value if key not in VENDORED[OLD][struct]]
    for key, child in LIST_CHILDREN.get(struct, {}).items():
        item = value.get(key)
        elements = list(item.values()) if isinstance(item, dict) and struct == "AllocationListStub" else item if isinstance(item, list) else [item] if item else []
        errors += [e for i, element in enumerate(elements) for e in _answer_errors(element, child, f"{where}.{key}[{i}]")]
    return errors


def test_the_fields_the_batch_reconcile_reads_exist_in_both_versions() -> None:
    for struct, fields in READ_FROM_LISTS.items():
        for tag in (OLD, NEW):
            assert fields <= set(VENDORED[tag][struct]), (tag, struct, fields - set(VENDORED[tag][struct]))


def test_the_double_lists_jobs_by_prefix_and_allocations_with_api_fields(nomad, client_for) -> None:
    client: NomadClient = client_for(nomad)
    spec = next(s for s in load_all() if s.name == "finetune-llama")
    client.register(spec)
    child = client.dispatch(spec, {"dataset_uri": "hf://d/x@v1", "run_id": "r"}, role_id="r", wrapping_token="w", idempotency_token="i").dispatched_job_id
    nomad.finish(child, client_status="complete", events=[{"Type": "Terminated", "Time": 1, "ExitCode": 0, "Details": {"exit_code": "0"}}])
    stubs = client.list_jobs(spec.namespace, f"{spec.name}/dispatch-")
    assert [s["ID"] for s in stubs] == [child]  # the parameterized parent does not match the prefix
    allocations = client.list_allocations(spec.namespace)
    assert [a["JobID"] for a in allocations] == [child] and allocations[0]["TaskStates"]["train"]["Events"][0]["ExitCode"] == 0
    errors = [e for s in stubs for e in _answer_errors(s, "JobListStub", "jobs[]")] + [e for a in allocations for e in _answer_errors(a, "AllocationListStub", "allocations[]")]
    assert errors == []
    listed = nomad.calls("GET", "register")[-1].query
    assert listed["prefix"] == [f"{spec.name}/dispatch-"] and listed["namespace"] == [spec.namespace]
