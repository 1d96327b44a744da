"""plan.yml runs the offline preview first, without cloud credentials, and the PR comment carries it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.safety.test_workflows import load


def test_preview_job_runs_before_every_plan_with_no_credentials() -> None:
    workflow = load("plan.yml")
    job = workflow["jobs"]["preview"]
    assert job["permissions"] == {"contents": "read"} and "env" not in job  # no id-token, no secrets
    assert not any("secrets." in str(step) or "google-github-actions/auth" in str(step.get("uses", "")) for step in job["steps"])
    checkout = next(s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/checkout"))
    assert checkout["with"]["fetch-depth"] == 0
    run = next(s for s in job["steps"] if "gpufleet preview" in s.get("run", ""))
    assert "set +e" not in run["run"] and "|| true" not in run["run"] and "continue-on-error" not in run  # exit 4 fails the job
    assert '--base "$BASE_SHA"' in run["run"] and "--json-out preview-report/preview.json" in run["run"]
    assert run["env"]["BASE_SHA"] == "${{ github.event.pull_request.base.sha }}"
    assert "preview" in workflow["jobs"]["plan"]["needs"]


@pytest.mark.parametrize(("preview_exit", "step_passes"), [(0, True), (3, True), (4, False), (2, False), (1, False)])
def test_preview_step_passes_changes_and_fails_a_blocked_preview(tmp_path: Path, preview_exit: int, step_passes: bool) -> None:
    """The step's own shell (GitHub runs ``bash -e``) with a stand-in gpufleet that exits as preview does: a PR that
    changes the fleet (exit 3) must not fail the job, a blocked one (4) and errors must."""
    run = next(s for s in load("plan.yml")["jobs"]["preview"]["steps"] if "gpufleet preview" in s.get("run", ""))
    fake = tmp_path / "gpufleet"
    fake.write_text(f"#!/bin/sh\nexit {preview_exit}\n")
    fake.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "BASE_SHA": "0" * 40}
    done = subprocess.run(["bash", "--noprofile", "--norc", "-e", "-o", "pipefail", "-c", run["run"]], env=env, cwd=tmp_path, check=False)
    assert (done.returncode == 0) is step_passes


def test_comment_puts_the_preview_on_top() -> None:
    job = load("plan.yml")["jobs"]["comment"]
    assert "preview" in job["needs"]
    download = next(s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/download-artifact") and s["with"].get("name") == "preview")
    assert download["with"]["path"] == "preview-report"
    assert "--preview preview-report/preview.json" in " ".join(s.get("run", "") for s in job["steps"])
