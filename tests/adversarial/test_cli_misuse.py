"""CLI misuse: every command, every path option pointed at a missing file, a file instead of a directory,
the repository root. Each is exit 2 with one line naming the path, no traceback, nothing changed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.cli import main
from tests.adversarial.conftest import RESULTS, tree_hash
from tests.clusters.test_outputs import copy_repo

MISUSE = [
    (["clusters", "--clusters-dir", "nope"], "nope: directory not found"),
    (["clusters", "--clusters-dir", "README.md"], "README.md: is a file, not a directory"),
    (["stacks", "--clusters-dir", "nope"], "nope: directory not found"),
    (["synth", "--clusters-dir", "nope", "--out", "{tmp}/o"], "nope: directory not found"),
    (["synth", "--out", "README.md"], "is a file, not a directory"),
    (["synth", "--out", "."], "repository root"),
    (["check", "--state", "nope.json", "--out", "{tmp}/o"], "--state nope.json: file not found"),
    (["check", "--out", "clusters"], "is clusters/"),
    (["check", "--clusters-dir", "README.md", "--out", "{tmp}/o"], "is a file, not a directory"),
    (["scan", "missing/"], "missing: not found"),
    (["scan", "--state", "nope.json"], "--state nope.json: file not found"),
    (["scan"], "nothing to scan"),
    (["gate", "nope.json"], "nope.json"),
    (["gate", "clusters"], "clusters"),
    (["plan", "dev-gke", "--out-dir", "nope"], "nope"),
    (["ci", "comment", "nope"], "nope: summaries directory not found"),
    (["ci", "comment", "README.md"], "README.md: summaries directory not found"),
    (["ci", "comment", "{tmp}", "--expected", "nope.json"], "--expected nope.json"),
    (["ci", "comment", "{tmp}", "--out", "clusters"], "is a directory"),
    (["import", "generate", "dev-gke", "--ids", "nope.json", "--out", "{tmp}/m.json"], "nope.json: ids file not found"),
    (["import", "generate", "dev-gke", "--ids", "nope.json", "--out", "m.json"], "is inside the repository"),
    (["import", "apply", "dev-gke", "--manifest", "nope.json", "--digest", "0"], "nope.json: manifest not found"),
    (["jobs", "render", "nope"], "no job 'nope'"),
    (["jobs", "render", "--out-dir", "README.md"], "is a file, not a directory"),
    (["jobs", "render", "--out-dir", "."], "repository root"),
    (["jobs", "dispatch", "finetune-llama", "--meta", "run_id=x", "--meta", "dataset_uri=hf://d/x@v1"], "NOMAD_ADDR is not set"),
    (["vault", "diff", "--repo", "nope"], "--repo nope: no vault_policies/ directory"),
    (["--repo", "nope", "clusters"], "--repo nope: directory not found"),
    (["--repo", "README.md", "clusters"], "--repo README.md: is a file, not a directory"),
]


@pytest.fixture
def repo_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    repo = copy_repo(tmp_path / "checkout")
    monkeypatch.chdir(repo)
    for name in ("NOMAD_ADDR", "VAULT_ADDR", "VAULT_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    return repo


@pytest.mark.parametrize(("argv", "needle"), MISUSE, ids=[" ".join(a) for a, _ in MISUSE])
def test_fails_cleanly_on_cli_misuse(repo_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], needle: str) -> None:
    other = tmp_path / "elsewhere"
    other.mkdir()
    argv = [a.replace("{tmp}", str(other)) for a in argv]
    before = tree_hash(tmp_path)
    code = main(argv)
    captured = capsys.readouterr()
    RESULTS.append(("cli", "misuse", "rejected" if code == 2 else f"exit {code}"))
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert code == 2, (code, captured.out[-500:], lines)
    assert len(lines) == 1 and needle in lines[0], lines
    assert "Traceback" not in captured.err + captured.out
    assert tree_hash(tmp_path) == before


@pytest.mark.parametrize(("argv", "needle"), [
    (["synth", "--out", ".."], "repository root"),
    (["scan", "missing/"], "missing: not found"),
    (["clusters", "--clusters-dir", "nope"], "directory not found"),
])
def test_real_exit_codes_from_a_subprocess(repo_copy: Path, tmp_path: Path, argv: list[str], needle: str) -> None:
    before = tree_hash(tmp_path)
    gpufleet = Path(sys.executable).with_name("gpufleet")
    done = subprocess.run([str(gpufleet), *argv], cwd=repo_copy, capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 2 and needle in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert tree_hash(tmp_path) == before
