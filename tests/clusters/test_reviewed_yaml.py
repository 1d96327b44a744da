"""Reviewed YAML is what the reviewer read: aliases bounded (no alias bombs), no symlinks out of the repo.

Every loader (clusters, jobs, Vault roles) reads through ``clusters.source.read_yaml``, so each
refusal is one ``file:line`` line and exit 2 from the CLI, never a traceback or an exhausted host.
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

import clusters
import jobs.loader
from clusters.errors import ConfigError
from vault_policies import roles
from tests.conftest import FLEET_CLUSTERS

REPO = Path(__file__).resolve().parents[2]
# The classic "billion laughs": 9 levels of 9 aliases, under 500 bytes, ~387 million nodes expanded.
BOMB = "name: prod-gke\n" + 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{','.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8))


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))  # 1 GiB: the bomb must not take the host down


def test_fails_fast_on_an_alias_bomb_without_expanding_it(tmp_path: Path) -> None:
    assert len(BOMB.encode()) < 500
    path = tmp_path / "prod-gke.yaml"
    path.write_text(BOMB)
    code = ("import sys, clusters\nfrom clusters.errors import ConfigError\n"
            "try:\n    clusters.load(sys.argv[1])\nexcept ConfigError as e:\n    print(e); sys.exit(2)\n")
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60,
                          preexec_fn=_limit_memory, cwd=REPO, check=False)
    assert done.returncode == 2, done.stderr[-400:]
    assert done.stdout.strip() == (f"{path}:6: YAML aliases expand to more than 10,000 values (an alias bomb, or a file that"
                                   " should be split); write the repeated values out or alias less")


def test_fails_when_aliases_nest_too_deep(tmp_path: Path) -> None:
    chain = "a0: &a0 [x]\n" + "".join(f"a{i}: &a{i} [*a{i - 1}]\n" for i in range(1, 8))
    path = tmp_path / "prod-gke.yaml"
    path.write_text((FLEET_CLUSTERS / "prod-gke.yaml").read_text() + chain)
    with pytest.raises(ConfigError) as err:
        clusters.load(path)
    (problem,) = err.value.problems
    assert "nest more than 5 aliases deep" in problem.message and "\n" not in str(problem)


SPOT_POOL = """  - name: l4-spot
    machine_type: g2-standard-24
    min_nodes: 0
    max_nodes: 8
    spot: true
    labels:
      workload: sweep"""


def test_anchors_and_merge_keys_load_like_the_values_written_out(tmp_path: Path) -> None:
    """Anchors and '<<' merges are ordinary YAML (a newcomer's first pool copy uses them); they load as if written out."""
    text = (FLEET_CLUSTERS / "prod-gke.yaml").read_text()
    assert SPOT_POOL in text
    written_out = text.replace(SPOT_POOL, SPOT_POOL + "\n" + SPOT_POOL.replace("name: l4-spot", "name: l4-spot-b")
                               .replace("workload: sweep", "workload: sweep-b"))
    anchored = text.replace(SPOT_POOL, SPOT_POOL.replace("  - name: l4-spot", "  - &spot\n    name: l4-spot")
                            + "\n  - <<: *spot\n    name: l4-spot-b\n    labels: {workload: sweep-b}")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "prod-gke.yaml").write_text(written_out)
    (tmp_path / "b" / "prod-gke.yaml").write_text(anchored)
    assert clusters.load(tmp_path / "b" / "prod-gke.yaml").gpu_pools == clusters.load(tmp_path / "a" / "prod-gke.yaml").gpu_pools


def test_an_error_inside_a_merged_mapping_names_the_merging_line(tmp_path: Path) -> None:
    text = (FLEET_CLUSTERS / "prod-gke.yaml").read_text()
    anchored = text.replace(SPOT_POOL, SPOT_POOL.replace("  - name: l4-spot", "  - &spot\n    name: l4-spot")
                            + "\n  - <<: *spot\n    name: l4-spot-b\n    spot: maybe")
    path = tmp_path / "prod-gke.yaml"
    path.write_text(anchored)
    with pytest.raises(ConfigError) as err:
        clusters.load(path)
    (problem,) = err.value.problems
    line = anchored.splitlines()[problem.line - 1]
    assert problem.field == "gpu_pools[2].spot" and "spot: maybe" in line


def test_job_files_and_the_roles_file_accept_aliases(tmp_path: Path) -> None:
    job = tmp_path / "finetune-llama.yaml"
    original = (REPO / "jobs" / "finetune-llama.yaml").read_text()
    assert "env:\n  HF_HOME" in original
    job.write_text(original.replace("env:\n  HF_HOME", "env: &e\n  HF_HOME"))
    example = jobs.loader.load(REPO / "jobs" / "finetune-llama.yaml")
    assert jobs.loader.load(job) == dataclasses.replace(example, source=job)


def test_a_dns_wildcard_or_an_ampersand_in_text_is_not_an_anchor(tmp_path: Path) -> None:
    path = tmp_path / "prod-gke.yaml"
    text = (FLEET_CLUSTERS / "prod-gke.yaml").read_text().replace("- name: tensorboard.prod", "- name: '*.prod'")
    path.write_text(text.replace("reason: platform team operates", "reason: platform team (R&D) operates"))
    clusters.load(path)


def _repo_with_link(tmp_path: Path, target: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "clusters").mkdir()
    os.symlink(target, repo / "clusters" / "prod-gke.yaml")
    return repo


def test_fails_when_a_cluster_file_is_a_symlink_out_of_the_repository(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere" / "prod-gke.yaml"
    outside.parent.mkdir()
    marker = "outside-content-never-echoed"
    outside.write_text((FLEET_CLUSTERS / "prod-gke.yaml").read_text().replace("name: prod-gke", f"name: {marker}"))
    repo = _repo_with_link(tmp_path, outside)
    with pytest.raises(ConfigError) as err:
        clusters.load_all(repo / "clusters")
    (problem,) = err.value.problems
    assert str(problem) == (f"{repo / 'clusters' / 'prod-gke.yaml'}: is a symlink to {outside}, outside the repository {repo};"
                            " reviewed files must live in the repository: copy the file in (so the change is reviewed) or delete the link")
    assert marker not in str(err.value)


def test_fails_when_the_clusters_directory_is_a_symlink_out_of_the_repository(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "prod-gke.yaml").write_text((FLEET_CLUSTERS / "prod-gke.yaml").read_text())
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    os.symlink(outside, repo / "clusters")
    with pytest.raises(ConfigError, match=r"is a symlink to .*elsewhere/prod-gke.yaml, outside the repository .*repo;"):
        clusters.load_all(repo / "clusters")


def test_a_symlink_inside_the_repository_is_read(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "shared").mkdir()
    (repo / "shared" / "prod-gke.yaml").write_text((FLEET_CLUSTERS / "prod-gke.yaml").read_text())
    (repo / "clusters").mkdir()
    os.symlink(repo / "shared" / "prod-gke.yaml", repo / "clusters" / "prod-gke.yaml")
    assert [c.name for c in clusters.load_all(repo / "clusters")] == ["prod-gke"]


def test_fails_with_one_line_when_vault_addr_holds_an_interpolation(tmp_path: Path) -> None:
    """Once a traceback from the Nomad agent renderer at synthesis; now a schema error at the line."""
    path = tmp_path / "prod-nomad.yaml"
    path.write_text((FLEET_CLUSTERS / "prod-nomad.yaml").read_text().replace(
        "vault_addr: https://vault.example.com:8200", "vault_addr: https://vault.example.com:8200/${file(\"/etc/passwd\")}"))
    with pytest.raises(ConfigError) as err:
        clusters.load(path)
    (problem,) = err.value.problems
    assert str(problem).startswith(f"{path}:17: nomad.vault_addr: ") and "\n" not in str(problem)
    assert json.dumps(problem.message)  # plain text, no pydantic/regex internals
    assert "String should match pattern" not in problem.message
