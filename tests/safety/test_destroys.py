"""`gpufleet check` names what a removed cluster file or a renamed protected pool destroys (against git)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import clusters
from safety import destroys
from review.checks import CheckReport, _destroys
from tests.clusters.test_outputs import copy_repo

GIT = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t", "-c", "init.defaultBranch=main"]


@pytest.fixture
def git_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    repo = copy_repo(tmp_path / "checkout")
    (repo / ".git" / "HEAD").unlink()
    (repo / ".git").rmdir()
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "base"]):
        subprocess.run([*GIT, *args], cwd=repo, check=True, capture_output=True)
    monkeypatch.chdir(repo)
    monkeypatch.delenv(destroys.BASE_ENV, raising=False)
    return repo


def _announce(repo: Path) -> list[destroys.Destroy]:
    return destroys.announce(repo, clusters.load_all(repo / "clusters"))[1]


def test_fails_when_a_cluster_file_with_protected_pools_is_removed(git_repo: Path) -> None:
    (git_repo / "clusters" / "prod-gke.yaml").unlink()
    (found,) = _announce(git_repo)
    assert found.blocking
    assert "clusters/prod-gke.yaml: removed since" in found.line and "stacks prod-gke, prod-gke-scheduler leave the CI plan matrix" in found.line
    assert "h100 (a3-highgpu-8g)" in found.line and "set protected: false on those pools in a reviewed commit" in found.line
    report = CheckReport()
    _destroys(report, clusters.load_all(git_repo / "clusters"))
    assert not report.ok and report.details[0].startswith("destroy: clusters/prod-gke.yaml")


def test_fails_when_a_protected_pool_is_renamed(git_repo: Path) -> None:
    path = git_repo / "clusters" / "prod-nomad.yaml"
    path.write_text(path.read_text().replace("name: a100", "name: a100-pool").replace("a100: 8", "a100-pool: 8").replace("a100: 4", "a100-pool: 4"))
    (found,) = _announce(git_repo)
    assert found.blocking and "gpu_pools: pool 'a100' (a2-highgpu-2g) is gone since" in found.line and "restore the name" in found.line


def test_notes_unprotected_removals_without_failing(git_repo: Path) -> None:
    (git_repo / "clusters" / "dev-gke.yaml").unlink()
    (found,) = _announce(git_repo)
    assert not found.blocking and "dev-gke-scheduler" in found.line


def test_renamed_pool_that_was_unprotected_at_the_base_passes(git_repo: Path) -> None:
    path = git_repo / "clusters" / "prod-nomad.yaml"
    path.write_text(path.read_text().replace("    max_nodes: 10\n", "    max_nodes: 10\n    protected: false\n"))
    subprocess.run([*GIT, "commit", "-qam", "unprotect l4"], cwd=git_repo, check=True, capture_output=True)
    path.write_text(path.read_text().replace("name: l4\n", "name: l4-spot\n").replace("l4: 6", "l4-spot: 6").replace("l4: 4", "l4-spot: 4"))
    assert [d.blocking for d in _announce(git_repo)] == [False]


def test_skipped_outside_a_git_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = copy_repo(tmp_path / "plain")
    monkeypatch.chdir(repo)
    report = CheckReport()
    _destroys(report, clusters.load_all(repo / "clusters"))
    assert report.ok and report.rows == [("destroys", True, "skipped: not a git checkout")]
