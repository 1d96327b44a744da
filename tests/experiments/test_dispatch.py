"""Dispatcher, reconciler and reaper against the Nomad API double and a real OpenBao.

Exactly once is checked where Nomad would see it: the number of dispatched child jobs of the
parent in the double, and the idempotency token (the experiment id) on every dispatch call.
"""

from __future__ import annotations

import pytest

from experiments.background.context import Timing
from experiments.background.dispatch import process_outbox
from jobs.runner import NomadRunner
from tests.jobs.nomad_double import Fault

PARENT = "finetune-llama"


def _dispatch_tokens(nomad):
    return [call.query["idempotency_token"][0] for call in nomad.calls("POST", "dispatch")]


def _state(svc, exp_id, headers):
    return svc.client.get(f"/api/v1/experiments/{exp_id}", headers=headers).json()


def running_on_nomad(svc, nomad, headers, **submit) -> tuple[dict, str]:
    """Submit, dispatch and let the Nomad double report the run running: (the experiment, its Nomad job id)."""
    exp = svc.submit(headers, **submit).json()
    svc.step()
    job_id = nomad.dispatched(PARENT)[-1]
    nomad.finish(job_id, client_status="running")
    svc.step()
    assert _state(svc, exp["id"], headers)["status"] == "running"
    return exp, job_id


def test_an_experiment_runs_to_succeeded_with_exit_code_and_cost(make_service, sqlite_url, nomad, nomad_runner):
    svc = make_service(sqlite_url, nomad_runner)
    headers = svc.token("finetune")
    exp = svc.submit(headers).json()
    svc.step()
    assert nomad.dispatched(PARENT) and _dispatch_tokens(nomad) == [exp["id"]]
    shown = _state(svc, exp["id"], headers)
    assert shown["status"] == "provisioning" and shown["run_id"] == f"finetune/{nomad.dispatched(PARENT)[0]}"
    job_id = nomad.dispatched(PARENT)[0]
    nomad.finish(job_id, client_status="running")
    svc.clock.advance(minutes=30)
    svc.step()
    assert _state(svc, exp["id"], headers)["status"] == "running"
    svc.clock.advance(minutes=90)
    nomad.finish(job_id, client_status="complete", events=[{"Type": "Terminated", "Time": 2, "ExitCode": 0, "Details": {"exit_code": "0"}}])
    svc.step()
    done = _state(svc, exp["id"], headers)
    assert done["status"] == "succeeded" and done["exit_code"] == 0
    # Placed at dispatch (provisioning), ended 2 h later: 1 GPU x 2 h at the list price of an A100 40GB.
    assert done["gpu_hours"] == 2.0 and done["estimated_cost_usd"] == round(2.0 * done["price_per_gpu_hour"], 4) and done["price_kind"] == "list"
    states = [e["to"] for e in svc.client.get(f"/api/v1/experiments/{exp['id']}/events", headers=headers).json()["events"] if e["kind"] == "state"]
    assert states == ["dispatching", "queued", "provisioning", "running", "succeeded"]
    # Nomad garbage-collects the finished job; the database is the record.
    del nomad.state.jobs[("finetune", job_id)]
    svc.step()
    assert _state(svc, exp["id"], headers)["status"] == "succeeded"
    costs = svc.client.get("/api/v1/costs", headers=headers).json()
    assert costs["by_tenant"]["finetune"]["gpu_hours"] == 2.0 and costs["by_job"]["finetune/finetune-llama"]["gpu_hours"] == 2.0


def test_a_failed_run_records_the_reason_and_exit_code(make_service, sqlite_url, nomad, nomad_runner):
    svc = make_service(sqlite_url, nomad_runner)
    headers = svc.token("finetune")
    exp = svc.submit(headers).json()
    svc.step()
    event = {"Type": "Terminated", "Time": 3, "ExitCode": 137, "DisplayMessage": "OOM Killed", "Details": {"exit_code": "137", "oom_killed": "true"}}
    nomad.finish(nomad.dispatched(PARENT)[0], client_status="failed", failed=True, events=[event])
    svc.step()
    shown = _state(svc, exp["id"], headers)
    assert shown["status"] == "failed" and shown["exit_code"] == 137 and shown["reason"].startswith("OOM killed")


def test_exactly_once_when_the_process_dies_between_accept_and_dispatch(make_service, db_url, nomad, nomad_runner):
    first = make_service(db_url, nomad_runner)
    headers = first.token("finetune")
    exp = first.submit(headers).json()
    first.close()  # accepted and committed, never dispatched: the process is gone
    second = make_service(db_url, nomad_runner, clock=first.clock)
    second.step()
    second.step()
    assert len(nomad.dispatched(PARENT)) == 1 and _dispatch_tokens(nomad) == [exp["id"]]
    assert _state(second, exp["id"], headers)["status"] == "provisioning"


class Crash(BaseException):
    """The process dying: not an Exception, so nothing in the dispatcher handles it."""


class CrashAfterSubmit:
    """The real runner (Nomad, or the cluster-bound one), then death before the dispatcher can record the run id."""

    def __init__(self, runner: NomadRunner) -> None:
        self.runner, self.scheduler = runner, runner.scheduler
        if hasattr(runner, "clusters"):
            self.clusters = runner.clusters

    def submit(self, job, meta, *, idempotency_key, attempt=1):
        self.runner.submit(job, meta, idempotency_key=idempotency_key, attempt=attempt)
        raise Crash()

    def status(self, run_id):
        return self.runner.status(run_id)

    def stop(self, run_id):
        return self.runner.stop(run_id)

    def find(self, job, key):
        return self.runner.find(job, key)

    def __getattr__(self, name):
        return getattr(self.runner, name)  # a cluster-bound runner's binding state (clusters, blocked, members...)


def test_exactly_once_when_the_process_dies_after_nomad_accepted_the_dispatch(make_service, db_url, nomad, nomad_runner):
    doomed = make_service(db_url, CrashAfterSubmit(nomad_runner))
    headers = doomed.token("finetune")
    exp = doomed.submit(headers).json()
    with pytest.raises(Crash):
        process_outbox(doomed.ctx)
    doomed.close()
    restarted = make_service(db_url, nomad_runner, clock=doomed.clock)
    restarted.step()
    assert _state(restarted, exp["id"], headers)["status"] == "dispatching"  # the dead dispatcher's lease still holds
    restarted.clock.advance(seconds=Timing().dispatch_lease_seconds + 1)
    restarted.step()
    shown = _state(restarted, exp["id"], headers)
    # The restarted service finds the dead one's run and records it: one submit, one secret_id minted.
    assert len(nomad.dispatched(PARENT)) == 1 and _dispatch_tokens(nomad) == [exp["id"]]
    assert shown["status"] == "provisioning" and shown["run_id"] == f"finetune/{nomad.dispatched(PARENT)[0]}"


def test_exactly_once_when_nomad_answers_503_then_times_out(make_service, sqlite_url, nomad, nomad_runner):
    svc = make_service(sqlite_url, nomad_runner)
    headers = svc.token("finetune")
    exp = svc.submit(headers).json()
    nomad.inject("POST", "dispatch", *[Fault(status=503)] * 3)  # more than the client's 2 retries
    svc.step()
    shown = _state(svc, exp["id"], headers)
    assert shown["status"] == "dispatching" and "503" in shown["reason"] and not nomad.dispatched(PARENT)
    # The next attempt's answer is lost after Nomad acted on it: the client retries with the same token.
    nomad.inject("POST", "dispatch", Fault(delay_seconds=3.0))
    svc.clock.advance(seconds=5)
    svc.step()
    assert len(nomad.dispatched(PARENT)) == 1 and set(_dispatch_tokens(nomad)) == {exp["id"]}
    assert _state(svc, exp["id"], headers)["status"] == "provisioning"
    metrics = svc.client.get("/metrics", headers=svc.token(None, admin=True)).text
    assert "gpufleet_dispatch_errors_total 1.0" in metrics and 'gpufleet_experiments{state="provisioning"} 1.0' in metrics


def test_a_stuck_dispatch_fails_with_the_last_error_instead_of_waiting_forever(make_service, sqlite_url, nomad, nomad_runner):
    svc = make_service(sqlite_url, nomad_runner, timing=Timing(dispatch_stuck_seconds=600))
    headers = svc.token("finetune")
    exp = svc.submit(headers).json()
    nomad.inject("POST", "dispatch", *[Fault(status=503)] * 6)
    svc.step()
    svc.clock.advance(seconds=601)
    svc.step()
    shown = _state(svc, exp["id"], headers)
    assert shown["status"] == "failed" and "not dispatched within 600s" in shown["reason"] and "503" in shown["reason"]


def test_a_restart_mid_run_loses_nothing(make_service, db_url, nomad, nomad_runner):
    before = make_service(db_url, nomad_runner)
    headers = before.token("finetune")
    exp = before.submit(headers).json()
    before.step()
    job_id = nomad.dispatched(PARENT)[0]
    nomad.finish(job_id, client_status="running")
    before.step()
    events_before = before.client.get(f"/api/v1/experiments/{exp['id']}/events", headers=headers).json()["events"]
    before.close()
    nomad.finish(job_id, client_status="complete", events=[{"Type": "Terminated", "Time": 9, "ExitCode": 0}])
    after = make_service(db_url, nomad_runner, clock=before.clock)
    after.step()
    shown = _state(after, exp["id"], headers)
    assert shown["status"] == "succeeded" and len(nomad.dispatched(PARENT)) == 1
    events_after = after.client.get(f"/api/v1/experiments/{exp['id']}/events", headers=headers).json()["events"]
    states = [e for e in events_after if e["kind"] == "state"]
    assert events_after[: len(events_before)] == events_before and states[-1]["to"] == "succeeded"


def test_the_reaper_stops_an_overdue_run_and_marks_it_expired(make_service, sqlite_url, nomad, nomad_runner):
    svc = make_service(sqlite_url, nomad_runner)
    headers = svc.token("finetune")
    exp = svc.submit(headers, deadline_hours=1).json()
    svc.step()
    job_id = nomad.dispatched(PARENT)[0]
    nomad.finish(job_id, client_status="running")
    svc.clock.advance(minutes=59)
    svc.step()
    assert _state(svc, exp["id"], headers)["status"] == "running" and not nomad.state.jobs[("finetune", job_id)].get("Stop")
    svc.clock.advance(minutes=2)
    svc.step()
    shown = _state(svc, exp["id"], headers)
    assert shown["status"] == "expired" and "deadline of 1h" in shown["reason"]
    assert nomad.state.jobs[("finetune", job_id)]["Stop"] is True
    assert shown["gpu_hours"] == pytest.approx(61 / 60, abs=1e-3)


def test_cancel_of_a_running_experiment_stops_it_on_nomad(make_service, sqlite_url, nomad, nomad_runner):
    svc = make_service(sqlite_url, nomad_runner)
    headers = svc.token("finetune")
    exp = svc.submit(headers).json()
    svc.step()
    job_id = nomad.dispatched(PARENT)[0]
    nomad.finish(job_id, client_status="running")
    svc.step()
    answer = svc.client.post(f"/api/v1/experiments/{exp['id']}/cancel", headers=headers)
    assert answer.status_code == 202 and answer.json()["status"] == "running" and answer.json()["cancel_requested"]
    svc.step()
    assert _state(svc, exp["id"], headers)["status"] == "cancelled"
    assert nomad.state.jobs[("finetune", job_id)]["Stop"] is True


def test_a_run_queued_past_its_wrapped_secret_id_lifetime_is_stopped_and_failed(make_service, sqlite_url, nomad, nomad_runner):
    for node in nomad.nodes:
        node.gpus_used = node.gpus  # no free A100: the dispatch is blocked
    svc = make_service(sqlite_url, nomad_runner)
    headers = svc.token("finetune")
    exp = svc.submit(headers).json()
    svc.step()
    shown = _state(svc, exp["id"], headers)
    assert shown["status"] == "queued" and "waiting for capacity" in shown["reason"]
    svc.clock.advance(hours=1)
    svc.step()
    shown = _state(svc, exp["id"], headers)
    assert shown["status"] == "failed" and "wrapped secret_id" in shown["reason"]
    assert nomad.state.jobs[("finetune", nomad.dispatched(PARENT)[0])]["Stop"] is True


def test_a_run_the_scheduler_forgot_while_running_fails_with_that_reason(make_service, sqlite_url, nomad, nomad_runner):
    svc = make_service(sqlite_url, nomad_runner)
    headers = svc.token("finetune")
    exp = svc.submit(headers).json()
    svc.step()
    job_id = nomad.dispatched(PARENT)[0]
    nomad.finish(job_id, client_status="running")
    svc.step()
    del nomad.state.jobs[("finetune", job_id)]  # purged behind gpufleet's back
    svc.step()
    shown = _state(svc, exp["id"], headers)
    assert shown["status"] == "failed" and "no longer knows run" in shown["reason"]


def test_an_unexpected_runner_error_is_retried_and_counts_toward_the_stuck_bound(make_service, sqlite_url):
    class Broken:
        scheduler = "nomad"

        def submit(self, job, meta, *, idempotency_key, attempt=1):
            raise KeyError("DispatchedJobID")

        def find(self, job, key):
            return None

    svc = make_service(sqlite_url, Broken(), timing=Timing(dispatch_stuck_seconds=60))
    headers = svc.token("finetune")
    exp = svc.submit(headers).json()
    svc.step()
    assert _state(svc, exp["id"], headers)["status"] == "dispatching"
    svc.clock.advance(seconds=61)
    svc.step()
    shown = _state(svc, exp["id"], headers)
    assert shown["status"] == "failed" and "unexpected KeyError" in shown["reason"]
