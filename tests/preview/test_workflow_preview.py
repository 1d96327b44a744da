"""plan.yml runs the offline preview first, without cloud credentials, and the PR comment carries it."""

from __future__ import annotations

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


def test_comment_puts_the_preview_on_top() -> None:
    job = load("plan.yml")["jobs"]["comment"]
    assert "preview" in job["needs"]
    download = next(s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/download-artifact") and s["with"].get("name") == "preview")
    assert download["with"]["path"] == "preview-report"
    assert "--preview preview-report/preview.json" in " ".join(s.get("run", "") for s in job["steps"])
