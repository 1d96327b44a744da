"""checkov (real, offline) is clean on every synthesized example stack, with only the reviewed skips."""

from __future__ import annotations

from gpufleet.safety import checkov_scan


def test_checkov_is_clean_on_every_example_stack(fleet_out):
    stacks = sorted((fleet_out / "stacks").iterdir())
    assert {"dev-gke-scheduler", "prod-gke-scheduler", "prod-nomad", "prod-nomad-scheduler"} <= {s.name for s in stacks}
    summary = checkov_scan.run(stacks)
    assert all(s.error is None for s in summary.stacks), [s.error for s in summary.stacks if s.error]
    assert summary.ok, "\n".join(summary.failure_lines)
    by_stack = {s.stack: s.passed for s in summary.stacks}
    assert by_stack["prod-nomad"] > 50 and by_stack["prod-gke-scheduler"] > 0, by_stack
