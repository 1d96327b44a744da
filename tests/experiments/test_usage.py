"""GPU utilization per run, sampled inside the reconcile pass: over the Nomad double's
allocation stats and the Prometheus double's DCGM series; unknown (null) when the source is down,
never 0; and a bounded number of metrics calls a pass however many runs are tracked."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from experiments.background.context import Timing
from experiments.models import Experiment
from experiments.scheduler import ClusterRunners
from jobs.k8s.usage import PrometheusClient, PrometheusSettings
from jobs.runner import GkeRunner
from tests.jobs.nomad_double import Fault
from tests.jobs.prometheus_double import PrometheusDouble

META = {"dataset_uri": "hf://datasets/acme/chat@v3"}
GKE_META = {"dataset_uri": "gs://acme-data/chat/v3/"}


@pytest.fixture
def prometheus() -> Iterator[PrometheusDouble]:
    double = PrometheusDouble().start()
    yield double
    double.stop()


@pytest.fixture
def gke_with_metrics(k8s: Any, vault: Any, prometheus: PrometheusDouble) -> Iterator[ClusterRunners]:
    from jobs.k8s.client import K8sClient, K8sSettings

    client = K8sClient(K8sSettings(kubeconfig=str(k8s.kubeconfig_path), timeout_seconds=5.0, retries=1, backoff_seconds=0.01))
    metrics = PrometheusClient(PrometheusSettings(url=prometheus.url, timeout_seconds=2.0))
    yield ClusterRunners(gke=("prod-gke", GkeRunner(client, {"VAULT_ADDR": vault.addr, "VAULT_TOKEN": vault.orchestrator.token}, prometheus=metrics)))
    metrics.close()
    client.close()


def _running_nomad_run(svc: Any, nomad: Any, run: str) -> tuple[str, str, dict[str, str]]:
    headers = svc.token("finetune")
    exp = svc.submit(headers, meta={**META, "run_id": run}).json()
    svc.step()  # dispatched and placed
    job = svc.client.get(f"/api/v1/experiments/{exp['id']}", headers=headers).json()["run_id"].split("/", 1)[1]
    nomad.finish(job, client_status="running")
    return exp["id"], nomad.state.allocations[job][-1]["ID"], headers


def test_utilization_is_recorded_for_a_running_nomad_run(make_service, db_url, nomad, nomad_runner):
    svc = make_service(db_url, nomad_runner)
    exp_id, alloc, headers = _running_nomad_run(svc, nomad, "u1")
    nomad.gpu_stats[alloc] = [(80, 30_000), (60, 20_000)]
    svc.step()  # running; sampled in the same pass
    shown = svc.client.get(f"/api/v1/experiments/{exp_id}", headers=headers).json()
    assert shown["status"] == "running"
    assert shown["gpu_utilization"] == {"mean_pct": 70.0, "peak_pct": 70.0, "peak_memory_mib": 30000, "samples": 1,
                                        "last_sampled": shown["gpu_utilization"]["last_sampled"]}
    svc.step()  # within usage_seconds: not asked again
    assert len(nomad.calls("GET", "alloc-stats")) == 1
    nomad.gpu_stats[alloc] = [(100, 39_000), (100, 10_000)]
    svc.clock.advance(seconds=61)
    svc.step()
    series = svc.client.get(f"/api/v1/experiments/{exp_id[:8]}/usage", headers=headers).json()
    assert [p["util_mean_pct"] for p in series["series"]] == [70.0, 100.0]
    assert series["summary"]["mean_pct"] == 85.0 and series["summary"]["peak_pct"] == 100.0 and series["summary"]["peak_memory_mib"] == 39000
    assert svc.client.get(f"/api/v1/experiments/{exp_id}/usage", headers=svc.token("eval")).status_code == 404


def test_utilization_is_null_not_zero_when_the_stats_are_down_or_not_available(make_service, sqlite_url, nomad, nomad_runner):
    svc = make_service(sqlite_url, nomad_runner)
    exp_id, alloc, headers = _running_nomad_run(svc, nomad, "down")
    nomad.inject("GET", "alloc-stats", *[Fault(status=503)] * 3)  # past the client's retries
    svc.step()
    shown = svc.client.get(f"/api/v1/experiments/{exp_id}", headers=headers).json()
    assert shown["status"] == "running"
    assert shown["gpu_utilization"]["mean_pct"] is None and shown["gpu_utilization"]["peak_memory_mib"] is None
    assert shown["gpu_utilization"]["samples"] == 0
    assert "gpufleet_usage_errors_total 1.0" in svc.client.get("/metrics", headers=svc.token(None, admin=True)).text
    nomad.gpu_stats[alloc] = [(None, None)]  # NVML said N/A for both: unknown, not idle
    svc.clock.advance(seconds=61)
    svc.step()
    assert svc.client.get(f"/api/v1/experiments/{exp_id}", headers=headers).json()["gpu_utilization"]["mean_pct"] is None
    nomad.gpu_stats[alloc] = [(None, 1_000)]
    svc.clock.advance(seconds=61)
    svc.step()
    usage = svc.client.get(f"/api/v1/experiments/{exp_id}", headers=headers).json()["gpu_utilization"]
    assert (usage["mean_pct"], usage["peak_memory_mib"]) == (None, 1000)


def test_exp_show_prints_unknown_not_zero(make_service, sqlite_url, nomad, nomad_runner, capsys):
    from gpufleet.exp_cmd import _detail, console

    svc = make_service(sqlite_url, nomad_runner)
    exp_id, _alloc, headers = _running_nomad_run(svc, nomad, "cli")
    svc.step()  # no device stats in the double for it: unknown
    with console.capture() as captured:
        console.print(_detail(svc.client.get(f"/api/v1/experiments/{exp_id}", headers=headers).json()))
    text = captured.get()
    assert "mean unknown, peak unknown" in text and "0%" not in text


def test_gke_utilization_comes_from_one_prometheus_query_a_pass(make_service, sqlite_url, k8s, gke_with_metrics, prometheus):
    svc = make_service(sqlite_url, gke_with_metrics)
    headers = svc.token("research")
    exp_id = svc.client.post("/api/v1/experiments", json={"job": "finetune-llama-gke", "meta": {**GKE_META, "run_id": "g1"}}, headers=headers).json()["id"]
    svc.step()
    run = svc.client.get(f"/api/v1/experiments/{exp_id}", headers=headers).json()["run_id"].rsplit("/", 1)[1]
    k8s.admit("research", run, cluster_queue="research", flavor="h100")
    k8s.pods_ready("research", run, 2)
    prometheus.down = True
    svc.step()  # running; the metrics source is down: unknown
    shown = svc.client.get(f"/api/v1/experiments/{exp_id}", headers=headers).json()
    assert shown["status"] == "running" and len(prometheus.queries) == 1
    assert shown["gpu_utilization"]["mean_pct"] is None and shown["gpu_utilization"]["peak_memory_mib"] is None
    prometheus.down = False
    for rank in range(2):  # two pods (ranks) of 8 H100s each; one of another workload in the namespace
        for gpu in range(8):
            prometheus.gpu(namespace="research", pod=f"{run}-{rank}-x{gpu}q", gpu=gpu, util=90.0 if rank == 0 else 50.0, fb_used_mib=60_000 + gpu)
    prometheus.gpu(namespace="research", pod="someone-else-0-abcde", gpu=0, util=1.0, fb_used_mib=1.0)
    svc.clock.advance(seconds=61)
    svc.step()
    assert len(prometheus.queries) == 2 and 'exported_namespace=~"research"' in prometheus.queries[-1]
    usage = svc.client.get(f"/api/v1/experiments/{exp_id}/usage", headers=headers).json()["summary"]
    assert (usage["mean_pct"], usage["peak_pct"], usage["peak_memory_mib"], usage["samples"]) == (70.0, 70.0, 60007, 1)


def _row(run_id: str, now: Any) -> Experiment:
    return Experiment(id=str(uuid.uuid4()), tenant="finetune", job="finetune-llama", cluster="prod-nomad", pool="a100", gpus=1, meta=META,
                      state="running", scheduler="nomad", run_id=run_id, submitted_by="test", request_hash="-", deadline_hours=12,
                      price_per_gpu_hour=2.93, price_kind="list", created_at=now, updated_at=now, running_at=now, queued_at=now, reconciled_at=now)


def _seed_running(svc: Any, nomad: Any, count: int) -> None:
    """``count`` running Nomad runs, straight into the database and the double (dispatching 200
    through Vault would test dispatch, not sampling)."""
    namespace, now = "finetune", svc.clock()
    with svc.ctx.sessions() as session, session.begin():
        for i in range(count):
            job_id = f"finetune-llama/dispatch-seed-{i:04d}"
            nomad.state.jobs[(namespace, job_id)] = {"ID": job_id, "ParentID": "finetune-llama", "Status": "running", "Namespace": namespace}
            nomad.state.allocations[job_id] = [{"ID": f"alloc-seed-{i:04d}", "JobID": job_id, "Namespace": namespace, "TaskGroup": "train",
                                                "ClientStatus": "running", "DesiredStatus": "run", "NodeName": "a100-0", "CreateIndex": 1, "ModifyIndex": 1,
                                                "TaskStates": {"train": {"State": "running", "Events": []}}}]
            nomad.gpu_stats[f"alloc-seed-{i:04d}"] = [(i % 100, 1000 + i)]
            session.add(_row(f"{namespace}/{job_id}", now))


def test_a_pass_over_200_running_runs_asks_for_a_bounded_rotating_set_of_stats(make_service, sqlite_url, nomad, nomad_runner):
    from sqlalchemy import func, select

    from experiments.models import RunUsage

    svc = make_service(sqlite_url, nomad_runner, timing=Timing(usage_nomad_per_pass=25, usage_budget=1000.0))  # the count bound alone
    _seed_running(svc, nomad, 200)
    per_pass = []
    for _ in range(8):
        before = len(nomad.calls("GET", "alloc-stats"))
        svc.step()
        per_pass.append(len(nomad.calls("GET", "alloc-stats")) - before)
    assert per_pass == [25] * 8  # never one GET per run per pass
    asked = [r.path for r in nomad.calls("GET", "alloc-stats")]
    assert len(set(asked)) == 200  # the rotation reached every run once
    with svc.ctx.sessions() as session:
        assert session.scalar(select(func.count(func.distinct(RunUsage.experiment_id)))) == 200
    svc.step()
    assert len(nomad.calls("GET", "alloc-stats")) == 200  # all sampled within usage_seconds: none due


def test_a_long_series_is_halved_and_keeps_its_mean_and_peaks(make_service, sqlite_url, nomad_runner):
    from datetime import timedelta

    from experiments.services import usage as run_usage
    from jobs.usage import Usage

    svc = make_service(sqlite_url, nomad_runner)
    row = _row("finetune/finetune-llama/dispatch-long", svc.clock())
    exp_id = row.id
    with svc.ctx.sessions() as session, session.begin():
        session.add(row)
    start = svc.clock()
    for i in range(run_usage.MAX_POINTS + 1):
        with svc.ctx.sessions() as session, session.begin():
            run_usage.record(session, {exp_id: Usage(float(i % 10) * 10, 100.0 + i, 1)}, now=start + timedelta(minutes=i))
    with svc.ctx.sessions() as session:
        points = run_usage.series(session, exp_id)
    assert len(points) == (run_usage.MAX_POINTS + 2) // 2
    summary = run_usage.summarize(points)
    expected_mean = sum((i % 10) * 10 for i in range(run_usage.MAX_POINTS + 1)) / (run_usage.MAX_POINTS + 1)
    assert summary["samples"] == run_usage.MAX_POINTS + 1 and summary["mean_pct"] == round(expected_mean, 1)
    assert (summary["peak_pct"], summary["peak_memory_mib"]) == (90.0, 100 + run_usage.MAX_POINTS)


def test_the_time_budget_holds_a_pass_to_one_chunk_of_stats_when_they_are_slow(make_service, sqlite_url, nomad, nomad_runner):
    from experiments.background.usage import CHUNK

    svc = make_service(sqlite_url, nomad_runner, timing=Timing(usage_nomad_per_pass=25, usage_budget=0.0))
    _seed_running(svc, nomad, 200)
    for passes in range(1, 4):
        svc.step()
        assert len(nomad.calls("GET", "alloc-stats")) == CHUNK * passes


def test_a_namespace_with_a_dash_makes_a_query_prometheus_parses():
    from jobs.k8s.usage import parse, query_for
    from tests.jobs.prometheus_double import dcgm_gpu, select

    settings = PrometheusSettings(url="http://unused")
    series = dcgm_gpu(namespace="team-a", pod="run-x-0-abcde", gpu=0, util=40.0, fb_used_mib=100.0)
    result = select(query_for(settings, ["team-a", "research"]), series)  # ValueError: what Prometheus answers 400 for
    answer = {"status": "success", "data": {"resultType": "vector", "result": result}}
    assert parse(answer, settings, {"team-a": ["run-x"]})[("team-a", "run-x")].util_pct == 40.0


def test_an_infinite_sample_is_unknown_not_a_value_the_api_cannot_answer():
    """Prometheus writes sample values with strconv.FormatFloat (web/api/v1 marshalling: "NaN",
    "+Inf", "-Inf" as strings). An infinite utilization stored as a number made every JSON answer
    about the run a 500 (JSON has no Infinity); it is unknown, as NaN is."""
    from jobs.k8s.usage import parse

    settings = PrometheusSettings(url="http://unused")
    metric = {"exported_namespace": "team-a", "exported_pod": "run-x-0-abcde", "gpu": "0"}
    answer = {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", **metric}, "value": [1733300000.0, "+Inf"]},
        {"metric": {"__name__": "DCGM_FI_DEV_FB_USED", **metric}, "value": [1733300000.0, "-Inf"]}]}}
    assert parse(answer, settings, {"team-a": ["run-x"]}) == {}
