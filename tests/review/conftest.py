"""A throwaway checkout for running ``gpufleet check`` the way a user does, on the suite's fixture fleet."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import FLEET_CLUSTERS, copy_checkout


@pytest.fixture(scope="session")
def _pristine_checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tracked files of this checkout, with clusters/ holding the suite's fixture fleet (never the user's files)."""
    dest = copy_checkout(tmp_path_factory.mktemp("checkout") / "gpufleet")
    for path in (dest / "clusters").glob("*.yaml"):
        path.unlink()
    for path in FLEET_CLUSTERS.glob("*.yaml"):
        shutil.copy2(path, dest / "clusters" / path.name)
    return dest


@pytest.fixture
def checkout(_pristine_checkout: Path, tmp_path: Path) -> Path:
    """A fresh copy per test, so a planted mistake never leaks into the next test."""
    dest = tmp_path / "gpufleet"
    shutil.copytree(_pristine_checkout, dest, symlinks=True)
    return dest


@pytest.fixture
def gpufleet_check() -> Callable[..., subprocess.CompletedProcess[str]]:
    """``gpufleet_check(repo, *args)``: the CLI in a subprocess, from the checkout's root, as a user types it."""

    def run(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "GPUFLEET_"))} | {"COLUMNS": "200"}
        return subprocess.run([sys.executable, "-m", "gpufleet.cli", "check", *args], cwd=repo, env=env, capture_output=True,
                              text=True, timeout=600)

    return run


def edit(path: Path, old: str, new: str) -> None:
    """Replace ``old`` (which must be there once) by ``new``, the way a user edits the file."""
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} is in {path} {text.count(old)} times"
    path.write_text(text.replace(old, new))


def error_lines(done: subprocess.CompletedProcess[str]) -> list[str]:
    """The ``error:`` lines of a run that must have failed cleanly: exit 2 and no traceback."""
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    return [line for line in done.stderr.splitlines() if line.startswith("error:")]
