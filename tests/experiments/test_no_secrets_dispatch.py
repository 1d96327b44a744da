"""The control plane and a job without ``secrets:`` (issue 27): admitted, and its dispatch mints no
secret_id (real OpenBao counts them) and hands the scheduler no Vault meta; the local runner runs it
with no Vault at all. Real SQLite, the Nomad API double."""

from __future__ import annotations

import time
from pathlib import Path

from experiments.runner_local import LocalRunner
from experiments.services.catalog import Catalog
from tests.conftest import load_fleet
from tests.jobs.test_no_secrets import _secret_ids, without_secrets

META = {"dataset_uri": "hf://datasets/demo/tiny@v1", "run_id": "r1"}


def _catalog(tmp_path: Path) -> Catalog:
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "nokeys.yaml").write_text(without_secrets("finetune-llama", "nokeys"))
    return Catalog(jobs, configs=load_fleet())


def test_dispatch_of_a_job_without_secrets_mints_nothing(make_service, sqlite_url, nomad, nomad_runner, vault, tmp_path):
    svc = make_service(sqlite_url, nomad_runner, jobs=_catalog(tmp_path))
    mine = svc.token("finetune")
    answer = svc.submit(mine, job="nokeys", meta=META)
    assert answer.status_code == 202, answer.json()
    before = _secret_ids(vault)
    svc.step()
    (run,) = nomad.dispatched("nokeys")
    experiment = answer.json()["id"]
    assert nomad.state.jobs[("finetune", run)]["Meta"] == {**META, "gpufleet_cluster": "prod-nomad", "gpufleet_gpu_pool": "a100",
                                                          "gpufleet_experiment": experiment, "gpufleet_attempt": "1",
                                                          "gpufleet_run_deadline_seconds": "43200"}  # no deadline_hours: max_run_hours
    assert _secret_ids(vault) == before, "the control plane minted a secret_id for a job without secrets"
    shown = svc.client.get(f"/api/v1/experiments/{answer.json()['id']}", headers=mine).json()
    assert shown["status"] in ("queued", "provisioning") and shown["run_id"], shown


def test_local_runner_runs_a_job_without_secrets_with_no_vault(make_service, sqlite_url, tmp_path):
    """No VAULT_ADDR or VAULT_TOKEN for the service at all: the run still succeeds, nothing asks Vault."""
    runner = LocalRunner({})
    svc = make_service(sqlite_url, runner, jobs=_catalog(tmp_path))
    mine = svc.token("finetune")
    exp = svc.submit(mine, job="nokeys", meta=META).json()
    for _ in range(300):
        svc.step()
        shown = svc.client.get(f"/api/v1/experiments/{exp['id']}", headers=mine).json()
        if shown["status"] in ("succeeded", "failed", "cancelled", "expired"):
            break
        time.sleep(0.1)
    assert shown["status"] == "succeeded", shown
    lines = svc.client.get(f"/api/v1/experiments/{exp['id']}/logs", params={"stderr": "true"}, headers=mine).json()["lines"]
    assert any("job without secrets: no Vault login" in line for line in lines), lines
