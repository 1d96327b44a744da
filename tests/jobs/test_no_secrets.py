"""A job without ``secrets:`` (issue 27): accepted, rendered with no Vault role, no wrap and no
Vault variable on either scheduler, dispatched without minting a secret_id (real OpenBao counts
them), and run by gpufleet-exec without a Vault login, locally as on a node."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hvac
import hvac.exceptions
import pytest

from clusters.errors import ConfigError
from jobs.k8s.render import manifests
from jobs.k8s.schemas import require_valid
from jobs.loader import JOBS_DIR, load
from jobs.local import run_local, task_environment
from jobs.nomad.render import render, task_env
from jobs.runner import GkeRunner, NomadRunner
from jobs.spec import FinetuneSpec
from tests.jobs.nomad_double import NomadDouble
from tests.openbao_fixture import VaultHandle

BIN = Path(sys.executable).parent
VAULT_NAMES = ("VAULT_ADDR", "GPUFLEET_VAULT_ROLE", "GPUFLEET_VAULT_ROLE_ID", "GPUFLEET_VAULT_WRAPPED_SECRET_ID",
               "GPUFLEET_VAULT_WRAPPED_SECRET_ID_FILE", "GPUFLEET_SECRETS")
SECRETS_BLOCK = "secrets:\n  role: finetune\n  env:\n    HF_TOKEN: ml-api-keys/huggingface#token\n"


def without_secrets(source: str, name: str) -> str:
    """An example job file renamed ``name``, with its ``secrets:`` block and its key check removed."""
    text = (JOBS_DIR / f"{source}.yaml").read_text()
    for old, new in ((SECRETS_BLOCK, ""), (", --require-env, HF_TOKEN]", "]"), (f"name: {source}\n", f"name: {name}\n")):
        assert text.count(old) == 1, f"jobs/{source}.yaml changed: {old!r}"
        text = text.replace(old, new)
    return text


@pytest.fixture
def no_keys(tmp_path: Path, cluster_configs: Any, vault_view: Any) -> Callable[[str], FinetuneSpec]:
    def make(source: str) -> FinetuneSpec:
        name = f"nokeys-{'gke' if 'gke' in source else 'nomad'}"
        path = tmp_path / f"{name}.yaml"
        path.write_text(without_secrets(source, name))
        return load(path, cluster_configs=cluster_configs, vault=vault_view)

    return make


def test_a_job_without_secrets_is_accepted_and_has_no_role(no_keys: Callable[[str], FinetuneSpec]) -> None:
    spec = no_keys("finetune-llama")
    assert (spec.vault_role, spec.secrets) == (None, ())


def test_an_empty_secrets_block_is_still_refused(tmp_path: Path, cluster_configs: Any, vault_view: Any) -> None:
    """Optional means absent: ``secrets:`` written with a role and no keys stays an error (a typo, not a choice)."""
    text = (JOBS_DIR / "finetune-llama.yaml").read_text().replace(SECRETS_BLOCK, "secrets:\n  role: finetune\n  env: {}\n")
    path = tmp_path / "finetune-llama.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load(path, cluster_configs=cluster_configs, vault=vault_view)
    assert any("secrets.env" in str(p) for p in caught.value.problems), caught.value.problems


def test_nomad_render_has_no_vault_role_wrap_or_variables(no_keys: Callable[[str], FinetuneSpec]) -> None:
    spec = no_keys("finetune-llama")
    job = render(spec)["Job"]
    assert "gpufleet_vault_role" not in job["Meta"]
    assert job["ParameterizedJob"]["MetaRequired"] == ["dataset_uri", "gpufleet_attempt", "gpufleet_experiment", "run_id"], "no Vault meta to wait for"
    assert job["ParameterizedJob"]["MetaOptional"] == ["base_model", "gpufleet_run_deadline_seconds"]  # the experiment's deadline, jobs or none
    env = task_env(spec)
    assert not set(VAULT_NAMES) & set(env), env
    assert env["GPUFLEET_NO_VAULT"] == "1" and env["GPUFLEET_MAX_RUN_SECONDS"] == "43200"


def test_gke_render_has_no_vault_secret_volume_or_variables(no_keys: Callable[[str], FinetuneSpec]) -> None:
    spec = no_keys("finetune-llama-gke")
    docs = manifests(spec, dispatch_id="d-1", meta={"dataset_uri": "gs://a/b/", "run_id": "r1"})
    require_valid(docs)  # still a valid Job for Kubernetes v1.35 and Kueue's schemas
    job = docs[-1]
    pod = job["spec"]["template"]["spec"]
    assert "gpufleet.dev/vault-role" not in job["metadata"]["annotations"]
    assert all(v["name"] != "vault" for v in pod["volumes"]) and all(m["name"] != "vault" for m in pod["containers"][0]["volumeMounts"])
    names = {e["name"] for e in pod["containers"][0]["env"]}
    assert not set(VAULT_NAMES) & names and "GPUFLEET_NO_VAULT" in names


def _secret_ids(vault: VaultHandle) -> int:
    """Unused secret_ids of every repo role, as OpenBao lists them (minted and not yet spent)."""
    total = 0
    for role in vault.definitions.roles:
        try:
            total += len(vault.root.auth.approle.list_secret_id_accessors(role)["data"]["keys"])
        except hvac.exceptions.InvalidPath:  # OpenBao answers 404 for a role with none
            pass
    return total


def test_nomad_dispatch_mints_nothing_and_sends_no_vault_meta(no_keys: Callable[[str], FinetuneSpec], nomad: NomadDouble,
                                                              client_for: Callable[..., Any], vault: VaultHandle, cluster_configs: Any,
                                                              vault_view: Any) -> None:
    runner = NomadRunner(client_for(nomad), {"VAULT_ADDR": vault.addr, "VAULT_TOKEN": vault.orchestrator.token})
    meta = {"dataset_uri": "hf://datasets/demo/tiny@v1", "run_id": "r1"}
    before = _secret_ids(vault)
    run_id = runner.submit(no_keys("finetune-llama"), meta, idempotency_key="exp-nokeys")
    assert _secret_ids(vault) == before, "a job without secrets must not mint a secret_id"
    dispatched = nomad.state.jobs[tuple(run_id.split("/", 1))]  # type: ignore[index]
    assert dispatched["Meta"] == {**meta, "gpufleet_cluster": "prod-nomad", "gpufleet_gpu_pool": "a100", "gpufleet_experiment": "exp-nokeys",
                                  "gpufleet_attempt": "1"}
    # The same runner with a job that has keys mints one: the count above can move.
    runner.submit(load(JOBS_DIR / "finetune-llama.yaml", cluster_configs=cluster_configs, vault=vault_view), meta, idempotency_key="exp-keys")
    assert _secret_ids(vault) == before + 1


def test_gke_dispatch_creates_no_vault_secret(no_keys: Callable[[str], FinetuneSpec], k8s: Any, k8s_client_for: Callable[..., Any],
                                              vault: VaultHandle) -> None:
    runner = GkeRunner(k8s_client_for(k8s), {"VAULT_ADDR": vault.addr, "VAULT_TOKEN": vault.orchestrator.token})
    before = _secret_ids(vault)
    run_id = runner.submit(no_keys("finetune-llama-gke"), {"dataset_uri": "gs://acme-data/chat/v3/", "run_id": "r1"}, idempotency_key="exp-g")
    run = run_id.rsplit("/", 1)[1]
    kinds = {(kind, name) for kind, _namespace, name in k8s.store.objects}  # (resource, namespace, name)
    assert ("jobs", run) in kinds and ("secrets", f"{run}-vault") not in kinds, kinds
    assert _secret_ids(vault) == before


def test_run_local_runs_without_any_vault_variable(no_keys: Callable[[str], FinetuneSpec], tmp_path: Path) -> None:
    """No VAULT_ADDR or VAULT_TOKEN in the caller's environment either: nothing asks Vault."""
    spec = no_keys("finetune-llama")
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("VAULT_", "NOMAD_", "GPUFLEET_"))}
    env = task_environment(spec, {"dataset_uri": "hf://d/x@v1", "run_id": "r1"}, job_id="j/dispatch-1", alloc_id="0123456789ab",
                           alloc_root=tmp_path, environ=environ)
    assert not set(VAULT_NAMES) & set(env) and env["GPUFLEET_NO_VAULT"] == "1"
    job_id, code = run_local(spec, {"dataset_uri": "hf://datasets/demo/tiny@v1", "run_id": "r1"}, environ=environ)
    assert code == 0 and job_id.startswith("nokeys-nomad/dispatch-")


def _exec(env: dict[str, str], *command: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("VAULT_", "GPUFLEET_"))}
    return subprocess.run([str(BIN / "gpufleet-exec"), "--", *command], env={**base, **env}, capture_output=True, text=True, timeout=60)


def test_gpufleet_exec_without_vault_runs_the_command_and_keeps_the_run_limit() -> None:
    done = _exec({"GPUFLEET_NO_VAULT": "1"}, "sh", "-c", "exit 7")
    assert done.returncode == 7 and "no Vault login" in done.stderr, done.stderr
    limited = _exec({"GPUFLEET_NO_VAULT": "1", "GPUFLEET_MAX_RUN_SECONDS": "1", "GPUFLEET_KILL_GRACE_SECONDS": "1"}, "sleep", "30")
    assert limited.returncode == 124, limited.stderr


def test_fails_when_no_vault_is_mixed_with_a_wrap_or_misspelt() -> None:
    """A job with keys never gets GPUFLEET_NO_VAULT; seeing it beside a wrap is a mixed-up environment: exit 2, nothing run."""
    mixed = _exec({"GPUFLEET_NO_VAULT": "1", "GPUFLEET_VAULT_WRAPPED_SECRET_ID": "w", "GPUFLEET_VAULT_ROLE_ID": "r"}, "sh", "-c", "echo ran")
    assert mixed.returncode == 2 and "ran" not in mixed.stdout and "GPUFLEET_VAULT_ROLE_ID" in mixed.stderr, mixed.stderr
    keys = _exec({"GPUFLEET_NO_VAULT": "1", "GPUFLEET_SECRETS": "HF_TOKEN=ml-api-keys/huggingface#token"}, "sh", "-c", "echo ran")
    assert keys.returncode == 2 and "ran" not in keys.stdout and "GPUFLEET_SECRETS" in keys.stderr, "keys asked for, none would arrive"
    wrong = _exec({"GPUFLEET_NO_VAULT": "yes"}, "sh", "-c", "echo ran")
    assert wrong.returncode == 2 and "ran" not in wrong.stdout, wrong.stderr
