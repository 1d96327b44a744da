"""`gpufleet check` names what a removed cluster file or a renamed protected pool destroys (against git)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import clusters
from clusters.errors import UserError
from safety import destroys
from review.checks import CheckReport, _destroys
from tests.clusters.test_outputs import copy_repo

GIT = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t", "-c", "init.defaultBranch=main"]


def git(repo: Path, *args: str) -> str:
    return subprocess.run([*GIT, *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def git_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh clone of main: one commit, ``origin/main`` at HEAD, a clean tree."""
    origin = copy_repo(tmp_path / "origin")
    (origin / ".git" / "HEAD").unlink()
    (origin / ".git").rmdir()
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "base"]):
        git(origin, *args)
    repo = tmp_path / "checkout"
    git(tmp_path, "clone", "-q", str(origin), str(repo))
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
    git(git_repo, "commit", "-qam", "unprotect l4")
    git(git_repo, "update-ref", "refs/remotes/origin/main", "HEAD")  # reviewed and merged: origin/main has it
    path.write_text(path.read_text().replace("name: l4\n", "name: l4-spot\n").replace("l4: 6", "l4-spot: 6").replace("l4: 4", "l4-spot: 4"))
    assert [d.blocking for d in _announce(git_repo)] == [False]


def test_skipped_outside_a_git_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = copy_repo(tmp_path / "plain")
    monkeypatch.chdir(repo)
    report = CheckReport()
    _destroys(report, clusters.load_all(repo / "clusters"))
    assert report.ok and report.rows == [("destroys", True, "skipped: not a git checkout")]


def _rename_a100(repo: Path) -> None:
    path = repo / "clusters" / "prod-nomad.yaml"
    path.write_text(path.read_text().replace("name: a100", "name: a100-pool").replace("a100: 8", "a100-pool: 8").replace("a100: 4", "a100-pool: 4"))


def _committed_rename_on(repo: Path, branch: str | None) -> str:
    """Commit the rename of prod-nomad's protected a100 pool on a new ``branch`` (None: the current one); HEAD's sha."""
    if branch is not None:
        git(repo, "checkout", "-qb", branch)
    _rename_a100(repo)
    git(repo, "commit", "-qam", "rename the a100 pool")
    return git(repo, "rev-parse", "HEAD")


def _refused(repo: Path, label: str, head: str) -> None:
    """Both the simple form and check's step refuse, naming the ref and HEAD's sha."""
    expected = (f"{label} resolves to HEAD ({head[:12]}) in {repo}: committed changes would not be compared; name the base "
                f"you branched from with --base or GPUFLEET_BASE_REF, or spell it HEAD to compare uncommitted changes only")
    with pytest.raises(UserError) as caught:
        _announce(repo)
    assert str(caught.value) == expected
    report = CheckReport()
    _destroys(report, clusters.load_all(repo / "clusters"))
    assert report.rows == [("destroys", False, "no base to compare with")] and report.details == [f"destroy: {expected}"]


def test_fails_when_committing_on_main_without_origin(git_repo: Path) -> None:
    """Issue 22 red team: local ``main`` with no origin was the base, i.e. HEAD, and a committed rename read as no change."""
    git(git_repo, "remote", "remove", "origin")
    head = _committed_rename_on(git_repo, None)
    _refused(git_repo, "main", head)


@pytest.mark.parametrize("named", ["v1", "HEAD~0", " @ ", "trunk"])
def test_fails_when_the_named_base_is_another_name_for_head(git_repo: Path, monkeypatch: pytest.MonkeyPatch, named: str) -> None:
    """A tag at HEAD, ``HEAD~0``, ``@``, the current branch: each resolved to HEAD and passed a committed rename."""
    head = _committed_rename_on(git_repo, "trunk")
    git(git_repo, "tag", "v1")
    monkeypatch.setenv(destroys.BASE_ENV, named)
    _refused(git_repo, f"GPUFLEET_BASE_REF={named.strip()}", head)


def test_fails_when_main_was_force_moved_to_head(git_repo: Path) -> None:
    git(git_repo, "remote", "remove", "origin")
    head = _committed_rename_on(git_repo, "trunk")
    git(git_repo, "branch", "-f", "main", "HEAD")
    _refused(git_repo, "main", head)


def test_refusal_names_the_branchs_upstream_when_it_differs(git_repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``@{upstream}`` is a hint in the refusal, never a base by itself: a pushed branch is not a reviewed one."""
    git(git_repo, "checkout", "-q", "-b", "trunk", "--track", "origin/main")
    _committed_rename_on(git_repo, None)
    upstream = git(git_repo, "rev-parse", "origin/main")
    monkeypatch.setenv(destroys.BASE_ENV, "trunk")
    with pytest.raises(UserError, match=rf"\(this branch's upstream origin/main is at {upstream[:12]}\)"):
        _announce(git_repo)


def test_fresh_clone_compares_uncommitted_changes_and_says_so(git_repo: Path) -> None:
    """A newcomer's fresh clone: origin/main is HEAD, nothing committed is unreviewed; check passes with a visible note."""
    head = git(git_repo, "rev-parse", "HEAD")
    note = f"base origin/main is HEAD ({head[:12]}), already in origin/main: comparing uncommitted changes only"
    base, found = destroys.announce(git_repo, clusters.load_all(git_repo / "clusters"))
    assert base == destroys.Base(head, "origin/main", note) and found == []
    report = CheckReport()
    _destroys(report, clusters.load_all(git_repo / "clusters"))
    assert report.rows == [("destroys", True, f"none vs {head[:12]} ({note})")]
    _rename_a100(git_repo)
    assert [d.blocking for d in _announce(git_repo)] == [True]


def test_base_spelled_head_compares_uncommitted_changes_only(git_repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    git(git_repo, "remote", "remove", "origin")
    head = _committed_rename_on(git_repo, None)
    monkeypatch.setenv(destroys.BASE_ENV, "HEAD")
    base, found = destroys.announce(git_repo, clusters.load_all(git_repo / "clusters"))
    assert base is not None and base.note == (f"base is HEAD ({head[:12]}, GPUFLEET_BASE_REF=HEAD): comparing uncommitted "
                                              "changes only") and found == []


def test_commits_on_main_of_a_clone_are_compared_with_origin_main(git_repo: Path) -> None:
    _committed_rename_on(git_repo, None)
    (found,) = _announce(git_repo)
    assert found.blocking and "pool 'a100' (a2-highgpu-2g) is gone since" in found.line


def test_pull_request_merge_commit_against_the_base_sha_is_compared(git_repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """plan.yml: the checkout is the PR's merge commit and GPUFLEET_BASE_REF is the PR base sha."""
    base_sha = git(git_repo, "rev-parse", "HEAD")
    _committed_rename_on(git_repo, "pr")
    git(git_repo, "checkout", "-q", "--detach", base_sha)
    git(git_repo, "merge", "-q", "--no-ff", "-m", "merge pr", "pr")
    monkeypatch.setenv(destroys.BASE_ENV, base_sha)
    (found,) = _announce(git_repo)
    assert found.blocking and f"is gone since {base_sha[:12]}" in found.line


@pytest.mark.parametrize("text", ["name: odd\nkey: # c\n  value\n\n", "name: odd\nd: 2026-13-45\n", "name: odd\nflag: !!bool maybe\n",
                                  "name: odd\na: " + "[" * 400 + "]" * 400 + "\n"],
                         ids=["comment overlap", "bad timestamp", "bool tag", "deep nesting"])
def test_a_base_file_ruamel_cannot_read_protected_nothing(git_repo: Path, text: str) -> None:
    """The base's cluster files are read like the working tree's (clusters.source.parse_yaml): ruamel.yaml
    0.19.1's NotImplementedError, ValueError, KeyError or RecursionError for a file at the base was a traceback
    from `gpufleet check`; a file gpufleet could not read then was never applied, so it protected nothing."""
    odd = git_repo / "clusters" / "odd.yaml"
    odd.write_text(text)
    git(git_repo, "add", "-A")
    git(git_repo, "commit", "-qm", "an unreadable file")
    git(git_repo, "update-ref", "refs/remotes/origin/main", "HEAD")
    odd.unlink()
    assert _announce(git_repo) == []
