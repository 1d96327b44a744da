"""The jobs CLI end to end: bad arguments are one line and exit 2; dispatch carries a real
wrapped secret_id from OpenBao to the Nomad double; run-local trains with its key from OpenBao."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from gpufleet.cli import main
from jobs.nomad.client import NomadClient
from jobs.local import task_environment
from jobs.loader import find, load
from tests.conftest import REPO_ROOT
from tests.jobs.nomad_double import NomadDouble
from tests.openbao_fixture import FAKE_KEYS, VaultHandle

REPO = Path(__file__).resolve().parents[3]
GPUFLEET = str(Path(sys.executable).parent / "gpufleet")
META = ["--meta", "dataset_uri=hf://datasets/demo/tiny@v1", "--meta", "run_id=demo-1"]


@pytest.fixture
def nomad_env(monkeypatch: pytest.MonkeyPatch, nomad: NomadDouble) -> NomadDouble:
    for name in ("NOMAD_NAMESPACE", "NOMAD_REGION", "NOMAD_CACERT", "VAULT_ADDR", "VAULT_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NOMAD_ADDR", nomad.address)
    monkeypatch.setenv("NOMAD_TOKEN", nomad.acl_token or "")
    return nomad


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["jobs", "render", "finetune-lama"], r"no job 'finetune-lama' \(did you mean 'finetune-llama'\?\)"),
        (["jobs", "dispatch", "finetune-llama", "--meta", "run_id"], r"--meta 'run_id' is not key=value"),
        (["jobs", "dispatch", "finetune-llama", "--meta", "run_id=x"], r"needs --meta dataset_uri=\.\.\."),
        (["jobs", "dispatch", "finetune-llama", "--meta", "run_id=x", "--meta", "dataset_uri=hf://d/x"], r"names no version"),
        (["jobs", "dispatch", "finetune-llama", *META], r"not dispatching, nothing was minted: status: Nomad has no job 'finetune-llama' in namespace finetune \(404: [^)]*\); if the job is not registered yet: gpufleet jobs submit finetune-llama$"),
        (["jobs", "run-local", "finetune-llama", *META], r"VAULT_ADDR and VAULT_TOKEN not set"),
        (["jobs", "status", "finetune-llama/dispatch-1-0"], r"status: Nomad has no job 'finetune-llama/dispatch-1-0' in namespace finetune \(404"),
    ],
)
def test_fails_when_cli_argument_is_bad(nomad_env: NomadDouble, capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert re.search(message, err[0]), err[0]


def test_fails_when_nomad_addr_is_not_a_url(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("NOMAD_ADDR", "localhost:4646")
    assert main(["jobs", "plan", "finetune-llama"]) == 2
    assert capsys.readouterr().err.strip() == "error: NOMAD_ADDR 'localhost:4646' is not an http(s) address; set it like https://nomad.example.com:4646"


def test_render_writes_the_golden_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["jobs", "render", "--out-dir", str(tmp_path)]) == 0
    for name in ("finetune-llama", "eval-judge"):
        assert (tmp_path / f"{name}.json").read_text() == (REPO / "tests" / "jobs" / "golden" / f"{name}.json").read_text()


def test_submit_then_dispatch_passes_a_real_wrapped_secret_id(nomad_env: NomadDouble, vault: VaultHandle, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("VAULT_ADDR", vault.addr)
    monkeypatch.setenv("VAULT_TOKEN", vault.orchestrator.token)
    assert main(["jobs", "plan", "finetune-llama"]) == 0
    assert main(["jobs", "submit", "finetune-llama"]) == 0
    assert main(["jobs", "dispatch", "finetune-llama", *META, "--idempotency-token", "cli-token-1"]) == 0
    out = capsys.readouterr().out
    (child,) = nomad_env.dispatched("finetune-llama")
    assert f"dispatched {child}" in out and f"gpufleet jobs status {child} --watch" in out
    assert "expires in 375s (queue wait 5 min, from pool a100, min_nodes 1)" in out
    dispatch = nomad_env.calls("POST", "dispatch")[0]
    assert dispatch.query["idempotency_token"] == ["cli-token-1"]
    meta = dispatch.body["Meta"]
    assert meta["gpufleet_vault_role_id"] == vault.root.auth.approle.read_role_id("finetune")["data"]["role_id"]
    wrapping = meta["gpufleet_vault_wrapped_secret_id"]
    assert wrapping not in out
    assert vault.client(wrapping).sys.unwrap()["data"]["secret_id"]
    assert main(["jobs", "status", child]) == 0
    assert "pending" in capsys.readouterr().out


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


def test_status_watch_refreshes_until_the_run_ends(nomad_env: NomadDouble, client_for: Callable[..., NomadClient], capsys: pytest.CaptureFixture[str]) -> None:
    spec = load(find("finetune-llama"))
    client = client_for(nomad_env)
    client.register(spec)
    child = client.dispatch(spec, {"dataset_uri": "hf://d/x@v1", "run_id": "w1"}, role_id="r", wrapping_token="w", idempotency_token="watch").dispatched_job_id
    nomad_env.finish(child, client_status="running")
    nomad_env.when_called("GET", "allocations", 3, lambda: nomad_env.finish(child, client_status="complete", events=[{"Type": "Terminated", "DisplayMessage": "Exit Code: 0"}]))
    assert main(["jobs", "status", child, "--watch", "--interval", "0.2"]) == 0
    assert len(nomad_env.calls("GET", "allocations")) == 3
    assert "complete" in capsys.readouterr().out
