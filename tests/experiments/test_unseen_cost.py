"""Cost when the reconciler missed a state (issue 25): a run that went from queued to its end between
two passes was never seen placed, and was recorded with 0 GPU-hours and 0 USD although it held GPUs.
Its GPU time now comes from the scheduler's own clock, in the fields upstream writes (the doubles'
``stamp_times`` say which), on real SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from experiments.background.dispatch import process_outbox

GKE_NS, GKE_JOB = "research", "finetune-llama-gke"


def _shown(svc, exp_id, headers):
    return svc.client.get(f"/api/v1/experiments/{exp_id}", headers=headers).json()


def _events(svc, exp_id, headers):
    return svc.client.get(f"/api/v1/experiments/{exp_id}/events", headers=headers).json()["events"]


def test_a_nomad_run_that_ended_unseen_is_costed_from_its_allocation_times(make_service, db_url, nomad, nomad_runner):
    svc = make_service(db_url, nomad_runner)
    headers = svc.token("finetune")
    exp = svc.submit(headers).json()
    assert process_outbox(svc.ctx) == 1 and _shown(svc, exp["id"], headers)["status"] == "queued"  # dispatched, never reconciled
    start = svc.clock.now
    placed, started, finished = start + timedelta(seconds=10), start + timedelta(seconds=40), start + timedelta(seconds=10, minutes=3)
    (job_id,) = nomad.dispatched("finetune-llama")
    nomad.finish(job_id, client_status="complete", events=[{"Type": "Terminated", "Time": 1, "ExitCode": 0}])
    nomad.stamp_times(job_id, placed, started, finished)
    svc.clock.advance(minutes=4)
    svc.step()
    done = _shown(svc, exp["id"], headers)
    assert done["status"] == "succeeded"
    # placed (CreateTime) -> the task's FinishedAt: 3 minutes on 1 GPU, not 0.
    assert done["gpu_hours"] == pytest.approx(3 / 60, abs=1e-4) and done["estimated_cost_usd"] == pytest.approx(3 / 60 * done["price_per_gpu_hour"], abs=1e-4)
    assert done["timestamps"]["provisioning"] == f"{placed:%Y-%m-%dT%H:%M:%S}Z" and done["timestamps"]["finished"] == f"{finished:%Y-%m-%dT%H:%M:%S}Z"
    assert any(e["kind"] == "cost" and "scheduler's own timestamps" in e["message"] for e in _events(svc, exp["id"], headers))


def test_a_gke_run_that_ended_unseen_is_costed_from_its_job_times(make_service, db_url, k8s, fleet_runner):
    svc = make_service(db_url, fleet_runner)
    headers = svc.token(GKE_NS)
    exp = svc.client.post("/api/v1/experiments", json={"job": GKE_JOB, "meta": {"dataset_uri": "gs://acme-data/chat/v3/", "run_id": "r1"}},
                          headers=headers).json()
    svc.step()
    shown = _shown(svc, exp["id"], headers)
    assert shown["status"] == "queued"
    run = shown["run_id"].rsplit("/", 1)[1]
    start: datetime = svc.clock.now
    k8s.admit(GKE_NS, run, cluster_queue=GKE_NS, flavor="h100")
    k8s.succeed(GKE_NS, run)
    k8s.stamp_times(GKE_NS, run, start=f"{start + timedelta(seconds=30):%Y-%m-%dT%H:%M:%SZ}",
                    completion=f"{start + timedelta(seconds=30, minutes=2):%Y-%m-%dT%H:%M:%SZ}")
    svc.clock.advance(minutes=3)
    svc.step()
    done = _shown(svc, exp["id"], headers)
    assert done["status"] == "succeeded"
    # status.startTime -> status.completionTime: 2 minutes on 2 nodes x 8 H100.
    assert done["gpu_hours"] == pytest.approx(2 / 60 * 16, abs=1e-4) and done["estimated_cost_usd"] > 0
    assert any(e["kind"] == "cost" for e in _events(svc, exp["id"], headers))


def test_a_run_seen_placed_keeps_the_reconcilers_own_times(make_service, sqlite_url, nomad, nomad_runner):
    """The scheduler's clock is used only where gpufleet saw no start: a run followed pass by pass is unchanged."""
    svc = make_service(sqlite_url, nomad_runner)
    headers = svc.token("finetune")
    exp = svc.submit(headers).json()
    svc.step()
    assert _shown(svc, exp["id"], headers)["status"] == "provisioning"
    (job_id,) = nomad.dispatched("finetune-llama")
    start = svc.clock.now
    svc.clock.advance(minutes=3)
    nomad.finish(job_id, client_status="complete", events=[{"Type": "Terminated", "Time": 1, "ExitCode": 0}])
    nomad.stamp_times(job_id, start - timedelta(hours=1), start, start + timedelta(minutes=1))
    svc.step()
    done = _shown(svc, exp["id"], headers)
    assert done["status"] == "succeeded" and done["gpu_hours"] == pytest.approx(3 / 60, abs=1e-4)
    assert not any(e["kind"] == "cost" for e in _events(svc, exp["id"], headers))
