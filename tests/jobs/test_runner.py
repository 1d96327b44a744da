"""jobs.runner, the control plane's only view of the schedulers: the same calls and phases on
the Nomad double and the Kubernetes double, with real wrapped secret_ids from OpenBao."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from jobs.loader import find, load
from jobs.runner import GKE_PREFIX, GkeRunner, NomadRunner, Phase, RunNotFound, Runners, SchedulerUnavailable
from tests.jobs.nomad_double import NomadDouble
from tests.openbao_fixture import VaultHandle


def _vault_env(vault: VaultHandle) -> dict[str, str]:
    return {"VAULT_ADDR": vault.addr, "VAULT_TOKEN": vault.orchestrator.token}


@pytest.fixture
def runners(nomad: NomadDouble, k8s: Any, client_for: Callable[..., Any], k8s_client_for: Callable[..., Any], vault: VaultHandle) -> Runners:
    env = _vault_env(vault)
    return Runners(nomad=NomadRunner(client_for(nomad), env), gke=GkeRunner(k8s_client_for(k8s), env))


def test_nomad_run_through_the_neutral_interface(runners: Runners, nomad: NomadDouble) -> None:
    spec = load(find("finetune-llama"))
    meta = {"dataset_uri": "hf://datasets/demo/tiny@v1", "run_id": "r1"}
    run_id = runners.submit(spec, meta, idempotency_key="exp-1")
    assert run_id.startswith("finetune/finetune-llama/dispatch-")
    assert runners.submit(spec, meta, idempotency_key="exp-1") == run_id
    assert runners.status(run_id).phase == Phase.PENDING
    nomad.finish(run_id.split("/", 1)[1], client_status="running")
    report = runners.status(run_id)
    assert (report.phase, report.placed) == (Phase.RUNNING, True)
    nomad.finish(run_id.split("/", 1)[1], client_status="complete")
    assert runners.status(run_id).phase == Phase.SUCCEEDED
    with pytest.raises(RunNotFound):
        runners.status("finetune/finetune-llama/dispatch-0-nope")


def test_gke_run_through_the_neutral_interface(runners: Runners, k8s: Any) -> None:
    spec = load(find("finetune-llama-gke"))
    meta = {"dataset_uri": "gs://acme-data/chat/v3/", "run_id": "r1"}
    run_id = runners.submit(spec, meta, idempotency_key="exp-2")
    assert run_id.startswith(f"{GKE_PREFIX}research/finetune-llama-gke-")
    assert runners.submit(spec, meta, idempotency_key="exp-2") == run_id
    assert len([k for k in k8s.store.objects if k[0] == "jobs"]) == 1
    run = run_id.rsplit("/", 1)[1]
    report = runners.status(run_id)
    assert (report.phase, report.placed, report.exit_code) == (Phase.PENDING, False, None)
    k8s.admit("research", run, cluster_queue="research", flavor="h100")
    report = runners.status(run_id)
    assert (report.phase, report.placed) == (Phase.PENDING, True)  # admitted, ranks not ready yet: provisioning
    k8s.pods_ready("research", run, 2)
    report = runners.status(run_id)
    assert (report.phase, report.placed) == (Phase.RUNNING, True) and "ClusterQueue research" in report.detail
    k8s.fail("research", run, reason="PodFailurePolicy", message="Container train for pod research/x-1-abc failed with exit code 3 matching FailJob rule at index 0")
    report = runners.status(run_id)
    assert (report.phase, report.exit_code) == (Phase.FAILED, 3)


def test_gke_stop_then_gone(runners: Runners, k8s: Any) -> None:
    spec = load(find("finetune-llama-gke"))
    run_id = runners.submit(spec, {"dataset_uri": "gs://acme-data/chat/v3/", "run_id": "r2"}, idempotency_key="exp-3")
    k8s.admit("research", run_id.rsplit("/", 1)[1], cluster_queue="research", flavor="h100")
    runners.stop(run_id)
    assert runners.status(run_id).phase == Phase.STOPPED
    k8s.collect()
    with pytest.raises(RunNotFound):
        runners.status(run_id)
    runners.stop(run_id)  # already gone: nothing to do


def test_gke_succeeded_has_exit_code_zero_and_api_trouble_is_retryable(runners: Runners, k8s: Any) -> None:
    spec = load(find("finetune-llama-gke"))
    run_id = runners.submit(spec, {"dataset_uri": "gs://acme-data/chat/v3/", "run_id": "r3"}, idempotency_key="exp-4")
    run = run_id.rsplit("/", 1)[1]
    k8s.admit("research", run, cluster_queue="research", flavor="h100")
    k8s.succeed("research", run)
    assert (runners.status(run_id).phase, runners.status(run_id).exit_code) == (Phase.SUCCEEDED, 0)
    k8s.fail_next("GET", "/jobs/", 503, times=5)
    with pytest.raises(SchedulerUnavailable, match="Kubernetes answered 503"):
        runners.status(run_id)


def test_fails_when_no_runner_is_configured_for_the_scheduler() -> None:
    with pytest.raises(SchedulerUnavailable, match="no GKE runner is configured"):
        Runners().status(f"{GKE_PREFIX}ns/run")
