"""No data loss: gpufleet replaces only directories it made, and acts on the repository it runs in.

Every case runs in a copy of the repository (with a stand-in ``.git``) so a regression can only
destroy the copy; each hashes the tree before and after.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.cli import main
from clusters.outputs import MARKER
from tests.conftest import REPO_ROOT

GPUFLEET = Path(sys.executable).with_name("gpufleet")
COPIED = ("cdktf.json", ".checkov-skips.yaml", "README.md", "clusters", "jobs", "vault_policies")


def copy_repo(dest: Path) -> Path:
    """The files a user edits, plus a stand-in .git; code stays in the installed package."""
    dest.mkdir(parents=True)
    for name in COPIED:
        src = REPO_ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.py", "out", "tasks"))
        else:
            shutil.copy(src, dest / name)
    (dest / ".git").mkdir()
    (dest / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    return dest


def tree_hash(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        digest.update(str(path.relative_to(root)).encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


@pytest.fixture
def repo_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    repo = copy_repo(tmp_path / "parent" / "checkout")
    (tmp_path / "parent" / "notes.txt").write_text("the user's own file beside the checkout\n")
    monkeypatch.chdir(repo)
    return repo


def refused(args: list[str], root: Path, capsys: pytest.CaptureFixture[str], *needles: str) -> str:
    before = tree_hash(root)
    assert main(args) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err + captured.out
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert tree_hash(root) == before, f"{args} changed files under {root}"
    return lines[0]


@pytest.mark.parametrize("command", [["synth"], ["check", "--skip-checkov"]])
@pytest.mark.parametrize(("target", "needle"), [
    (".", "repository root"),
    ("..", "repository root"),
    ("clusters", "is clusters/"),
    ("jobs", "is jobs/"),
    ("vault_policies", "is vault_policies/"),
    ("clusters/out", "inside clusters/"),
    (".git", "is .git/"),
])
def test_refuses_to_replace_the_repo_its_parents_or_source_dirs(repo_copy: Path, capsys, command, target, needle) -> None:
    line = refused([*command, "--out", target], repo_copy.parent, capsys, needle, f"--out {target}")
    assert "remove it yourself" in line


def test_refuses_a_foreign_non_empty_directory_and_a_file(repo_copy: Path, tmp_path: Path, capsys) -> None:
    foreign = tmp_path / "photos"
    foreign.mkdir()
    (foreign / "cat.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    refused(["synth", "--out", str(foreign)], tmp_path, capsys, "no .gpufleet-output marker", "remove it yourself")
    refused(["jobs", "render", "--out-dir", str(foreign)], tmp_path, capsys, "--out-dir", "no .gpufleet-output marker")
    refused(["synth", "--out", "README.md"], tmp_path, capsys, "is a file, not a directory")


def test_a_tree_of_empty_directories_is_not_foreign_but_a_file_deep_inside_is(repo_copy: Path, capsys) -> None:
    from clusters.outputs import claim_dir

    (repo_copy / "old-out" / "stacks" / "a").mkdir(parents=True)
    assert claim_dir(Path("old-out")) == repo_copy / "old-out"
    (repo_copy / "old-out" / "stacks" / "a" / "notes.txt").write_text("mine")
    refused(["synth", "--out", "old-out"], repo_copy, capsys, "no .gpufleet-output marker")


def test_refuses_writing_single_files_over_foreign_ones(repo_copy: Path, tmp_path: Path, capsys) -> None:
    summaries = tmp_path / "summaries"
    summaries.mkdir()
    refused(["ci", "comment", str(summaries), "--out", "README.md"], tmp_path, capsys, "gpufleet did not write it")
    refused(["ci", "comment", str(summaries), "--out", "clusters/x.md"], tmp_path, capsys, "inside clusters/")
    refused(["ci", "comment", str(summaries), "--out", "clusters"], tmp_path, capsys, "is a directory")
    plan = tmp_path / "plan.json"
    plan.write_text('{"format_version": "1.2", "resource_changes": []}')
    refused(["gate", str(plan), "--summary-out", "README.md"], tmp_path, capsys, "--summary-out", "gpufleet did not write it")
    refused(["gate", str(plan), "--summary-out", "vault_policies/roles.yaml"], tmp_path, capsys, "inside vault_policies/")


def test_rewrites_its_own_single_file_outputs(repo_copy: Path, tmp_path: Path) -> None:
    summaries = tmp_path / "summaries"
    summaries.mkdir()
    comment = tmp_path / "comment.md"
    assert main(["ci", "comment", str(summaries), "--out", str(comment)]) == 0
    assert main(["ci", "comment", str(summaries), "--out", str(comment)]) == 0, "its own comment file may be rewritten"
    plan = tmp_path / "plan.json"
    plan.write_text('{"format_version": "1.2", "resource_changes": []}')
    summary = tmp_path / "s.json"
    assert main(["gate", str(plan), "--summary-out", str(summary)]) == 0
    assert main(["gate", str(plan), "--summary-out", str(summary)]) == 0


def test_jobs_render_marks_its_directory_and_rerenders(repo_copy: Path) -> None:
    assert main(["jobs", "render"]) == 0
    out = repo_copy / "jobs" / "out"
    assert (out / MARKER).is_file() and (out / "finetune-llama.json").is_file()
    assert main(["jobs", "render"]) == 0


def test_synth_marks_and_replaces_only_its_own_directory(repo_copy: Path, capsys) -> None:
    """One real synthesis (a single small stack) into a new directory, then a second one over it."""
    out = repo_copy / "cdktf.out"
    assert main(["synth", "dev-gke", "--out", "cdktf.out"]) == 0
    assert (out / MARKER).is_file() and (out / "stacks" / "dev-gke" / "cdk.tf.json").is_file()
    (out / "stacks" / "stale").mkdir()
    assert main(["synth", "dev-gke", "--out", "cdktf.out"]) == 0
    assert (out / MARKER).is_file()
    assert not [p for p in repo_copy.iterdir() if p.name.startswith(".cdktf.out.")], "no temp dirs left behind"


def test_not_inside_a_repository_is_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    refused(["clusters"], tmp_path, capsys, "not inside a gpufleet repository", "--repo")
    refused(["--repo", str(tmp_path), "clusters"], tmp_path, capsys, "not a gpufleet repository")


def test_a_second_checkout_reads_its_own_files_with_the_first_ones_venv(tmp_path: Path) -> None:
    """A worktree using this checkout's venv: the installed package sits in REPO_ROOT, the files in the copy."""
    copy = copy_repo(tmp_path / "worktree")
    (copy / "clusters" / "dev-gke.yaml").write_text(
        (copy / "clusters" / "dev-gke.yaml").read_text().replace("name: dev-gke", "name: dev-gke-copy", 1))
    (copy / "clusters" / "dev-gke.yaml").rename(copy / "clusters" / "dev-gke-copy.yaml")
    env = {**os.environ, "COLUMNS": "250"}
    done = subprocess.run([str(GPUFLEET), "stacks", "--json"], cwd=copy / "clusters", env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert '"dev-gke-copy"' in done.stdout and '"dev-gke"' not in done.stdout
    (copy / "clusters" / "prod-gke.yaml").write_text("name: [broken\n")
    done = subprocess.run([str(GPUFLEET), "clusters"], cwd=copy, env=env, capture_output=True, text=True, timeout=120)
    # Only the copy's prod-gke.yaml is broken, so this error (named relative to the copy's root) is the copy's file.
    assert done.returncode == 2 and done.stderr.startswith("error: clusters/prod-gke.yaml:2: invalid YAML"), done.stderr
    done = subprocess.run([str(GPUFLEET), "--repo", str(REPO_ROOT), "stacks", "--json"], cwd=copy, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and '"dev-gke"' in done.stdout, done.stderr


def test_tables_keep_whole_names_at_80_columns() -> None:
    env = {**os.environ, "COLUMNS": "80"}
    done = subprocess.run([str(GPUFLEET), "clusters"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "…" not in done.stdout and max(len(line) for line in done.stdout.splitlines()) <= 80
