"""checkov (real, offline) on every synthesized example stack: clean except the reviewed skips.

checkov runs once WITHOUT the skips, so the same run shows both directions of the rule:
a failure that no skip covers fails the test, and so does a skip that matches no failure
(a stale suppression hides the next real finding of that check).
"""

from __future__ import annotations

import pytest

from clusters.errors import ConfigError
from safety.checkov_skips import load_skips
from safety import checkov_scan


@pytest.fixture(scope="module")
def unskipped(fleet_out):
    stacks = sorted((fleet_out / "stacks").iterdir())
    summary = checkov_scan.run(stacks, skip_ids=())
    assert all(s.error is None for s in summary.stacks), [s.error for s in summary.stacks if s.error]
    return summary


def test_every_stack_is_scanned(unskipped, fleet_out):
    assert {s.stack for s in unskipped.stacks} == {p.name for p in (fleet_out / "stacks").iterdir()}
    by_stack = {s.stack: s.passed for s in unskipped.stacks}
    assert by_stack["prod-gke"] > 50 and by_stack["prod-nomad"] > 50 and by_stack["prod-gke-scheduler"] > 0, by_stack


def test_every_failure_is_covered_by_a_reviewed_skip(unskipped):
    skipped = {s.check_id for s in load_skips()}
    uncovered = [f for s in unskipped.stacks for f in s.failures if f.check_id not in skipped]
    assert not uncovered, "\n".join(str(f) for f in uncovered)


def test_every_skip_matches_a_failing_check(unskipped):
    failing = {f.check_id for s in unskipped.stacks for f in s.failures}
    stale = sorted(s.check_id for s in load_skips() if s.check_id not in failing)
    assert not stale, f"skips in .checkov-skips.yaml that match nothing (remove them): {stale}"


@pytest.mark.parametrize(("body", "message"), [
    ("skips:\n  - id: CKV_GCP_65\n    reason: short\n", r"skips\[0\]\.reason: skip CKV_GCP_65 needs a reason of 10\+ characters"),
    ("skips:\n  - id: GCP_65\n    reason: a long enough reason\n", r"skips\[0\]\.id: 'GCP_65' is not a checkov check id"),
    ("skips:\n  - id: CKV_GCP_65\n    reason: a long enough reason\n  - id: CKV_GCP_65\n    reason: a long enough reason\n",
     r"skips\[1\]\.id: CKV_GCP_65 is listed twice"),
    ("skips: CKV_GCP_65\n", r"skips: expected a list of \{id, reason\}"),
])
def test_fails_when_the_skip_file_is_wrong(tmp_path, body, message):
    path = tmp_path / ".checkov-skips.yaml"
    path.write_text(body)
    with pytest.raises(ConfigError, match=message):
        load_skips(path)
