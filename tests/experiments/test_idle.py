"""Idle and hung runs stop on the admin's terms (issue 25), over the Nomad API double (and the
Kubernetes and Prometheus doubles for GKE) with a clock
the test moves: a run with no new log output for the window, or with every GPU below the threshold
for the window, gets a warning event, then ends ``idle`` with the evidence at the next pass and is
stopped on Nomad. A run whose mean is low but one GPU works, a run that prints, and a run whose
utilization nobody can measure are left running (the last with one event saying so).

Policy: prod-nomad's example file, tenant finetune: below 5% for 30 min, or no logs for 60 min."""

from __future__ import annotations

from typing import Any

from experiments.background.idle import CLEARED, UNKNOWN_UTIL, WARNING
from experiments.models import Event
from tests.experiments.test_usage import GKE_META, gke_with_metrics, prometheus  # noqa: F401 - fixtures

META = {"dataset_uri": "hf://datasets/acme/chat@v3"}


def _running(svc: Any, nomad: Any, run: str) -> tuple[str, str, str]:
    """A running finetune-llama run whose task has started: (experiment id, Nomad job id, allocation id)."""
    answer = svc.submit(svc.token("finetune"), meta={**META, "run_id": run})
    assert answer.status_code == 202, answer.text
    svc.step()
    exp_id = answer.json()["id"]
    job = svc.client.get(f"/api/v1/experiments/{exp_id}", headers=svc.token("finetune")).json()["run_id"].split("/", 1)[1]
    return exp_id, job, nomad.start_task(job)


def _kinds(svc: Any, exp_id: str) -> list[str]:
    with svc.ctx.sessions() as session:
        return [e.kind for e in session.query(Event).filter(Event.experiment_id == exp_id).order_by(Event.id)]


def _shown(svc: Any, exp_id: str) -> dict[str, Any]:
    return svc.client.get(f"/api/v1/experiments/{exp_id}", headers=svc.token(None, admin=True)).json()


def _stopped_on_nomad(nomad: Any, job: str) -> bool:
    return any(job in c.path or job.replace("/", "%2F") in c.path for c in nomad.calls("DELETE", "job"))


def test_a_hung_run_without_log_output_for_an_hour_ends_idle_after_a_warning(make_service, db_url, nomad, nomad_runner):
    svc = make_service(db_url, nomad_runner)
    hung, hung_job, hung_alloc = _running(svc, nomad, "hung")
    busy, busy_job, busy_alloc = _running(svc, nomad, "busy")
    for alloc in (hung_alloc, busy_alloc):
        nomad.write_log(alloc, "step 1 loss 2.31\n")
        nomad.gpu_stats[alloc] = [(95, 30_000)]  # the GPUs look busy: only the log signal can fire
    svc.clock.advance(minutes=5)
    svc.step()  # the tails kept with that line (a capture is due every 5 min): it changed at 08:05
    assert _shown(svc, hung)["status"] == "running"
    for minutes in (30, 31):
        svc.clock.advance(minutes=minutes)
        nomad.write_log(busy_alloc, f"step at +{minutes} min\n")
        svc.step()
    assert _kinds(svc, hung).count(WARNING) == 1 and _shown(svc, hung)["status"] == "running", "a warning comes one pass before the stop"
    svc.clock.advance(minutes=1)
    nomad.write_log(busy_alloc, "step at +67 min\n")
    svc.step()
    shown = _shown(svc, hung)
    assert shown["status"] == "idle", shown
    assert shown["reason"].startswith("idle: no log output on any rank since 2026-12-03 08:05Z (62 min to the capture at 2026-12-03 09:07Z)")
    assert "stopped on the scheduler by the idle policy of cluster prod-nomad for tenant finetune" in shown["reason"]
    assert _stopped_on_nomad(nomad, hung_job)
    events = svc.client.get(f"/api/v1/experiments/{hung}/events", headers=svc.token(None, admin=True)).json()["events"]
    assert [e["kind"] for e in events][-2:] == [WARNING, "state"] and events[-1]["to"] == "idle" and events[-1]["actor"] == "idle-policy"
    assert _shown(svc, busy)["status"] == "running" and WARNING not in _kinds(svc, busy) and not _stopped_on_nomad(nomad, busy_job)
    assert svc.client.get("/api/v1/experiments?status=idle", headers=svc.token(None, admin=True)).json()["total"] == 1


def test_a_run_below_5_percent_on_every_gpu_for_30_minutes_ends_idle_after_the_warning_pass(make_service, db_url, nomad, nomad_runner):
    svc = make_service(db_url, nomad_runner)
    idle, idle_job, idle_alloc = _running(svc, nomad, "low")
    one_busy, _, one_busy_alloc = _running(svc, nomad, "one-busy")
    nomad.gpu_stats[idle_alloc] = [(1, 20_000), (3, 20_000)]
    nomad.gpu_stats[one_busy_alloc] = [(0, 20_000)] * 7 + [(30, 20_000)]  # mean 3.75%, but one GPU works: not idle
    for minutes in (5, 10, 10, 11):  # samples at 08:05 (the first with stats), 08:15, 08:25, 08:36: no gap of half a window
        svc.clock.advance(minutes=minutes)
        for alloc in (idle_alloc, one_busy_alloc):
            nomad.write_log(alloc, f"step at +{minutes} min\n")  # both print: only the utilization signal can fire
        svc.step()
    assert _kinds(svc, idle).count(WARNING) == 1 and _shown(svc, idle)["status"] == "running"
    svc.clock.advance(minutes=1)
    nomad.write_log(idle_alloc, "still printing\n")
    svc.step()
    shown = _shown(svc, idle)
    assert shown["status"] == "idle", shown
    assert shown["reason"].startswith("idle: GPU utilization below 5% on every GPU since 2026-12-03 08:05Z (32 min to the last sample at 2026-12-03 08:37Z;")
    assert "busiest GPU 3.0%" in shown["reason"]
    assert _stopped_on_nomad(nomad, idle_job)
    assert _shown(svc, one_busy)["status"] == "running" and WARNING not in _kinds(svc, one_busy)


def test_unknown_utilization_does_not_fire_and_says_so_once(make_service, sqlite_url, nomad, nomad_runner):
    svc = make_service(sqlite_url, nomad_runner)
    exp_id, job, alloc = _running(svc, nomad, "unmeasured")  # no GPU stats: utilization unknown
    for minutes in (0, 31, 1, 1):
        svc.clock.advance(minutes=minutes)
        nomad.write_log(alloc, f"step at +{minutes} min\n")
        svc.step()
    assert _shown(svc, exp_id)["status"] == "running"
    kinds = _kinds(svc, exp_id)
    assert kinds.count(UNKNOWN_UTIL) == 1 and WARNING not in kinds, kinds
    with svc.ctx.sessions() as session:
        note = session.query(Event).filter(Event.experiment_id == exp_id, Event.kind == UNKNOWN_UTIL).one().message
    assert note.startswith("idle policy: GPU utilization of this run is unknown") and "does not fire" in note
    assert not _stopped_on_nomad(nomad, job)


def test_a_warned_run_that_prints_again_is_not_stopped(make_service, sqlite_url, nomad, nomad_runner):
    svc = make_service(sqlite_url, nomad_runner)
    exp_id, job, alloc = _running(svc, nomad, "slow")
    nomad.write_log(alloc, "loading shards\n")
    nomad.gpu_stats[alloc] = [(95, 30_000)]
    svc.clock.advance(minutes=5)
    svc.step()
    svc.clock.advance(minutes=61)
    svc.step()
    assert WARNING in _kinds(svc, exp_id)
    svc.clock.advance(minutes=1)
    nomad.write_log(alloc, "step 1\n")  # printed after the last capture: the read before the stop sees it
    svc.step()
    assert _shown(svc, exp_id)["status"] == "running" and _kinds(svc, exp_id)[-1] == CLEARED
    assert not _stopped_on_nomad(nomad, job)


def test_a_two_rank_gke_run_idle_on_all_16_gpus_ends_idle_and_its_job_is_deleted(make_service, sqlite_url, k8s, gke_with_metrics, prometheus):
    """GKE: DCGM utilization from the Prometheus double (one query a pass); prod-gke has the default policy."""
    svc = make_service(sqlite_url, gke_with_metrics)
    headers = svc.token("research")
    exp_id = svc.client.post("/api/v1/experiments", json={"job": "finetune-llama-gke", "meta": {**GKE_META, "run_id": "g1"}}, headers=headers).json()["id"]
    svc.step()
    run = svc.client.get(f"/api/v1/experiments/{exp_id}", headers=headers).json()["run_id"].rsplit("/", 1)[1]
    k8s.admit("research", run, cluster_queue="research", flavor="h100")
    k8s.pods_ready("research", run, 2)
    for rank in range(2):
        for gpu in range(8):
            prometheus.gpu(namespace="research", pod=f"{run}-{rank}-x{gpu}q", gpu=gpu, util=4.0 if (rank, gpu) == (1, 7) else 0.0, fb_used_mib=1_000)
    for minutes in (0, 5, 10, 10, 11):  # running at 08:00; samples 08:00, 08:05, 08:15, 08:25, 08:36
        svc.clock.advance(minutes=minutes)
        svc.step()
    assert _kinds(svc, exp_id).count(WARNING) == 1 and _shown(svc, exp_id)["status"] == "running"
    svc.clock.advance(minutes=1)
    svc.step()
    shown = _shown(svc, exp_id)
    assert shown["status"] == "idle", shown
    assert shown["reason"].startswith("idle: GPU utilization below 5% on every GPU since 2026-12-03 08:0") and "busiest GPU 4.0%" in shown["reason"]
    assert [r for r in k8s.requests if r.method == "DELETE" and r.path.endswith(f"/jobs/{run}")], "the Job must be deleted"


def test_a_gke_run_whose_second_rank_has_no_dcgm_series_is_not_stopped_for_low_utilization(make_service, sqlite_url, k8s, gke_with_metrics,
                                                                                           prometheus):
    """Rank 1's node exports no DCGM series (exporter down, node not scraped): its 8 GPUs are unknown,
    so "every GPU below 5%" cannot be said from rank 0's 8 idle GPUs alone. Unknown is not idle."""
    svc = make_service(sqlite_url, gke_with_metrics)
    headers = svc.token("research")
    exp_id = svc.client.post("/api/v1/experiments", json={"job": "finetune-llama-gke", "meta": {**GKE_META, "run_id": "g2"}}, headers=headers).json()["id"]
    svc.step()
    run = svc.client.get(f"/api/v1/experiments/{exp_id}", headers=headers).json()["run_id"].rsplit("/", 1)[1]
    k8s.admit("research", run, cluster_queue="research", flavor="h100")
    k8s.pods_ready("research", run, 2)
    for gpu in range(8):
        prometheus.gpu(namespace="research", pod=f"{run}-0-x{gpu}q", gpu=gpu, util=0.0, fb_used_mib=1_000)
    for minutes in (0, 5, 10, 10, 11, 1, 1):
        svc.clock.advance(minutes=minutes)
        svc.step()
    from experiments.models import RunUsage as _RU
    with svc.ctx.sessions() as s:
        print("ROWS", [(r.at, r.samples, r.util_max_pct) for r in s.query(_RU).filter(_RU.experiment_id == exp_id).order_by(_RU.at)])
        print("EV", [(e.kind, e.message[:150]) for e in s.query(Event).filter(Event.experiment_id == exp_id)])
    assert _shown(svc, exp_id)["status"] == "running" and WARNING not in _kinds(svc, exp_id), _kinds(svc, exp_id)
    assert not [r for r in k8s.requests if r.method == "DELETE" and r.path.endswith(f"/jobs/{run}")]


def test_a_sample_with_one_gpu_reporting_no_utilization_has_no_busiest_gpu():
    """Nomad's device plugin may report a GPU's utilization as "N/A": the busiest GPU of that sample is
    unknown (the unreported one may be the busy one), not the max of the others."""
    from jobs.usage import combine

    assert combine([(0.0, 1_000.0), (None, 1_000.0)]).util_max_pct is None
    assert combine([(0.0, 1_000.0), (2.0, 1_000.0)]).util_max_pct == 2.0


def test_a_metrics_outage_breaks_the_low_utilization_streak(make_service, sqlite_url, k8s, gke_with_metrics, prometheus):
    """A GKE run reads idle at its start (loading), then Prometheus is down for two hours (nobody knows
    how busy it was), then it reads idle again for two minutes (a checkpoint save). The two hours
    nobody measured are not "below 5% on every GPU": the streak starts after the outage, so the run is
    neither warned nor stopped."""
    svc = make_service(sqlite_url, gke_with_metrics)
    headers = svc.token("research")
    exp_id = svc.client.post("/api/v1/experiments", json={"job": "finetune-llama-gke", "meta": {**GKE_META, "run_id": "g3"}}, headers=headers).json()["id"]
    svc.step()
    run = svc.client.get(f"/api/v1/experiments/{exp_id}", headers=headers).json()["run_id"].rsplit("/", 1)[1]
    k8s.admit("research", run, cluster_queue="research", flavor="h100")
    k8s.pods_ready("research", run, 2)
    for rank in range(2):
        for gpu in range(8):
            prometheus.gpu(namespace="research", pod=f"{run}-{rank}-x{gpu}q", gpu=gpu, util=0.0, fb_used_mib=1_000)
    svc.step()  # 08:00: a low sample
    prometheus.down = True
    for step in range(8):  # 08:15 .. 10:00: the source is down, no sample; the run prints (only utilization can fire)
        svc.clock.advance(minutes=15)
        k8s.write_pod_log("research", run, 0, f"step {step}\n")
        svc.step()
    prometheus.down = False
    for minutes in (0, 1, 1):  # 10:00, 10:01, 10:02: low again
        svc.clock.advance(minutes=minutes)
        svc.step()
    assert _shown(svc, exp_id)["status"] == "running" and WARNING not in _kinds(svc, exp_id), _kinds(svc, exp_id)
