"""run-local end to end: the task gets a Nomad-shaped environment without the dispatcher's
VAULT_TOKEN, and trains with its key from OpenBao through the same wrapped secret_id flow."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from jobs.local import task_environment
from jobs.loader import find, load
from jobs.spec import RUN_DEADLINE_META
from tests.conftest import REPO_ROOT
from tests.openbao_fixture import FAKE_KEYS, VaultHandle, live_role_tokens
from vault_policies.exec import run_limits

GPUFLEET = str(Path(sys.executable).parent / "gpufleet")
META = ["--meta", "dataset_uri=hf://datasets/demo/tiny@v1", "--meta", "run_id=demo-1"]


def test_task_environment_is_nomad_shaped_and_never_holds_vault_token(tmp_path: Path) -> None:
    spec = load(find("finetune-llama"))
    meta = {"dataset_uri": "hf://d/x@v1", "run_id": "r1", "gpufleet_vault_role_id": "rid", "gpufleet_vault_wrapped_secret_id": "wrap"}
    environ = {"PATH": "/usr/bin", "HOME": "/root", "VAULT_ADDR": "http://127.0.0.1:8200", "VAULT_TOKEN": "root-token-must-not-leak", "AWS_PROFILE": "prod"}
    env = task_environment(spec, meta, job_id="finetune-llama/dispatch-1-ab", alloc_id="0123456789ab", alloc_root=tmp_path, environ=environ)
    assert "VAULT_TOKEN" not in env and "AWS_PROFILE" not in env
    assert env["GPUFLEET_VAULT_ROLE_ID"] == "rid" and env["GPUFLEET_VAULT_WRAPPED_SECRET_ID"] == "wrap"
    assert env["GPUFLEET_SECRETS"] == "HF_TOKEN=ml-api-keys/huggingface#token"
    assert env["GPUFLEET_MAX_RUN_SECONDS"] == "43200", "run-local must pass the run limit gpufleet-exec enforces"
    assert env["VAULT_ADDR"] == "http://127.0.0.1:8200"
    assert env["NOMAD_META_dataset_uri"] == env["NOMAD_META_DATASET_URI"] == "hf://d/x@v1"
    assert env["NOMAD_META_gpufleet_vault_role"] == "finetune"
    assert (env["NOMAD_JOB_ID"], env["NOMAD_JOB_PARENT_ID"], env["NOMAD_NAMESPACE"], env["NOMAD_ALLOC_NAME"]) == ("finetune-llama/dispatch-1-ab", "finetune-llama", "finetune", "finetune-llama/dispatch-1-ab.gpu-a100-x1[0]")
    assert Path(env["NOMAD_ALLOC_DIR"]).is_dir() and Path(env["NOMAD_TASK_DIR"]).is_dir() and Path(env["NOMAD_SECRETS_DIR"]).stat().st_mode & 0o077 == 0


def test_local_runs_get_the_experiment_deadline_like_nomad(tmp_path: Path) -> None:
    """The local runner's env is interpolated from the dispatch meta like a Nomad client's: the control plane's
    remaining deadline binds gpufleet-exec; an operator's run-local without it keeps the job's max_run."""
    spec = load(find("finetune-llama"))
    meta = {"dataset_uri": "hf://d/x@v1", "run_id": "r1", "gpufleet_vault_role_id": "rid", "gpufleet_vault_wrapped_secret_id": "wrap"}
    environ = {"PATH": "/usr/bin", "VAULT_ADDR": "http://127.0.0.1:8200"}
    bounded = task_environment(spec, {**meta, RUN_DEADLINE_META: "600"}, job_id="j/dispatch-1", alloc_id="0123456789ab", alloc_root=tmp_path / "a", environ=environ)
    assert bounded["GPUFLEET_RUN_DEADLINE_SECONDS"] == "600" and run_limits(bounded)[0] == 600
    unbounded = task_environment(spec, meta, job_id="j/dispatch-2", alloc_id="0123456789ac", alloc_root=tmp_path / "b", environ=environ)
    assert run_limits(unbounded)[0] == 43200


def test_run_local_trains_with_its_key_from_openbao(vault: VaultHandle, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VAULT_", "NOMAD_"))}
    env.update({"VAULT_ADDR": vault.addr, "VAULT_TOKEN": vault.orchestrator.token})
    done = subprocess.run([GPUFLEET, "--repo", str(REPO_ROOT), "jobs", "run-local", "finetune-llama", *META], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    key = FAKE_KEYS["ml-api-keys/huggingface"]["token"]
    assert f"HF_TOKEN received (sha256:{hashlib.sha256(key.encode()).hexdigest()[:12]})" in done.stdout
    assert "step  300 loss" in done.stdout and "checkpoint written to" in done.stdout
    assert "gpufleet-exec: token revoked" in done.stderr
    for data in FAKE_KEYS.values():
        for value in data.values():
            assert value not in output
    assert vault.orchestrator.token not in output


def test_fails_when_run_local_role_cannot_read_its_key(vault: VaultHandle, tmp_path: Path) -> None:
    """The eval role may read only the OpenAI key; with the key deleted from OpenBao the task
    exits with gpufleet-exec's Vault code and says which key was missing."""
    vault.root.secrets.kv.v2.delete_metadata_and_all_versions("ml-api-keys/openai", mount_point="secret")
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VAULT_", "NOMAD_"))}
        env.update({"VAULT_ADDR": vault.addr, "VAULT_TOKEN": vault.orchestrator.token})
        done = subprocess.run([GPUFLEET, "--repo", str(REPO_ROOT), "jobs", "run-local", "eval-judge", *META], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    finally:
        vault.root.secrets.kv.v2.create_or_update_secret("ml-api-keys/openai", secret=FAKE_KEYS["ml-api-keys/openai"], mount_point="secret")
    assert done.returncode == 78, done.stdout + done.stderr
    assert "no secret at secret/data/ml-api-keys/openai (wanted for OPENAI_API_KEY)" in done.stderr


def test_sigterm_to_run_local_lets_gpufleet_exec_revoke_the_task_token(vault: VaultHandle, tmp_path: Path) -> None:
    """A group SIGTERM (``timeout``, a cancelled CI job) during ``jobs run-local`` reaches gpufleet-exec, which
    stops its task and revokes the task's Vault token. Before (clusters/termination.py then): gpufleet unwound
    through ``subprocess.run``, which SIGKILLs its child on any exception, so the token stayed alive."""
    import signal
    import time

    ready = tmp_path / "ready"
    job = tmp_path / "finetune-llama.yaml"
    text = (REPO_ROOT / "jobs" / "finetune-llama.yaml").read_text()
    job.write_text(text.replace('args: [jobs/tasks/tiny_finetune.py, --steps, "300", --require-env, HF_TOKEN]',
                                f"args: [-c, \"import pathlib, time; pathlib.Path('{ready}').touch(); time.sleep(60)\"]"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VAULT_", "NOMAD_"))}
    env.update({"VAULT_ADDR": vault.addr, "VAULT_TOKEN": vault.orchestrator.token})
    before = live_role_tokens(vault, "finetune")
    proc = subprocess.Popen([GPUFLEET, "--repo", str(REPO_ROOT), "jobs", "run-local", str(job), *META], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, process_group=0)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        during = live_role_tokens(vault, "finetune") - before
        assert len(during) == 1, "the run should hold exactly one live token"
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == -signal.SIGTERM, err
    assert "token revoked" in err
    assert live_role_tokens(vault, "finetune") & during == set(), "the task token is still alive after SIGTERM"
