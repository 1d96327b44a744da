"""A user's own fleet never fails the suite: `make test` tests the code, `gpufleet check` judges clusters/.

Newcomer week: after the README's first step (add a cluster file) seven tests failed, because they
pinned the checkout's clusters/ (addresses, stack lists, messages naming the clusters). The suite now
reads its own copy (``tests/fleet/clusters``, ``tests.conftest.FLEET_CLUSTERS``). This test makes a
copy of the repository, adds a cluster file to its clusters/ the way the README says, and runs there
the tests that used to break; they must pass, and the copy's `gpufleet clusters` must show the new
cluster (so the file really was read by the tool).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import FLEET_CLUSTERS, copy_checkout

# The tests that failed on a fresh clone with one more file in clusters/.
FLEET_SENSITIVE = (
    "tests/stacks/test_addresses.py::test_addresses_match_the_pinned_list",
    "tests/stacks/test_scheduler_stack.py::test_each_cluster_has_infra_then_scheduler_and_tfc_clusters_need_their_workspaces",
    "tests/safety/test_tfc_workspaces.py::test_gke_scheduler_workspace_runs_locally_and_reads_only_its_own_infra",
    "tests/experiments/test_gke.py::test_serve_binds_clusters_by_name",
)


def test_adding_a_cluster_file_leaves_the_suite_green(tmp_path: Path) -> None:
    repo = copy_checkout(tmp_path / "gpufleet")
    example = (FLEET_CLUSTERS / "dev-gke.yaml").read_text()
    team = example.replace("name: dev-gke\n", "name: team-gke\n", 1).replace("ml-train-dev", "ml-train-team")
    for old, new in (("10.30.0.0/20", "10.31.0.0/20"), ("10.96.0.0/14", "10.100.0.0/14"), ("10.40.0.0/20", "10.41.0.0/20"),
                     ("172.16.1.0/28", "172.16.2.0/28")):
        assert old in team
        team = team.replace(old, new)
    (repo / "clusters" / "team-gke.yaml").write_text(team)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")} | {"COLUMNS": "200"}
    listed = subprocess.run([sys.executable, "-m", "gpufleet.cli", "clusters"], cwd=repo, env=env, capture_output=True,
                            text=True, timeout=300)
    assert listed.returncode == 0 and "team-gke" in listed.stdout, listed.stdout + listed.stderr
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *FLEET_SENSITIVE], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert f"{len(FLEET_SENSITIVE)} passed" in done.stdout, done.stdout[-500:]
