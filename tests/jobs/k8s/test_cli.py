"""``gpufleet jobs`` for a GKE job end to end: real wrapped secret_ids from OpenBao reach each
rank through the run's Secret in the Kubernetes API double, and only there; a pod set up from
that Secret the way the kubelet does logs in once, and a second pod of the same rank cannot."""

from __future__ import annotations

import base64
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpufleet.cli import main
from jobs.k8s.render import VAULT_DIR
from tests.openbao_fixture import VaultHandle
from vault_policies.client import TaskConfig, WrappingTokenError, start_task

META = ["--meta", "dataset_uri=gs://acme-data/chat/v3/", "--meta", "run_id=gke-1"]


@pytest.fixture
def gke_env(monkeypatch: pytest.MonkeyPatch, k8s: Any, vault: VaultHandle) -> Any:
    for name in ("GPUFLEET_KUBE_CONTEXT", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KUBECONFIG", str(k8s.kubeconfig_path))
    monkeypatch.setenv("VAULT_ADDR", vault.addr)
    monkeypatch.setenv("VAULT_TOKEN", vault.orchestrator.token)
    return k8s


def kubelet_env(job: dict[str, Any], secret: dict[str, Any], rank: int, mount: Path) -> dict[str, str]:
    """The container environment the kubelet would build for pod ``rank``: Secret files mounted,
    secretKeyRef and the completion-index fieldRef resolved, $(VAR) expanded from earlier vars."""
    mount.mkdir(parents=True, exist_ok=True)
    for key, value in secret["data"].items():
        (mount / key).write_bytes(base64.b64decode(value))
    env: dict[str, str] = {}
    for item in job["spec"]["template"]["spec"]["containers"][0]["env"]:
        source = item.get("valueFrom") or {}
        if "secretKeyRef" in source:
            value = base64.b64decode(secret["data"][source["secretKeyRef"]["key"]]).decode()
        elif "fieldRef" in source:
            value = str(rank)
        else:
            value = re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), item["value"])
        env[item["name"]] = value.replace(VAULT_DIR, str(mount))
    return env


def test_dispatch_delivers_one_wrapped_secret_id_per_rank_and_nothing_else(gke_env: Any, vault: VaultHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["jobs", "dispatch", "finetune-llama-gke", *META, "--idempotency-token", "gke-cli-1"]) == 0
    out = capsys.readouterr().out
    (job_key,) = [k for k in gke_env.store.objects if k[0] == "jobs"]
    run = job_key[2]
    assert f"dispatched {run} (namespace research, 2 rank(s), LocalQueue gpu-h100" in out and f"gpufleet jobs status {run} --watch" in out
    job = gke_env.job("research", run)
    secret = gke_env.store.objects[("secrets", "research", f"{run}-vault")]
    tokens = [base64.b64decode(secret["data"][f"wrapped-secret-id-{rank}"]).decode() for rank in (0, 1)]
    assert len(set(tokens)) == 2
    for token in tokens:
        assert token not in out and token not in str(job)
    assert base64.b64decode(secret["data"]["role-id"]).decode() == vault.root.auth.approle.read_role_id("finetune")["data"]["role_id"]

    for rank in (0, 1):
        env = kubelet_env(job, secret, rank, tmp_path / f"pod-{rank}")
        assert env["NODE_RANK"] == str(rank) and env["GPUFLEET_VAULT_WRAPPED_SECRET_ID_FILE"].endswith(f"wrapped-secret-id-{rank}")
        env["VAULT_ADDR"] = vault.addr  # the double's cluster reaches this machine's OpenBao
        with start_task(TaskConfig.from_env(env)) as task:
            assert task.secrets == {"HF_TOKEN": "fake-hf-test-0000"}
    again = kubelet_env(job, secret, 0, tmp_path / "retried-pod")
    again["VAULT_ADDR"] = vault.addr
    with pytest.raises(WrappingTokenError, match="POSSIBLE INTERCEPTION: the wrapping token .* is unknown to Vault: someone else already unwrapped it"):
        start_task(TaskConfig.from_env(again))

    assert main(["jobs", "dispatch", "finetune-llama-gke", *META, "--idempotency-token", "gke-cli-1"]) == 0
    assert "already dispatched (same --idempotency-token)" in capsys.readouterr().out
    assert [k for k in gke_env.store.objects if k[0] == "jobs"] == [job_key]


def test_submit_status_watch_and_cancel(gke_env: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["jobs", "register", "finetune-llama-gke"]) == 0
    assert "GKE accepts finetune-llama-gke in namespace research (dry run of Job" in capsys.readouterr().out
    assert main(["jobs", "dispatch", "finetune-llama-gke", *META, "--idempotency-token", "gke-cli-2"]) == 0
    run = next(k[2] for k in gke_env.store.objects if k[0] == "jobs")
    capsys.readouterr()
    assert main(["jobs", "status", run]) == 0
    assert "pending" in capsys.readouterr().out

    def drive() -> None:
        time.sleep(0.5)
        gke_env.admit("research", run, cluster_queue="research", flavor="h100")
        time.sleep(0.5)
        gke_env.succeed("research", run)

    threading.Thread(target=drive, daemon=True).start()
    assert main(["jobs", "status", run, "--watch", "--interval", "1"]) == 0
    assert "succeeded" in capsys.readouterr().out
    assert main(["jobs", "cancel", f"research/{run}"]) == 0
    cancelled = capsys.readouterr()
    assert "deleted in the foreground" in cancelled.out and cancelled.err == ""
    assert main(["jobs", "status", run]) == 0
    assert "stopped" in capsys.readouterr().out


def test_jobs_stop_is_the_old_name_of_cancel(gke_env: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """One verb per action (issue 27): `cancel`, as in `gpufleet exp cancel`; scripts that say `stop` keep working."""
    assert main(["jobs", "dispatch", "finetune-llama-gke", *META, "--idempotency-token", "gke-cli-stop"]) == 0
    run = next(k[2] for k in gke_env.store.objects if k[0] == "jobs")
    capsys.readouterr()
    assert main(["jobs", "stop", f"research/{run}"]) == 0
    stopped = capsys.readouterr()
    assert "deleted in the foreground" in stopped.out
    assert stopped.err.strip().splitlines() == ["note: `gpufleet jobs stop` is now `gpufleet jobs cancel` (the verb of `gpufleet exp cancel`);"
                                                " `stop` still works for now"]
    assert main(["jobs", "--help"]) == 0
    listed = capsys.readouterr().out
    assert "cancel" in listed and " stop " not in listed


@pytest.mark.parametrize(("argv", "message"), [
    (["jobs", "plan", "finetune-llama-gke"], r"^error: plan is Nomad's; finetune-llama-gke runs on GKE cluster prod-gke"),
    (["jobs", "status", "finetune-llama-gke-0123456789"], r"^error: status: no Job finetune-llama-gke-0123456789 in namespace research"),
    (["jobs", "dispatch", "finetune-llama-gke", "--meta", "run_id=x"], r"^error: job finetune-llama-gke needs --meta dataset_uri"),
])
def test_fails_with_one_line(gke_env: Any, capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(message, err[0]), err
