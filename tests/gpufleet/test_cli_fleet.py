"""The fleet commands as a user runs them: real subprocesses, exit codes, one-line errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO_ROOT

GPUFLEET = [sys.executable, "-m", "gpufleet.cli"]


def run(*args: str, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20"}
    return subprocess.run([*GPUFLEET, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def bad_clusters_dir(tmp_path: Path) -> Path:
    bad = tmp_path / "clusters"
    bad.mkdir()
    for src in sorted((REPO_ROOT / "clusters").glob("*.yaml")):
        shutil.copy(src, bad / src.name)
    text = (bad / "prod-gke.yaml").read_text().replace("machine_type: a3-highgpu-8g", "machine_type: a3-highgpu-8g\n    gpus_per_node: 4")
    (bad / "prod-gke.yaml").write_text(text)
    return bad


def test_fails_when_a_cluster_file_is_wrong_with_one_line_exit_2_and_nothing_written(tmp_path):
    out = tmp_path / "cdktf.out"
    out.mkdir()
    (out / ".gpufleet-output").write_text("gpufleet made this directory\n")
    (out / "marker").write_text("previous synthesis")
    result = run("synth", "--clusters-dir", str(bad_clusters_dir(tmp_path)), "--out", str(out))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "prod-gke.yaml:" in lines[0] and "gpu_pools[0].gpus_per_node" in lines[0]
    assert "set gpus_per_node: 8 or pick a3-highgpu-4g" in lines[0]
    assert "Traceback" not in result.stderr + result.stdout
    assert sorted(p.name for p in out.iterdir()) == [".gpufleet-output", "marker"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cdktf.out", "clusters"]


def test_check_fails_the_same_way_on_a_wrong_cluster_file(tmp_path):
    result = run("check", "--clusters-dir", str(bad_clusters_dir(tmp_path)), "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert "gpu_pools[0].gpus_per_node" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_stacks_json_lists_every_stack_for_the_ci_matrix():
    result = run("stacks", "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert {r["stack"] for r in rows} >= {"dev-gke", "prod-gke", "prod-nomad"}
    assert all(set(r) == {"stack", "cluster", "kind", "depends_on", "runs_on", "nomad_tls"} for r in rows)


def test_clusters_table_shows_pools_and_gpu_ranges():
    result = run("clusters")
    assert result.returncode == 0, result.stderr
    assert "prod-gke" in result.stdout and "a3-highgpu-8g" in result.stdout and "32/48" in result.stdout  # the reserved h100 pool stays warm: 4 nodes x 8


def test_fails_when_synth_names_an_unknown_stack(tmp_path):
    result = run("synth", "nope", "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert result.stderr.strip().startswith("error: unknown stack 'nope'")
    assert "Traceback" not in result.stderr


def test_fails_when_cdktf_runs_main_py_on_a_wrong_cluster_file(tmp_path):
    """`cdktf synth` runs main.py: same one-line error, exit 2, and its outdir untouched."""
    out = tmp_path / "cdktf.out"
    out.mkdir()
    (out / "marker").write_text("previous synthesis")
    env = {**os.environ, "GPUFLEET_CLUSTERS_DIR": str(bad_clusters_dir(tmp_path)), "CDKTF_OUTDIR": str(out)}
    result = subprocess.run([sys.executable, "main.py"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "gpu_pools[0].gpus_per_node" in line and "Traceback" not in result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["marker"]


def test_tables_print_names_in_full_in_a_pipe(tmp_path):
    """Piped (CI logs, `| grep`), rich assumed 80 columns and folded stack names mid-word."""
    fleet = tmp_path / "clusters"
    fleet.mkdir()
    fixture = REPO_ROOT / "tests" / "clusters" / "fixtures" / "dated-a3mega.yaml"
    long_name = "dated-a3mega-with-long-name"
    (fleet / f"{long_name}.yaml").write_text(fixture.read_text().replace("name: dated-a3mega\n", f"name: {long_name}\n", 1))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    result = subprocess.run([*GPUFLEET, "stacks", "--clusters-dir", str(fleet)], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert any(f"{long_name}-scheduler" in line and f"│ {long_name} " in line for line in result.stdout.splitlines()), result.stdout


def test_check_starts_checkovs_worker_before_the_cluster_files_load_and_never_leaves_it(tmp_path, monkeypatch):
    """``gpufleet check`` starts checkov's worker first (its imports then run while the files load and the fleet
    synthesizes; in a one-cluster edit they were the check's critical path): a wrong cluster file still ends in
    the one-line error, and the worker started for nothing is stopped, not left running."""
    from typer.testing import CliRunner

    import clusters
    from clusters.errors import ConfigError
    from gpufleet.cli import app
    from safety import checkov_scan
    from stacks import parallel

    events: list[str] = []
    started: list[checkov_scan._Worker] = []
    real_prestart, real_load_all = checkov_scan.prestart, clusters.load_all

    def prestart(*args, **kwargs):
        events.append("checkov worker")
        started.append(real_prestart(*args, **kwargs))
        return started[-1]

    def load_all(*args, **kwargs):
        events.append("cluster files")
        return real_load_all(*args, **kwargs)

    monkeypatch.setattr(checkov_scan, "prestart", prestart)
    monkeypatch.setattr(clusters, "load_all", load_all)
    monkeypatch.setattr(parallel, "available_cores", lambda: 2)
    result = CliRunner().invoke(app, ["check", "--clusters-dir", str(bad_clusters_dir(tmp_path)), "--out", str(tmp_path / "out")])
    assert isinstance(result.exception, ConfigError), result.output  # ``main`` makes it the one line, exit 2 (above)
    assert events[:2] == ["checkov worker", "cluster files"]
    assert len(started) == 1 and started[0].ended and started[0].process.poll() is not None


WARM_ENV = """
import sys
from stacks import parallel
parallel.available_cores = lambda: 2
from review.checks import checkov_warmed
from safety import checkov_scan
with checkov_warmed(True) as warm:
    assert warm is not None
    import stacks.synth  # as run_checks imports it, after the CLI started the worker
    stream = checkov_scan.Stream(warm=warm)  # what run_checks does then
    print(stream.worker is warm)
    stream.close()
"""


def test_the_worker_the_cli_starts_first_is_the_one_the_check_scans_with():
    """A red team's find: the worker started before ``stacks.synth`` was imported lacked the two jsii variables
    that module sets, so the check's stream found another environment, stopped it and started a new one. In a
    process where neither is set (a user's shell; the test session sets them)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JSII_SILENCE_WARNING")}
    result = subprocess.run([sys.executable, "-c", WARM_ENV], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["True"]


def test_check_without_checkov_reports_the_cluster_file_first(tmp_path, monkeypatch):
    """The worker starts before the files load; when it cannot (checkov missing, a wrong skip file), the wrong
    cluster file is still the error reported, as before, not the worker's."""
    from typer.testing import CliRunner

    from clusters.errors import ConfigError, UserError
    from gpufleet.cli import app
    from safety import checkov_scan
    from stacks import parallel

    def prestart(*args, **kwargs):
        raise UserError("checkov not found beside python or on PATH; install it")

    monkeypatch.setattr(checkov_scan, "prestart", prestart)
    monkeypatch.setattr(parallel, "available_cores", lambda: 2)
    result = CliRunner().invoke(app, ["check", "--clusters-dir", str(bad_clusters_dir(tmp_path)), "--out", str(tmp_path / "out")])
    assert isinstance(result.exception, ConfigError), result.exception
    assert "gpus_per_node" in str(result.exception)
