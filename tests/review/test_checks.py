"""``gpufleet check`` end to end on the example fleet: inputs, synth, secret scan and checkov in one report."""

from __future__ import annotations

import json
import random
import string

from rich.console import Console

from review.checks import run_checks


def test_example_fleet_passes_every_gate(example_configs, tmp_path):
    report = run_checks(example_configs, out=tmp_path / "cdktf.out")
    assert [step for step, _, _ in report.rows] == ["inputs", "expiry", "synth", "secrets", "checkov"]
    assert report.ok, (report.rows, report.details)
    assert "6 job file(s)" in report.rows[0][2]
    assert (tmp_path / "cdktf.out" / "stacks" / "prod-gke" / "cdk.tf.json").exists()


def test_fails_when_a_state_file_holds_a_secret_and_never_prints_it(example_configs, tmp_path):
    token = "gh" + "p_" + "".join(random.Random(7).choices(string.ascii_letters + string.digits, k=36))
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"values": {"root_module": {"resources": [{"values": {"description": f"ci uses {token}"}}]}}}))
    stages: list[str] = []
    report = run_checks(example_configs, out=tmp_path / "cdktf.out", state_files=(state,), checkov=False, on_stage=stages.append)
    assert stages == ["inputs: cluster, job and Vault files", "synth", "secrets scan"]  # what `gpufleet check` shows as progress
    assert not report.ok
    assert ("secrets", False) == report.rows[-1][:2]
    console = Console(record=True, width=200)
    report.print(console)
    text = console.export_text()
    assert "github-token" in text and str(state) in text
    assert token not in text


def test_check_runs_where_the_os_has_no_affinity_mask(example_configs, tmp_path, monkeypatch):
    """``os.sched_getaffinity`` is Linux-only (macOS has none): deciding whether to prestart checkov's worker must
    not crash ``gpufleet check`` there with an AttributeError; it gets to synthesis (stopped here, the gate is the point)."""
    import os

    import pytest

    class Synthesized(Exception):
        pass

    def synthesize(*_args, **_kwargs):
        raise Synthesized

    monkeypatch.delattr(os, "sched_getaffinity")
    monkeypatch.setattr("stacks.synth.synthesize", synthesize)
    with pytest.raises(Synthesized):
        run_checks(example_configs, out=tmp_path / "cdktf.out")
