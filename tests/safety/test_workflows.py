"""The CI workflows plan and report only: no apply/deploy step, least-privilege permissions, pinned terraform,
and they pass an outside audit (zizmor, offline): actions pinned to commits, no template injection,
no persisted checkout credentials."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import json
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
    assert workflow["permissions"] == {}, "nothing by default; each job asks for what it uses"
    for job_name, job in workflow["jobs"].items():
        expected = {"contents": "read"} | writers.get(job_name, {})
        assert job.get("permissions") == expected, f"{name}: job {job_name}"


def test_plan_runs_on_pull_request_only_never_pull_request_target() -> None:
    assert set(load("plan.yml")["on"]) == {"pull_request"}


def test_plan_matrix_comes_from_gpufleet_stacks_and_every_stack_is_checked_gated_and_uploaded() -> None:
    workflow = load("plan.yml")
    assert "gpufleet stacks --json" in " ".join(s.get("run", "") for s in workflow["jobs"]["stacks"]["steps"])
    runs = " ".join(s.get("run", "") for s in workflow["jobs"]["plan"]["steps"])
    assert workflow["jobs"]["plan"]["strategy"]["matrix"] == {"include": "${{ fromJson(needs.stacks.outputs.matrix) }}"}
    assert "gpufleet check" in runs and "--summary-out" in runs and "--no-lock" in runs
    comment = " ".join(s.get("run", "") for s in workflow["jobs"]["comment"]["steps"])
    assert "gpufleet ci comment" in comment and "--expected" in comment


def test_plan_jobs_check_against_the_pull_requests_base_commit() -> None:
    """`gpufleet check` fails closed without a base (issue 22), and a PR checkout has no main branch:
    the job names the base commit and fetches the history that holds it."""
    plan = load("plan.yml")["jobs"]["plan"]["steps"]
    (check,) = [s for s in plan if s.get("run") == "gpufleet check"]
    assert check["env"] == {"GPUFLEET_BASE_REF": "${{ github.event.pull_request.base.sha }}"}
    (checkout,) = [s for s in plan if s.get("uses", "").startswith("actions/checkout@")]
    assert checkout["with"]["fetch-depth"] == 0


def test_drift_is_scheduled_and_plans_with_detailed_exitcode() -> None:
    workflow = load("drift.yml")
    assert workflow["on"]["schedule"] and "pull_request" not in workflow["on"]
    runs = " ".join(s.get("run", "") for s in workflow["jobs"]["drift"]["steps"])
    assert "-detailed-exitcode" in runs and "-lock=false" in runs


WRITTEN = re.compile(r"(?:--(?:json-out|out|summary-out|preview)|>)\s+\"?([^\s\"]+)")


def written_paths(workflow: dict[str, Any]) -> list[str]:
    """Paths steps write or read as files of their own: artifacts uploaded or downloaded, and the
    output (or preview report) options and redirections of run blocks."""
    found = []
    for step in steps(workflow):
        if str(step.get("uses", "")).startswith(("actions/upload-artifact", "actions/download-artifact")):
            found += [line.strip() for line in str((step.get("with") or {}).get("path", "")).splitlines() if line.strip()]
        found += WRITTEN.findall(step.get("run", ""))
    return found


@pytest.mark.parametrize("name", ["plan.yml", "drift.yml"])
def test_no_step_writes_into_a_package_of_the_repository(name: str) -> None:
    """A report written or downloaded into a package directory mixes with its source: preview/ is
    the preview package, so the preview artifact once landed beside preview/diff.py."""
    from tests.test_layers import layers

    packages = {*layers(), "tests", "bench", "tools", "docs", ".github"}
    paths = written_paths(load(name))
    assert paths and [p for p in paths if p.split("/", 1)[0] in packages] == []


@pytest.mark.parametrize("name", ["plan.yml", "drift.yml"])
def test_terraform_is_pinned_to_the_repo_version(name: str) -> None:
    assert load(name)["env"]["TERRAFORM_VERSION"] == "1.11.4"


def test_drift_reports_a_refused_protected_destroy_as_blocked_not_as_an_error() -> None:
    runs = " ".join(s.get("run", "") for s in load("drift.yml")["jobs"]["drift"]["steps"])
    assert 'if [ "$rc" -eq 1 ]' in runs and 'gpufleet plan "$STACK" --no-lock --summary-out' in runs


def _zizmor() -> str:
    found = shutil.which("zizmor", path=str(Path(sys.executable).parent)) or shutil.which("zizmor")
    if found is None:
        pytest.fail("zizmor is not installed; it is pinned in pyproject's dev extras: run make install")
    return found


def test_zizmor_offline_finds_nothing_in_the_workflows() -> None:
    """The outside audit, offline: a proxy that refuses every connection proves no network is used."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GH_", "GITHUB_", "ZIZMOR_"))}
    env |= {"HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9", "NO_COLOR": "1"}
    done = subprocess.run([_zizmor(), "--offline", "--no-config", "--format", "json", str(WORKFLOWS)],
                          capture_output=True, text=True, env=env, timeout=120, check=False)
    findings = json.loads(done.stdout or "[]")
    assert findings == [], [(f["ident"], f["locations"][0]["symbolic"]["key"]) for f in findings]
    assert done.returncode == 0, done.stderr[-500:]


# Resolved from the actions' own repositories (git tags in a mirror of each), not typed in.
PINS = {
    "actions/checkout": ("11d5960a326750d5838078e36cf38b85af677262", "v4.4.0"),
    "actions/setup-python": ("a26af69be951a213d495a4c3e4e4022e16d87065", "v5.6.0"),
    "actions/setup-node": ("49933ea5288caeca8642d1e84afbd3f7d6820020", "v4.4.0"),
    "hashicorp/setup-terraform": ("b9cd54a3c349d3f38e8881555d616ced269862dd", "v3.1.2"),
    "actions/upload-artifact": ("ea165f8d65b6e75b540449e92b4886f43607fa02", "v4.6.2"),
    "actions/download-artifact": ("d3f86a106a0bac45b974a628896c90dbdf5c8093", "v4.3.0"),
    "google-github-actions/auth": ("c200f3691d83b41bf9bbd8638997a462592937ed", "v2.1.13"),
    "actions/github-script": ("f28e40c7f34bde8b3046d885e986cb6290c5673b", "v7.1.0"),
    "google-github-actions/setup-gcloud": ("e427ad8a34f8676edf47cf7d7925499adf3eb74f", "v2.2.1"),
}
USES = re.compile(r"^\s*-?\s*uses:\s*(?P<action>[^@\s]+)@(?P<ref>\S+)(?:\s+#\s*(?P<tag>\S+))?\s*$")


@pytest.mark.parametrize("name", ["plan.yml", "drift.yml"])
def test_every_action_is_pinned_to_a_commit_with_its_tag_in_a_comment(name: str) -> None:
    uses = [m for line in (WORKFLOWS / name).read_text().splitlines() if (m := USES.match(line))]
    assert uses, f"{name}: no uses: lines found"
    for m in uses:
        assert PINS.get(m["action"]) == (m["ref"], m["tag"]), f"{name}: {m.group(0).strip()} is not pinned to {PINS.get(m['action'])}"


@pytest.mark.parametrize("name", ["plan.yml", "drift.yml"])
def test_no_expression_in_run_blocks_and_checkouts_keep_no_credentials(name: str) -> None:
    for step in steps(load(name)):
        assert "${{" not in step.get("run", ""), f"{name}: {step.get('name')}: pass values through env:, not ${{{{ }}}} in run:"
        if step.get("uses", "").startswith("actions/checkout@"):
            assert step.get("with", {}).get("persist-credentials") is False, f"{name}: checkout must set persist-credentials: false"


@pytest.mark.parametrize(("name", "job"), [("plan.yml", "plan"), ("drift.yml", "drift")])
def test_plans_can_authenticate_to_gke_scheduler_stacks(name: str, job: str) -> None:
    """The GKE scheduler stacks' kubernetes provider execs gke-gcloud-auth-plugin (over the DNS endpoint, no IP allow-list)."""
    steps = load(name)["jobs"][job]["steps"]
    setup = [i for i, s in enumerate(steps) if str(s.get("uses", "")).startswith("google-github-actions/setup-gcloud")]
    assert setup and steps[setup[0]]["with"]["install_components"] == "gke-gcloud-auth-plugin"
    auth = next(i for i, s in enumerate(steps) if str(s.get("uses", "")).startswith("google-github-actions/auth"))
    plans = [i for i, s in enumerate(steps) if "plan" in s.get("run", "")]
    assert auth < setup[0] < min(plans)
