"""The preview's PR-comment section: on top of the plan comment, naming what is destroyed."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from gpufleet.cli import main
from preview import report
from preview.diff import preview
from preview.forcenew import load_tables
from review import ci_comment

INFO = {"ref": "origin/main", "commit": "0" * 40, "tree": "1" * 40, "cache": "hit"}


def _report(stack_json, allow: tuple[str, ...] = ()) -> dict:
    base = stack_json("prod-gke")
    head = copy.deepcopy(base)
    head["resource"]["google_compute_global_address"]["ip_ingress"]["description"] = "reworded"
    return report.to_json(preview({"prod-gke": base}, {"prod-gke": head}, load_tables(), allow_destroy=allow), INFO)


def test_preview_section_goes_first_and_names_the_protected_resource(stack_json, tmp_path):
    path = tmp_path / "preview.json"
    path.write_text(json.dumps(_report(stack_json)))
    summaries = [{"stack": "prod-gke", "status": "changes", "counts": {}, "outputs_changed": 0, "blocked": [], "changes": []}]
    body = ci_comment.build_comment(summaries, preview=ci_comment.load_preview(path))
    lines = body.splitlines()
    assert lines[0] == ci_comment.MARKER and lines[1] == "## gpufleet plan"
    assert lines[3] == "### gpufleet preview (offline, against `origin/main`)"
    assert lines[5] == ("⛔ **this PR destroys or replaces 1 protected resource(s):** "
                        "`prod-gke/google_compute_global_address.ip_ingress` (replaced)")
    assert body.index("### gpufleet preview") < body.index("**1 stack(s):**")
    assert "`description` training dashboards and TensorBoard ingress → reworded" in body


def test_allowed_destroy_is_shown_as_allowed_not_blocking(stack_json):
    text = report.markdown(_report(stack_json, allow=("prod-gke/google_compute_global_address.ip_ingress",)))
    assert "⚠️ **this PR destroys or replaces 1 protected resource(s):**" in text and "✔️ allowed" in text


def test_missing_or_foreign_preview_report_shows_as_an_error_in_the_comment(tmp_path):
    assert "no preview report" in ci_comment.load_preview(tmp_path / "absent.json")
    (tmp_path / "other.json").write_text(json.dumps({"stack": "x"}))
    assert "is not a gpufleet preview report" in ci_comment.load_preview(tmp_path / "other.json")


def test_ci_comment_cli_takes_the_preview(stack_json, tmp_path: Path):
    summaries = tmp_path / "summaries"
    summaries.mkdir()
    (summaries / "prod-gke.json").write_text(json.dumps(
        {"stack": "prod-gke", "status": "no_changes", "counts": {}, "outputs_changed": 0, "blocked": [], "changes": []}))
    (tmp_path / "preview.json").write_text(json.dumps(_report(stack_json)))
    out = tmp_path / "comment.md"
    assert main(["ci", "comment", str(summaries), "--preview", str(tmp_path / "preview.json"), "--out", str(out)]) == 0
    assert "this PR destroys or replaces 1 protected resource(s)" in out.read_text()
