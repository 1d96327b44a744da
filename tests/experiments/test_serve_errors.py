"""``gpufleet serve`` refuses bad start-up input in one line, as a newcomer meets it (issue 27).

Each case runs the real CLI in a subprocess, from a directory holding the operator's files, and
expects exit 2, one ``error:`` line naming the relative file, line, field, what is allowed and the
fix, and no traceback. Before this, an unreachable PostgreSQL, ``tenants:`` written as a list and a
tab in the OIDC file each ended in a Python traceback, and a claim mapped to a tenant no cluster
file defines started the service silently (every holder of that claim then got 403).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FLEET_CLUSTERS, REPO_ROOT

OIDC_HEAD = "issuer: https://issuer.example\naudience: gpufleet\njwks_url: https://issuer.example/jwks\nclaim: repository_owner\n"


@pytest.fixture
def fleet_repo(tmp_path: Path) -> Path:
    """A repository holding only the suite's fixture fleet (never the checkout's clusters/)."""
    repo = tmp_path / "repo"
    (repo / "clusters").mkdir(parents=True)
    shutil.copy(REPO_ROOT / "cdktf.json", repo / "cdktf.json")
    for path in FLEET_CLUSTERS.glob("*.yaml"):
        shutil.copy(path, repo / "clusters" / path.name)
    return repo


def _serve(cwd: Path, repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "GPUFLEET_"))}
    # A service that wrongly starts would serve until killed: the timeout turns that into a failure.
    return subprocess.run([sys.executable, "-m", "gpufleet.cli", "--repo", str(repo), "serve", "--scheduler", "local", "--port", "1",
                           *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def _one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


def test_fails_when_postgresql_is_unreachable(tmp_path, fleet_repo):
    line = _one_line(_serve(tmp_path, fleet_repo, "--db", "postgresql://127.0.0.1:1/x"))
    assert line.startswith("error: --db postgresql://127.0.0.1:1/x: cannot reach the database ("), line
    assert "Connection refused" in line and "start PostgreSQL there" in line and "omit --db to use SQLite" in line


@pytest.mark.parametrize(
    ("tenants", "expected"),
    [
        ("tenants:\n  - acme\n", "error: oidc.yaml:5: tenants: must map each claim value to one tenant (got a list); write it as a mapping,"
                                 " e.g. 'tenants: {acme-ml: finetune}'"),
        ("tenants:\n\tacme: finetune\n", "error: oidc.yaml:6: invalid YAML: found character '\\t' that cannot start any token;"
                                          " indent with spaces (YAML forbids tabs in indentation)"),
        ("tenants:\n  acme: finetun\n", "error: oidc.yaml:6: tenants.acme: 'finetun' is not a tenant of any cluster file (did you mean"
                                        " 'finetune'?); allowed: applied, eval, finetune, pretrain, research, sandbox; map acme to one of them"),
    ],
    ids=["tenants-as-list", "tab", "unknown-tenant"],
)
def test_fails_when_the_oidc_config_is_wrong(tmp_path, fleet_repo, tenants, expected):
    (tmp_path / "oidc.yaml").write_text(OIDC_HEAD + tenants)
    line = _one_line(_serve(tmp_path, fleet_repo, "--db", "sqlite:///x.db", "--oidc-config", "oidc.yaml"))
    assert line.startswith(expected), line
    assert not (tmp_path / "x.db").exists()  # refused before the database was touched


def test_refuses_to_start_when_a_bound_clusters_scheduler_does_not_answer(tmp_path, fleet_repo):
    """Issue 24: a service bound to a Nomad cluster whose API does not answer would accept runs it cannot
    dispatch; it refuses to start in one line that names the cluster, the variables to check and the flag."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "GPUFLEET_", "NOMAD_"))}
    env.update(NOMAD_ADDR="http://127.0.0.1:1", NOMAD_TOKEN="not-a-real-token", VAULT_ADDR="http://127.0.0.1:1", VAULT_TOKEN="not-a-real-token")
    done = subprocess.run([sys.executable, "-m", "gpufleet.cli", "--repo", str(fleet_repo), "serve", "--nomad-cluster", "prod-nomad", "--port", "1",
                           "--db", f"sqlite:///{tmp_path / 'x.db'}"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    line = _one_line(done)
    assert line.startswith("error: cluster prod-nomad: its nomad scheduler does not answer (") and "http://127.0.0.1:1" in line, line
    assert "check NOMAD_ADDR" in line and "--allow-degraded" in line and "not-a-real-token" not in done.stdout + done.stderr


def test_allow_degraded_starts_and_says_so() -> None:
    from gpufleet.serve_cmd import _refuse_silent_schedulers
    from jobs.runner import SchedulerUnavailable

    class Silent:
        def identity(self) -> str:
            raise SchedulerUnavailable("cannot reach Nomad at http://127.0.0.1:1")

    class Runners:
        members = {"prod-nomad": Silent()}
        clusters = {"prod-nomad": "nomad"}

    with pytest.raises(Exception, match="--allow-degraded"):
        _refuse_silent_schedulers(Runners(), allow_degraded=False)
    _refuse_silent_schedulers(Runners(), allow_degraded=True)  # a warning, no refusal: the worker keeps asking
