"""Upgrading gpufleet never surprises a live fleet (issue 23): ``tools/preview_last_release.sh``, the step
plan.yml's preview job runs, compares the working tree with the newest ``v*`` tag and fails on an
unmigrated protected rename; the same change with its ``moved`` block passes.

A throwaway git repository of this checkout: tag v1.0.0 is "the last release", then a commit changes
what gpufleet generates (the Nomad agent secrets' construct address, protected with prevent_destroy),
as an upgrade would. Real syntheses of both sides (the head's code in its own process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import copy_checkout
from tests.preview.test_preview_git import git
from tests.safety.test_workflows import load

SECRETS = Path("constructs_lib/nomad_secrets.py")
OLD = '            ), f"nomad_secret_{key}")\n'
NEW = '            ), f"nomad_agent_secret_{key}")\n'
MOVED = NEW + '            self.secrets[spec.name].move_from_id(f"google_secret_manager_secret.nomad_secret_{key}")\n'


@pytest.fixture(scope="module")
def release_repo(tmp_path_factory) -> Path:
    repo = copy_checkout(tmp_path_factory.mktemp("release-repo"))
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "release")
    git(repo, "tag", "v1.0.0")
    git(repo, "commit", "-q", "--allow-empty", "-m", "after the release")
    git(repo, "tag", "v0.9.0")  # an older version tagged later: version order, not tag date, picks the release
    return repo


def preview(repo: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPUFLEET": str(Path(sys.executable).parent / "gpufleet")}
    return subprocess.run(["tools/preview_last_release.sh", "--cache-dir", str(cache)], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=900, check=False)


def test_an_unmigrated_protected_rename_since_the_last_release_fails_and_its_moved_block_passes(release_repo, tmp_path):
    source = (release_repo / SECRETS).read_text()
    assert source.count(OLD) == 1
    (release_repo / SECRETS).write_text(source.replace(OLD, NEW))
    git(release_repo, "commit", "-qam", "rename the agent secrets' address")
    failed = preview(release_repo, tmp_path / "cache")
    assert "previewing against the last release: v1.0.0" in failed.stderr
    assert failed.returncode == 4, failed.stdout + failed.stderr
    assert "nomad_secret_ca_cert" in failed.stdout and "moved" in failed.stdout, "names the address and the migration"

    (release_repo / SECRETS).write_text(source.replace(OLD, MOVED))
    git(release_repo, "commit", "-qam", "ship the migration")
    passed = preview(release_repo, tmp_path / "cache")
    assert passed.returncode == 0, passed.stdout + passed.stderr


def _repo_with_the_script(repo: Path) -> Path:
    """A new git repository holding only tools/preview_last_release.sh, staged, on branch main."""
    (repo / "tools").mkdir(parents=True)
    script = Path(__file__).resolve().parents[2] / "tools" / "preview_last_release.sh"
    (repo / "tools" / script.name).write_text(script.read_text())
    (repo / "tools" / script.name).chmod(0o755)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    return repo


def test_fails_with_one_line_when_there_is_no_release_to_compare_with(tmp_path):
    repo = _repo_with_the_script(tmp_path / "bare")
    git(repo, "commit", "-qm", "x")
    result = subprocess.run(["tools/preview_last_release.sh"], cwd=repo, capture_output=True, text=True, check=False,
                            env={**os.environ, "GPUFLEET": "false"})
    assert result.returncode == 2 and result.stderr.startswith("error: no release tag v* and no origin/main")


def test_the_preview_job_runs_the_release_preview_and_fails_on_it():
    steps = load("plan.yml")["jobs"]["preview"]["steps"]
    (step,) = [s for s in steps if s.get("run") == "tools/preview_last_release.sh"]
    assert "continue-on-error" not in step and "if" not in step
    checkout = next(s for s in steps if str(s.get("uses", "")).startswith("actions/checkout"))
    assert checkout["with"]["fetch-depth"] == 0, "all history and tags: the release tag must be there"


def test_the_last_release_is_the_newest_final_version_tag_not_a_release_candidate_or_another_v_tag(tmp_path):
    """git's version sort puts v1.2.0-rc1 above v1.2.0 and any tag starting with v (vault-pin) above both; the
    release an operator runs is v1.2.0."""
    repo = _repo_with_the_script(tmp_path / "tags")
    for tag in ("v1.1.0", "v1.2.0-rc1", "v1.2.0", "vault-pin"):
        git(repo, "commit", "-q", "--allow-empty", "-m", tag)
        git(repo, "tag", tag)
    result = subprocess.run(["tools/preview_last_release.sh"], cwd=repo, capture_output=True, text=True, check=False,
                            env={**os.environ, "GPUFLEET": "true"})
    assert result.returncode == 0 and "previewing against the last release: v1.2.0\n" in result.stderr, result.stderr
