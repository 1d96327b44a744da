"""checkov (real, offline) over stack directories in parallel: failures attributed per stack, skips honoured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clusters.errors import UserError
from gpufleet.safety import checkov_scan

OPEN_SSH = {
    "resource": {
        "google_compute_firewall": {
            "ssh": {"name": "ssh", "network": "default", "allow": [{"protocol": "tcp", "ports": ["22"]}], "source_ranges": ["0.0.0.0/0"]}
        }
    }
}


@pytest.fixture(scope="module")
def stacks(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("stacks")
    dirs = []
    for name, body in (("open-ssh", OPEN_SSH), ("quiet", {"resource": {"terraform_data": {"x": {"input": "y"}}}})):
        (root / name).mkdir()
        (root / name / "cdk.tf.json").write_text(json.dumps(body, indent=2))
        dirs.append(root / name)
    return dirs


@pytest.fixture(scope="module")
def unskipped(stacks: list[Path]) -> checkov_scan.CheckovSummary:
    """Two workers for two stacks: each stack in its own process, results merged into one summary."""
    return checkov_scan.run(stacks, skip_ids=(), workers=2)


def test_failures_are_attributed_to_their_stack(unskipped: checkov_scan.CheckovSummary) -> None:
    by_stack = {s.stack: s for s in unskipped.stacks}
    assert not unskipped.ok
    assert "CKV_GCP_2" in {f.check_id for f in by_stack["open-ssh"].failures}
    assert by_stack["quiet"].failures == () and by_stack["quiet"].error is None
    assert any(line.startswith("checkov: open-ssh: CKV_GCP_2 ") and "google_compute_firewall.ssh" in line for line in unskipped.failure_lines)
    assert unskipped.summary_line.startswith("2 stack(s): ")
    assert by_stack["open-ssh"].passed > 0


def test_reviewed_skips_are_passed_to_checkov(stacks: list[Path], unskipped: checkov_scan.CheckovSummary) -> None:
    failing = sorted({f.check_id for s in unskipped.stacks for f in s.failures})
    result = checkov_scan.run(stacks, skip_ids=failing, workers=1)
    assert result.ok, result.failure_lines
    assert result.summary_line.endswith(f"{len(failing)} check(s) skipped by .checkov-skips.yaml")


def test_unparseable_stack_is_an_error_not_a_pass(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "cdk.tf.json").write_text("{ not json")
    (result,) = checkov_scan.scan_group((broken,), (), checkov_scan.checkov_binary())
    assert result.error == "checkov could not parse cdk.tf.json; a stack it cannot read is not a pass"
    summary = checkov_scan.CheckovSummary((result,), ())
    assert not summary.ok and summary.failure_lines == [f"checkov: broken: error: {result.error}"]


def test_fails_when_checkov_is_missing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(checkov_scan.sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(UserError, match="checkov not found"):
        checkov_scan.checkov_binary()


def test_small_fleets_use_one_process_and_large_ones_spread_over_cores() -> None:
    assert checkov_scan.default_workers(6) == 1
    assert checkov_scan.default_workers(40) == min(checkov_scan.os.cpu_count() or 1, 5)
