"""``gpufleet dev up|env|down`` end to end, as ``make demo`` uses it."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import hvac

from tests.openbao_fixture import REPO_ROOT
from vault_policies.devserver import is_healthy
from vault_policies.orchestrator import issue_wrapped_secret_id

BIN = Path(sys.executable).parent


def _gpufleet(*args: str, repo: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "gpufleet"), *args, "--repo", str(repo)], capture_output=True, text=True, timeout=60)


def _exports(text: str) -> dict[str, str]:
    env = {}
    for line in text.splitlines():
        if line.startswith("export "):
            name, _, value = line.removeprefix("export ").partition("=")
            env[name] = shlex.split(value)[0]
    return env


def test_dev_up_env_down(tmp_path: Path) -> None:
    shutil.copytree(REPO_ROOT / "vault_policies", tmp_path / "vault_policies", ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    shutil.copytree(REPO_ROOT / "clusters", tmp_path / "clusters", ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    up = _gpufleet("dev", "up", repo=tmp_path)
    try:
        assert up.returncode == 0, up.stderr
        assert "seeded fake demo key secret/ml-api-keys/huggingface" in up.stderr
        state_dir = tmp_path / ".gpufleet" / "dev"
        state = json.loads((state_dir / "state.json").read_text())
        assert stat.S_IMODE((state_dir / "root-token").stat().st_mode) == 0o600
        env = _exports(_gpufleet("dev", "env", repo=tmp_path).stdout)
        assert env["VAULT_ADDR"] == state["addr"] and env["VAULT_ADDR"].startswith("http://127.0.0.1:")
        assert env["VAULT_TOKEN"] not in (state_dir / "bao.log").read_text()

        again = _gpufleet("dev", "up", repo=tmp_path)
        assert f"reusing OpenBao dev server at {state['addr']} (pid {state['pid']})" in again.stderr
        assert again.stdout.rstrip().endswith("no changes")
        diff = subprocess.run([str(BIN / "gpufleet"), "vault", "diff", "--repo", str(tmp_path)], env={**os.environ, **env}, capture_output=True, text=True, timeout=60)
        assert diff.returncode == 0 and diff.stdout.rstrip().endswith("no changes"), "make demo's `vault diff` sees the dev server's loopback bindings as intended"

        wrapped = issue_wrapped_secret_id(hvac.Client(url=env["VAULT_ADDR"], token=env["VAULT_TOKEN"]), "finetune", wrap_ttl_seconds=120)
        task_env = {**os.environ, "VAULT_ADDR": env["VAULT_ADDR"], "GPUFLEET_VAULT_ROLE_ID": wrapped.role_id, "GPUFLEET_VAULT_WRAPPED_SECRET_ID": wrapped.wrapping_token, "GPUFLEET_SECRETS": "HF_TOKEN=ml-api-keys/huggingface#token"}
        run = subprocess.run([str(BIN / "gpufleet-exec"), "--", "sh", "-c", 'test "$HF_TOKEN" = fake-hf-demo-0000'], env=task_env, capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
    finally:
        down = _gpufleet("dev", "down", repo=tmp_path)
    assert down.returncode == 0 and "stopped OpenBao dev server" in down.stderr
    assert not is_healthy(state["addr"])
    after = _gpufleet("dev", "env", repo=tmp_path)
    assert after.returncode == 2 and "gpufleet dev up" in after.stderr


def test_vault_render_runs_inside_the_repository_without_repo() -> None:
    """Red team: `gpufleet vault render` (the documented way to regenerate the operator
    policies) crashed with a TypeError unless --repo was passed."""
    done = subprocess.run([str(BIN / "gpufleet"), "vault", "render"], cwd=REPO_ROOT / "clusters", capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "operator policies are up to date" in done.stderr and "Traceback" not in done.stderr
