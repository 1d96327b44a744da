"""The CI workflows plan and report only: no apply/deploy step, least-privilege permissions, pinned terraform."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

WORKFLOWS = Path(__file__).resolve().parents[2] / ".github" / "workflows"
FORBIDDEN = re.compile(r"\b(apply|deploy|destroy)\b|auto-approve")


def load(name: str) -> dict[str, Any]:
    return YAML(typ="safe").load((WORKFLOWS / name).read_text())


def steps(workflow: dict[str, Any]) -> list[dict[str, Any]]:
    return [step for job in workflow["jobs"].values() for step in job.get("steps", [])]


@pytest.mark.parametrize("name", ["plan.yml", "drift.yml"])
def test_no_step_applies_or_deploys(name: str) -> None:
    for step in steps(load(name)):
        for text in (step.get("run", ""), step.get("uses", ""), step.get("name", ""), str(step.get("with", {}).get("script", ""))):
            assert not FORBIDDEN.search(text), f"{name}: step {step.get('name') or step.get('uses')} may change infrastructure: {text!r}"


@pytest.mark.parametrize(
    ("name", "writers"),
    [
        ("plan.yml", {"plan": {"id-token": "write"}, "comment": {"pull-requests": "write"}}),
        ("drift.yml", {"drift": {"id-token": "write"}, "report": {"issues": "write"}}),
    ],
)
def test_permissions_are_minimal(name: str, writers: dict[str, dict[str, str]]) -> None:
    workflow = load(name)
    assert workflow["permissions"] == {"contents": "read"}
    for job_name, job in workflow["jobs"].items():
        expected = {"contents": "read"} | writers.get(job_name, {})
        assert job.get("permissions", workflow["permissions"]) == expected, f"{name}: job {job_name}"


def test_plan_runs_on_pull_request_only_never_pull_request_target() -> None:
    assert set(load("plan.yml")["on"]) == {"pull_request"}


def test_plan_matrix_comes_from_gpufleet_stacks_and_every_stack_is_checked_gated_and_uploaded() -> None:
    workflow = load("plan.yml")
    assert "gpufleet stacks --json" in " ".join(s.get("run", "") for s in workflow["jobs"]["stacks"]["steps"])
    runs = " ".join(s.get("run", "") for s in workflow["jobs"]["plan"]["steps"])
    assert workflow["jobs"]["plan"]["strategy"]["matrix"]["stack"] == "${{ fromJson(needs.stacks.outputs.matrix) }}"
    assert "gpufleet check" in runs and "--summary-out" in runs and "--no-lock" in runs
    comment = " ".join(s.get("run", "") for s in workflow["jobs"]["comment"]["steps"])
    assert "gpufleet ci comment" in comment and "--expected" in comment


def test_drift_is_scheduled_and_plans_with_detailed_exitcode() -> None:
    workflow = load("drift.yml")
    assert workflow["on"]["schedule"] and "pull_request" not in workflow["on"]
    runs = " ".join(s.get("run", "") for s in workflow["jobs"]["drift"]["steps"])
    assert "-detailed-exitcode" in runs and "-lock=false" in runs


@pytest.mark.parametrize("name", ["plan.yml", "drift.yml"])
def test_terraform_is_pinned_to_the_repo_version(name: str) -> None:
    assert load(name)["env"]["TERRAFORM_VERSION"] == "1.11.4"


def test_drift_reports_a_refused_protected_destroy_as_blocked_not_as_an_error() -> None:
    runs = " ".join(s.get("run", "") for s in load("drift.yml")["jobs"]["drift"]["steps"])
    assert 'if [ "$rc" -eq 1 ]' in runs and 'gpufleet plan "${{ matrix.stack }}" --no-lock --summary-out' in runs
