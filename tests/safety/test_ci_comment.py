"""The PR comment for a mixed set of stack results: marker first, one icon per stack, details folded.

(review.ci_comment's tests live here, beside the terraform-plan fixtures they share with the plan gate.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clusters.errors import UserError
from gpufleet.cli import main
from review import ci_comment
from safety import plan_gate

TD = frozenset({"terraform_data"})


def summary_of(plans: dict[str, Path], variant: str, stack: str) -> dict:
    result = plan_gate.classify(plan_gate.load_plan(plans[variant]), path=plans[variant], protected=TD)
    return plan_gate.summary(stack, result)


@pytest.fixture
def artifacts(plans: dict[str, Path], tmp_path: Path) -> Path:
    """Downloaded artifacts as actions/download-artifact lays them out: one directory per artifact."""
    results = {
        "dev-gke": summary_of(plans, "noop", "dev-gke"),
        "prod-gke": summary_of(plans, "update", "prod-gke"),
        "prod-gke-scheduler": summary_of(plans, "replace", "prod-gke-scheduler"),
        "prod-nomad": plan_gate.error_summary("prod-nomad", "terraform init failed: Failed to query | available provider packages"),
    }
    for stack, data in results.items():
        plan_gate.write_summary(tmp_path / f"plan-{stack}" / f"{stack}.json", data)
    (tmp_path / "plan-junk").mkdir()
    (tmp_path / "plan-junk" / "junk.json").write_text("{not json")
    return tmp_path


def test_mixed_results_read_right(artifacts: Path) -> None:
    summaries = ci_comment.load_summaries(artifacts, expected=("dev-gke", "prod-nomad-scheduler"))
    body = ci_comment.build_comment(summaries)
    lines = body.splitlines()
    assert lines[0] == ci_comment.MARKER
    rows = {line.split("|")[2].strip(): line for line in lines if line.startswith("| ") and "`" in line.split("|")[2]}
    assert rows["`dev-gke`"].startswith("| ✅ |") and "no changes" in rows["`dev-gke`"]
    assert rows["`prod-gke`"].startswith("| 🔄 |") and "| changes | 0 | 1 | 0 | 0 | 0 | 0 |" in rows["`prod-gke`"]
    assert rows["`prod-gke-scheduler`"].startswith("| ⛔ |") and "destroy blocked: `terraform_data.pool`" in rows["`prod-gke-scheduler`"]
    assert rows["`prod-nomad`"].startswith("| ❌ |") and "Failed to query \\| available" in rows["`prod-nomad`"]
    assert rows["`prod-nomad-scheduler`"].startswith("| ❌ |") and "no summary: the job failed before the plan gate ran" in rows["`prod-nomad-scheduler`"]
    assert rows["`junk`"].startswith("| ❌ |") and "unreadable summary junk.json" in rows["`junk`"]
    assert "**6 stack(s):** ✅ 1 no changes, 🔄 1 changes, ⛔ 1 destroy blocked, ❌ 3 error" in body
    assert "<details><summary>prod-gke-scheduler: 1 resource change(s)</summary>" in body
    assert "| replace | `terraform_data.pool` | ⛔ blocked |" in body
    assert "<details><summary>dev-gke" not in body
    assert "--allow-destroy <stack>/<address>" in body and "it never applies" in body


def test_comment_is_deterministic(artifacts: Path) -> None:
    first = ci_comment.build_comment(ci_comment.load_summaries(artifacts))
    assert first == ci_comment.build_comment(ci_comment.load_summaries(artifacts))


def test_oversized_details_are_dropped_but_every_stack_stays(artifacts: Path) -> None:
    summaries = {s["stack"]: s for s in ci_comment.load_summaries(artifacts)}
    summaries["prod-gke"] = dict(summaries["prod-gke"], changes=[{"address": f"terraform_data.x{i:05d}", "action": "create"} for i in range(3000)])
    body = ci_comment.build_comment(list(summaries.values()))
    assert len(body) < ci_comment.MAX_BODY_CHARS and "plan artifacts" in body and "`prod-gke`" in body and "<details>" not in body


def test_cli_writes_the_comment(artifacts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    expected = tmp_path / "stacks.json"
    expected.write_text(json.dumps([{"stack": "dev-gke", "cluster": "dev-gke", "kind": "infra", "depends_on": []}]))
    assert main(["ci", "comment", str(artifacts), "--expected", str(expected)]) == 0
    assert capsys.readouterr().out.startswith(ci_comment.MARKER + "\n## gpufleet plan")


def test_fails_when_summary_dir_is_missing(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="summaries directory not found"):
        ci_comment.load_summaries(tmp_path / "nope")


def test_fails_when_expected_file_is_not_a_stack_list(artifacts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    expected = tmp_path / "stacks.json"
    expected.write_text(json.dumps({"stack": "dev-gke"}))
    assert main(["ci", "comment", str(artifacts), "--expected", str(expected)]) == 2
    assert "expected a JSON list of stack names" in capsys.readouterr().err
