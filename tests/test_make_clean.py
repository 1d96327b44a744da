"""`make clean` removes what gpufleet generated but never the Terraform state of a
``state.backend: local`` cluster, which stacks/backends.py keeps in .gpufleet/state/."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from stacks.backends import local_state_path
from tests.conftest import REPO_ROOT


def test_make_clean_keeps_local_terraform_state(tmp_path: Path) -> None:
    shutil.copy(REPO_ROOT / "Makefile", tmp_path / "Makefile")
    stack_dir = tmp_path / "cdktf.out" / "stacks" / "dev-gke"
    stack_dir.mkdir(parents=True)
    state = (stack_dir / local_state_path("dev-gke")).resolve()
    state.parent.mkdir(parents=True)
    state.write_text("{}")
    for generated in (".gpufleet/experiments.db", ".gpufleet/dev/bao.log", ".gpufleet/runs/r/out.log", "jobs/out/x.json"):
        (tmp_path / generated).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / generated).write_text("x")
    subprocess.run(["make", "-s", "clean"], cwd=tmp_path, check=True, capture_output=True, timeout=60)
    assert state.read_text() == "{}" and state.is_relative_to(tmp_path / ".gpufleet" / "state")
    assert sorted(p.name for p in (tmp_path / ".gpufleet").iterdir()) == ["state"]
    assert not (tmp_path / "cdktf.out").exists() and not (tmp_path / "jobs" / "out").exists()
    subprocess.run(["make", "-s", "clean"], cwd=tmp_path, check=True, capture_output=True, timeout=60)  # twice: nothing left to fail on
