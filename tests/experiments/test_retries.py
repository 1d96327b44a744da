"""Retries with fresh secrets (issue 25): a run the fleet lost is dispatched again as the next attempt
of the same experiment, with new single-use wrapped secret_ids for every rank, a new scheduler run,
the tenant's quota held once; a run that failed on its own is not.

Proved where the schedulers and Vault see it: the Nomad double's dispatch calls (their meta carries
the wrapping token), the Kubernetes double's created Jobs and Secrets, and the real OpenBao, which
says of each wrapping token whether it is a live, unused wrap of an AppRole secret_id. The failures
are made the way upstream writes them (tests/jobs/nomad_double.py lose_node/preempt/drain,
tests/jobs/k8s_double.py disrupt/evict cite the fields). SQLite and PostgreSQL (``db_url``).
"""

from __future__ import annotations

import base64
import shutil
from pathlib import Path

import pytest
import requests
from sqlalchemy import select

from experiments.background.context import Timing
from experiments.background.dispatch import process_outbox
from experiments.models import Event, Experiment, RunAttempt
from experiments.services.catalog import Catalog
from experiments.services.experiments import gpus_in_use
from jobs.k8s.render import ROLE_ID_KEY
from jobs.loader import JOBS_DIR
from tests.experiments.test_dispatch import Crash, CrashAfterSubmit

PARENT, NOMAD_NS = "finetune-llama", "finetune"
GKE_JOB, GKE_NS = "finetune-llama-gke", "research"
GKE_META = {"dataset_uri": "gs://acme-data/chat/v3/", "run_id": "llama-chat-gke-1"}
BACKOFF = Timing().retry_backoff_seconds


def _state(svc, exp_id, headers):
    return svc.client.get(f"/api/v1/experiments/{exp_id}", headers=headers).json()


def _nomad_wraps(nomad) -> list[str]:
    """The wrapping token of each dispatch call Nomad received, in order."""
    return [call.body["Meta"]["gpufleet_vault_wrapped_secret_id"] for call in nomad.calls("POST", "dispatch")]


def _unused_secret_id_wrap(vault, token: str, role: str) -> bool:
    """OpenBao's own word (sys/wrapping/lookup needs no token and does not consume the wrap)."""
    answer = requests.post(f"{vault.addr}/v1/sys/wrapping/lookup", json={"token": token}, timeout=5)
    return answer.status_code == 200 and answer.json()["data"]["creation_path"] == f"auth/approle/role/{role}/secret-id"


def _gke_wraps(k8s, run: str) -> list[str]:
    secret = k8s.store.objects[("secrets", GKE_NS, f"{run}-vault")]
    return [base64.b64decode(v).decode() for k, v in sorted(secret["data"].items()) if k != ROLE_ID_KEY]


def _gke_jobs(k8s) -> list[str]:
    return [r.body["metadata"]["name"] for r in k8s.created("jobs")]


def _events(svc, exp_id):
    with svc.ctx.sessions() as session:
        return session.scalars(select(Event).where(Event.experiment_id == exp_id).order_by(Event.id)).all()


def _quota(svc, tenant, cluster, pool):
    with svc.ctx.sessions() as session:
        return gpus_in_use(session, tenant, cluster, pool)


def _nomad_running(svc, nomad, headers):
    exp = svc.submit(headers).json()
    svc.step()
    job_id = nomad.dispatched(PARENT)[0]
    nomad.start_task(job_id)
    svc.step()
    assert _state(svc, exp["id"], headers)["status"] == "running"
    return exp, job_id


def test_a_lost_node_under_a_2_rank_run_makes_exactly_one_second_attempt_with_two_new_secret_ids(make_service, db_url, k8s, fleet_runner, vault):
    svc = make_service(db_url, fleet_runner)
    headers = svc.token(GKE_NS)
    exp = svc.client.post("/api/v1/experiments", json={"job": GKE_JOB, "meta": GKE_META}, headers=headers).json()
    svc.step()
    (first,) = _gke_jobs(k8s)
    first_wraps = _gke_wraps(k8s, first)
    k8s.admit(GKE_NS, first, cluster_queue=GKE_NS, flavor="h100")
    k8s.pods_ready(GKE_NS, first, 2)
    svc.step()
    assert _state(svc, exp["id"], headers)["status"] == "running" and _quota(svc, GKE_NS, "prod-gke", "h100") == 16
    for token in first_wraps:  # the ranks of attempt 1 unwrap theirs
        requests.post(f"{vault.addr}/v1/sys/wrapping/unwrap", headers={"X-Vault-Token": token}, timeout=5).raise_for_status()

    k8s.disrupt(GKE_NS, first, reason="DeletionByTaintManager", rank=1)  # rank 1's node went NotReady: the taint manager deleted its pod
    svc.step()
    shown = _state(svc, exp["id"], headers)
    assert shown["status"] == "retrying" and shown["attempt"] == 2 and shown["failure_class"] == "infrastructure"
    assert "disruption-DeletionByTaintManager" in shown["reason"] and "attempt 2 of at most 4" in shown["reason"]
    assert _quota(svc, GKE_NS, "prod-gke", "h100") == 16  # held once, while it waits out the backoff
    svc.step()
    assert _gke_jobs(k8s) == [first]  # nothing before the backoff

    svc.clock.advance(seconds=BACKOFF + 1)
    svc.step()
    svc.step()
    jobs = _gke_jobs(k8s)
    assert len(jobs) == 2 and jobs[0] == first and jobs[1] != first  # one new Job, under its own name
    assert k8s.job(GKE_NS, first)["metadata"].get("deletionTimestamp")  # the whole old gang stopped ...
    deleted = next(i for i, r in enumerate(k8s.requests) if r.method == "DELETE" and r.path.endswith(f"/jobs/{first}"))
    created = next(i for i, r in enumerate(k8s.requests) if r.method == "POST" and r.path.endswith("/jobs") and r.status == 201
                   and r.body["metadata"]["name"] == jobs[1])
    assert deleted < created  # ... before the new attempt's Job was made
    second_wraps = _gke_wraps(k8s, jobs[1])
    assert len(second_wraps) == 2 and not set(second_wraps) & set(first_wraps)
    assert all(_unused_secret_id_wrap(vault, t, "finetune") for t in second_wraps)  # live, never unwrapped
    env = {e["name"]: e.get("value") for e in k8s.job(GKE_NS, jobs[1])["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["GPUFLEET_ATTEMPT"] == "2"
    shown = _state(svc, exp["id"], headers)
    assert shown["id"] == exp["id"] and shown["status"] == "queued" and shown["attempt"] == 2 and jobs[1] in shown["run_id"]
    assert [a["attempt"] for a in shown["attempts"]] == [1, 2] and shown["attempts"][0]["cause"] == "disruption-DeletionByTaintManager"
    assert _quota(svc, GKE_NS, "prod-gke", "h100") == 16
    assert {e.attempt for e in _events(svc, exp["id"])} == {1, 2}

    k8s.admit(GKE_NS, jobs[1], cluster_queue=GKE_NS, flavor="h100")
    k8s.pods_ready(GKE_NS, jobs[1], 2)
    svc.step()
    svc.clock.advance(hours=1)
    k8s.succeed(GKE_NS, jobs[1])
    svc.step()
    done = _state(svc, exp["id"], headers)
    assert done["status"] == "succeeded" and len(_gke_jobs(k8s)) == 2
    # GPU-hours add up: attempt 1 held 16 GPUs for 0 s of fake time, attempt 2 for an hour.
    assert done["gpu_hours"] == pytest.approx(16.0, abs=0.01) and done["attempts"][1]["gpu_hours"] == pytest.approx(16.0, abs=0.01)


def test_a_lost_nomad_node_retries_with_a_new_dispatch_and_a_new_secret_id(make_service, db_url, nomad, nomad_runner, vault):
    svc = make_service(db_url, nomad_runner)
    headers = svc.token("finetune")
    exp, first = _nomad_running(svc, nomad, headers)
    nomad.lose_node(first)
    svc.step()
    shown = _state(svc, exp["id"], headers)
    assert shown["status"] == "retrying" and "node-lost" in shown["reason"] and "alloc is lost since its node is down" in shown["reason"]
    svc.clock.advance(seconds=BACKOFF + 1)
    svc.step()
    children = nomad.dispatched(PARENT)
    assert len(children) == 2 and first in children
    assert nomad.state.jobs[(NOMAD_NS, first)].get("Stop") is True  # the old attempt's job stopped before the new dispatch
    order = [(r.method, r.path) for r in nomad.requests if r.method == "DELETE" or r.path.endswith("/dispatch")]
    assert order.index(next(o for o in order if o[0] == "DELETE" and first in o[1])) < [o[0] for o in order].index("POST", 1)
    tokens = [call.query["idempotency_token"][0] for call in nomad.calls("POST", "dispatch")]
    assert tokens == [exp["id"], f"{exp['id']}.attempt-2"]
    wraps = _nomad_wraps(nomad)
    assert len(set(wraps)) == 2 and _unused_secret_id_wrap(vault, wraps[1], "finetune")
    assert [c.body["Meta"]["gpufleet_attempt"] for c in nomad.calls("POST", "dispatch")] == ["1", "2"]
    assert _state(svc, exp["id"], headers)["attempt"] == 2


@pytest.mark.parametrize("fault", ["preempt", "drain", "hardware"])
def test_nomad_preemption_drain_and_the_hardware_exit_are_infrastructure(make_service, sqlite_url, nomad, nomad_runner, fault):
    svc = make_service(sqlite_url, nomad_runner)
    headers = svc.token("finetune")
    exp, first = _nomad_running(svc, nomad, headers)
    if fault == "preempt":
        nomad.preempt(first, by="alloc-ffff")
    elif fault == "drain":
        nomad.drain(first)
    else:
        nomad.finish(first, client_status="failed", failed=True, events=[{"Type": "Terminated", "Time": 1, "ExitCode": 75, "Details": {"exit_code": "75"}}])
    svc.step()
    shown = _state(svc, exp["id"], headers)
    assert shown["status"] == "retrying" and shown["failure_class"] == "infrastructure"
    assert {"preempt": "preempted", "drain": "rescheduled", "hardware": "hardware-exit"}[fault] in shown["reason"]


def test_a_user_exit_1_is_not_retried(make_service, db_url, nomad, nomad_runner):
    svc = make_service(db_url, nomad_runner)
    headers = svc.token("finetune")
    exp, first = _nomad_running(svc, nomad, headers)
    nomad.finish(first, client_status="failed", failed=True, events=[{"Type": "Terminated", "Time": 1, "ExitCode": 1, "Details": {"exit_code": "1"}}])
    svc.step()
    svc.clock.advance(hours=1)
    svc.step()
    shown = _state(svc, exp["id"], headers)
    assert shown["status"] == "failed" and shown["failure_class"] == "user" and shown["exit_code"] == 1 and shown["attempt"] == 1
    assert "not retried" in shown["reason"] and len(nomad.dispatched(PARENT)) == 1


def _jobs_with(tmp_path: Path, catalog: Catalog, retries: str) -> Catalog:
    directory = tmp_path / "jobs"
    directory.mkdir()
    shutil.copy(JOBS_DIR / f"{PARENT}.yaml", directory / f"{PARENT}.yaml")
    with (directory / f"{PARENT}.yaml").open("a") as handle:
        handle.write(retries)
    return Catalog(directory, configs=catalog.configs, vault=catalog.vault)


def test_max_attempts_0_never_retries(make_service, db_url, nomad, nomad_runner, catalog, tmp_path):
    svc = make_service(db_url, nomad_runner, jobs=_jobs_with(tmp_path, catalog, "retries:\n  max_attempts: 0\n"))
    headers = svc.token("finetune")
    exp, first = _nomad_running(svc, nomad, headers)
    nomad.lose_node(first)
    svc.step()
    svc.clock.advance(hours=1)
    svc.step()
    shown = _state(svc, exp["id"], headers)
    assert shown["status"] == "failed" and shown["failure_class"] == "infrastructure" and "max_attempts: 0" in shown["reason"]
    assert len(nomad.dispatched(PARENT)) == 1


def test_a_listed_exit_code_is_retried_until_max_attempts_is_spent(make_service, sqlite_url, nomad, nomad_runner, catalog, tmp_path):
    svc = make_service(sqlite_url, nomad_runner, jobs=_jobs_with(tmp_path, catalog, "retries:\n  max_attempts: 1\n  on_exit_codes: [42]\n"))
    headers = svc.token("finetune")
    exp, first = _nomad_running(svc, nomad, headers)
    exit42 = [{"Type": "Terminated", "Time": 1, "ExitCode": 42, "Details": {"exit_code": "42"}}]
    nomad.finish(first, client_status="failed", failed=True, events=exit42)
    svc.step()
    svc.clock.advance(seconds=BACKOFF + 1)
    svc.step()
    second = next(j for j in nomad.dispatched(PARENT) if j != first)
    nomad.start_task(second)
    svc.step()
    nomad.finish(second, client_status="failed", failed=True, events=exit42)
    svc.step()
    shown = _state(svc, exp["id"], headers)
    assert shown["status"] == "failed" and shown["attempt"] == 2 and "all 1 retries" in shown["reason"] and len(nomad.dispatched(PARENT)) == 2


def test_a_kill_9_during_a_retry_dispatches_that_attempt_exactly_once(make_service, db_url, nomad, nomad_runner):
    svc = make_service(db_url, nomad_runner)
    headers = svc.token("finetune")
    exp, first = _nomad_running(svc, nomad, headers)
    nomad.lose_node(first)
    svc.step()
    svc.close()
    doomed = make_service(db_url, CrashAfterSubmit(nomad_runner), clock=svc.clock)
    doomed.clock.advance(seconds=BACKOFF + 1)
    with pytest.raises(Crash):  # Nomad accepted attempt 2, the process died before recording it
        process_outbox(doomed.ctx)
    doomed.close()
    restarted = make_service(db_url, nomad_runner, clock=doomed.clock)
    restarted.step()
    assert _state(restarted, exp["id"], headers)["status"] == "dispatching"  # the dead dispatcher's lease holds
    restarted.clock.advance(seconds=Timing().dispatch_lease_seconds + 1)
    restarted.step()
    restarted.step()
    children = nomad.dispatched(PARENT)
    assert len(children) == 2  # attempt 1 and exactly one attempt 2
    shown = _state(restarted, exp["id"], headers)
    assert shown["attempt"] == 2 and shown["status"] == "provisioning" and shown["run_id"] == f"{NOMAD_NS}/{next(c for c in children if c != first)}"
    with restarted.ctx.sessions() as session:
        assert [a.attempt for a in session.scalars(select(RunAttempt).where(RunAttempt.experiment_id == exp["id"]))] == [1]
        assert session.get(Experiment, exp["id"]).attempt == 2


def test_a_kueue_preemption_becomes_attempt_2_not_a_failure(make_service, db_url, k8s, fleet_runner):
    svc = make_service(db_url, fleet_runner)
    headers = svc.token(GKE_NS)
    exp = svc.client.post("/api/v1/experiments", json={"job": GKE_JOB, "meta": GKE_META}, headers=headers).json()
    svc.step()
    (first,) = _gke_jobs(k8s)
    k8s.admit(GKE_NS, first, cluster_queue=GKE_NS, flavor="h100")
    svc.step()
    k8s.evict(GKE_NS, first)  # Kueue: Evicted/Preempted, InClusterQueue
    svc.step()
    shown = _state(svc, exp["id"], headers)
    assert shown["status"] == "retrying" and shown["attempt"] == 2 and "kueue-Preempted/InClusterQueue" in shown["reason"]
    assert k8s.job(GKE_NS, first)["metadata"].get("deletionTimestamp")  # the requeued Job no longer waits for GPUs
    svc.clock.advance(seconds=BACKOFF + 1)
    svc.step()
    jobs = _gke_jobs(k8s)
    assert len(jobs) == 2 and _state(svc, exp["id"], headers)["status"] == "queued"


def test_the_local_runner_resumes_a_retried_run_from_its_checkpoint(make_service, sqlite_url, vault):
    """What ``make demo`` shows: attempt 1 dies at step 150 with the wrapper's hardware exit, attempt 2
    (a new wrapped secret_id, GPUFLEET_ATTEMPT=2) resumes from the checkpoint in the same directory."""
    import time

    from experiments.runner_local import LocalRunner
    from jobs.local import CHECKPOINTS_DIR

    runner = LocalRunner({"VAULT_ADDR": vault.addr, "VAULT_TOKEN": vault.orchestrator.token}, xid_at_step=150)
    svc = make_service(sqlite_url, runner, timing=Timing(retry_backoff_seconds=0))
    headers = svc.token("finetune")
    exp = svc.submit(headers, meta={"dataset_uri": "hf://datasets/acme/chat@v3", "run_id": "resume-1"}).json()
    try:
        for _ in range(300):
            svc.step()
            shown = _state(svc, exp["id"], headers)
            if shown["status"] in ("succeeded", "failed"):
                break
            time.sleep(0.1)
        assert shown["status"] == "succeeded" and shown["attempt"] == 2, shown
        first = shown["attempts"][0]
        assert (first["failure_class"], first["cause"], first["exit_code"]) == ("infrastructure", "hardware-exit", 75)
        lines = svc.client.get(f"/api/v1/experiments/{exp['id']}/logs", headers=headers).json()["lines"]
        assert "attempt 2: resuming from the checkpoint of step 149" in "\n".join(lines)
        assert len(runner._runs) == 2
    finally:
        import shutil as _shutil

        _shutil.rmtree(CHECKPOINTS_DIR / exp["id"], ignore_errors=True)


# --- Red team (issue 25 review): races, cost, cancel, classification -------------------------------


class _ReplicaDuringPoll:
    """This service's runner, except that while its reconcile pass waits for the scheduler's answer,
    another replica sharing the database and the scheduler (docs/control-plane.md) runs ``during``."""

    def __init__(self, runner, during) -> None:
        self.runner, self.scheduler, self._during = runner, runner.scheduler, during

    def poll(self, run_ids, known):
        answer = self.runner.poll(run_ids, known)
        if self._during is not None:
            during, self._during = self._during, None
            during()
        return answer

    def __getattr__(self, name):
        return getattr(self.runner, name)


def test_a_stale_answer_about_attempt_1_never_touches_attempt_2(make_service, db_url, nomad, nomad_runner):
    """Two replicas follow the same cluster. Replica B reads attempt 1 lost; before B commits, replica A
    retries it and dispatches attempt 2. B's answer was about attempt 1's run: applied to attempt 2 it
    would record the healthy attempt 2 as failed, queue a third attempt and stop attempt 2's run."""
    from experiments.background.reconcile import process_scheduled

    a = make_service(db_url, nomad_runner)
    headers = a.token("finetune")
    exp, first = _nomad_running(a, nomad, headers)
    nomad.lose_node(first)

    def replica_a_retries() -> None:
        a.step()  # attempt 1 lost -> retrying
        a.clock.advance(seconds=BACKOFF + 1)
        a.step()  # attempt 2 dispatched

    b = make_service(db_url, _ReplicaDuringPoll(nomad_runner, replica_a_retries), clock=a.clock)
    process_scheduled(b.ctx)
    second = next(j for j in nomad.dispatched(PARENT) if j != first)
    shown = _state(a, exp["id"], headers)
    assert shown["attempt"] == 2 and shown["status"] in ("queued", "provisioning") and shown["run_id"] == f"{NOMAD_NS}/{second}"
    assert not nomad.state.jobs[(NOMAD_NS, second)].get("Stop")
    with a.ctx.sessions() as session:
        assert [r.attempt for r in session.scalars(select(RunAttempt).where(RunAttempt.experiment_id == exp["id"]))] == [1]
    a.clock.advance(hours=1)
    a.step()
    assert len(nomad.dispatched(PARENT)) == 2


def test_cancelling_a_running_run_does_not_break_the_reconcile_pass(make_service, sqlite_url, nomad, nomad_runner):
    """A cancel is carried out first in a pass (reconcile_one); the other runs of the pass are still followed."""
    from experiments.background.reconcile import process_scheduled

    svc = make_service(sqlite_url, nomad_runner)
    headers = svc.token("finetune")
    doomed, doomed_job = _nomad_running(svc, nomad, headers)
    other = svc.submit(headers, meta={"dataset_uri": "hf://datasets/acme/chat@v3", "run_id": "r2"}).json()
    svc.step()
    other_job = next(j for j in nomad.dispatched(PARENT) if j != doomed_job)
    nomad.start_task(other_job)
    svc.step()
    assert svc.client.post(f"/api/v1/experiments/{doomed['id']}/cancel", headers=headers).status_code in (200, 202)
    nomad.finish(other_job, client_status="complete", events=[{"Type": "Terminated", "Time": 1, "ExitCode": 0, "Details": {"exit_code": "0"}}])
    process_scheduled(svc.ctx)  # raises if the cancel path fails
    assert _state(svc, doomed["id"], headers)["status"] == "cancelled"
    assert _state(svc, other["id"], headers)["status"] == "succeeded"


def test_gpu_hours_of_an_ended_attempt_stay_in_costs_while_retrying_and_after_a_cancel(make_service, db_url, nomad, nomad_runner):
    svc = make_service(db_url, nomad_runner)
    headers = svc.token("finetune")
    exp, first = _nomad_running(svc, nomad, headers)
    svc.clock.advance(hours=2)
    nomad.lose_node(first)
    svc.step()
    assert _state(svc, exp["id"], headers)["status"] == "retrying"
    costs = svc.client.get("/api/v1/costs", headers=headers).json()
    assert costs["by_tenant"]["finetune"]["gpu_hours"] == pytest.approx(2.0, abs=0.01)
    svc.client.post(f"/api/v1/experiments/{exp['id']}/cancel", headers=headers)
    svc.step()
    shown = _state(svc, exp["id"], headers)
    assert shown["status"] == "cancelled" and shown["gpu_hours"] == pytest.approx(2.0, abs=0.01)
    assert len(nomad.dispatched(PARENT)) == 1  # no attempt 2 for a cancelled run
    costs = svc.client.get("/api/v1/costs", headers=headers).json()
    assert costs["by_tenant"]["finetune"]["gpu_hours"] == pytest.approx(2.0, abs=0.01)
    assert _quota(svc, "finetune", "prod-nomad", "a100") == 0


def test_a_retry_that_fails_as_stuck_still_stops_the_previous_attempts_run(make_service, sqlite_url, nomad, nomad_runner):
    """Attempt 1's node is drained (its allocation still runs, api/allocations.go DesiredTransition.Migrate)
    and Nomad refuses every stop until the retry fails as stuck. The stop debt must then stop attempt 1's
    run, not only look for attempt 2's: nothing else ever stops it once the experiment is failed."""
    from tests.jobs.nomad_double import Fault

    svc = make_service(sqlite_url, nomad_runner)
    headers = svc.token("finetune")
    exp, first = _nomad_running(svc, nomad, headers)
    nomad.drain(first)
    nomad.inject("DELETE", "job", *[Fault(status=503)] * 500)
    svc.step()
    assert _state(svc, exp["id"], headers)["status"] == "retrying"
    svc.clock.advance(seconds=BACKOFF + 1)
    svc.step()
    svc.clock.advance(seconds=Timing().dispatch_stuck_seconds + 1)
    svc.step()
    assert _state(svc, exp["id"], headers)["status"] == "failed" and len(nomad.dispatched(PARENT)) == 1
    assert not nomad.state.jobs[(NOMAD_NS, first)].get("Stop")
    nomad.faults.clear()  # Nomad answers again
    for _ in range(3):
        svc.clock.advance(seconds=120)
        svc.step()
    assert nomad.state.jobs[(NOMAD_NS, first)].get("Stop") is True
    assert _quota(svc, "finetune", "prod-nomad", "a100") == 0


def test_a_cancel_that_arrives_while_the_failure_is_being_read_does_not_wait_out_the_backoff(make_service, db_url, nomad, nomad_runner):
    """The cancel lands after the pass read its rows and before it commits ``retrying``: the next attempt's
    outbox row must be due at once, so the dispatcher ends it cancelled now (quota freed), never dispatching."""
    from experiments.background.reconcile import process_scheduled

    holder: dict = {}
    svc = make_service(db_url, _ReplicaDuringPoll(nomad_runner, lambda: holder["cancel"]()))
    headers = svc.token("finetune")
    holder["cancel"] = lambda: svc.client.post(f"/api/v1/experiments/{holder['id']}/cancel", headers=headers).raise_for_status()
    exp = svc.submit(headers).json()
    holder["id"] = exp["id"]
    from experiments.background.dispatch import process_outbox

    process_outbox(svc.ctx)
    first = nomad.dispatched(PARENT)[0]
    nomad.start_task(first)
    nomad.lose_node(first)
    process_scheduled(svc.ctx)  # the cancel arrives during this pass's poll
    assert _state(svc, exp["id"], headers)["status"] == "retrying"
    svc.step()
    shown = _state(svc, exp["id"], headers)
    assert shown["status"] == "cancelled" and len(nomad.dispatched(PARENT)) == 1
    assert _quota(svc, "finetune", "prod-nomad", "a100") == 0


def test_a_kueue_workload_deactivated_on_purpose_is_not_retried(make_service, sqlite_url, k8s, fleet_runner):
    """``spec.active: false`` on the Workload (an admin stopping it, or Kueue's own requeuing limit) evicts it
    with reason Deactivated (kueue apis/kueue/v1beta1/workload_types.go WorkloadDeactivated). That is a
    deliberate stop: a new attempt would undo it. The run fails, stopped, and nothing is dispatched again."""
    svc = make_service(sqlite_url, fleet_runner)
    headers = svc.token(GKE_NS)
    exp = svc.client.post("/api/v1/experiments", json={"job": GKE_JOB, "meta": GKE_META}, headers=headers).json()
    svc.step()
    (first,) = _gke_jobs(k8s)
    k8s.admit(GKE_NS, first, cluster_queue=GKE_NS, flavor="h100")
    svc.step()
    k8s.evict(GKE_NS, first, reason="Deactivated", message="The workload is deactivated")
    svc.step()
    shown = _state(svc, exp["id"], headers)
    assert shown["status"] == "failed" and shown["attempt"] == 1 and "deactivated" in shown["reason"], shown["reason"]
    assert k8s.job(GKE_NS, first)["metadata"].get("deletionTimestamp")
    svc.clock.advance(hours=1)
    svc.step()
    assert _gke_jobs(k8s) == [first]


def test_a_long_backoff_does_not_eat_the_next_attempts_dispatch_bound(make_service, sqlite_url, nomad, nomad_runner):
    """The stuck bound (``dispatch_stuck_seconds``) of a retried attempt counts from when it is due, not from
    when its backoff began: with a backoff as long as the bound, one refused dispatch must not fail the run."""
    from tests.jobs.nomad_double import Fault

    stuck = Timing().dispatch_stuck_seconds
    svc = make_service(sqlite_url, nomad_runner, timing=Timing(retry_backoff_seconds=stuck, retry_backoff_max_seconds=stuck))
    headers = svc.token("finetune")
    exp, first = _nomad_running(svc, nomad, headers)
    nomad.lose_node(first)
    svc.step()
    assert _state(svc, exp["id"], headers)["status"] == "retrying"
    nomad.inject("POST", "dispatch", *[Fault(status=503)] * 3)  # one dispatch try (the client's own retries) refused
    svc.clock.advance(seconds=stuck + 1)
    svc.step()
    assert _state(svc, exp["id"], headers)["status"] == "dispatching"
    svc.clock.advance(seconds=120)
    svc.step()
    shown = _state(svc, exp["id"], headers)
    assert shown["status"] in ("queued", "provisioning") and shown["attempt"] == 2 and len(nomad.dispatched(PARENT)) == 2


@pytest.mark.parametrize("reason", ["PreemptionByScheduler", "EvictionByEvictionAPI"])
def test_a_gracefully_evicted_gke_pod_is_infrastructure_even_though_its_container_exited_non_zero(make_service, sqlite_url, k8s, fleet_runner, reason):
    """A preempted or API-evicted pod (a node drain for an upgrade or host maintenance) gets SIGTERM: its train
    container ends with a non-zero code (143) as well as the DisruptionTarget condition. The Job controller
    takes the first matching podFailurePolicy rule, so the disruption rule must come before the any-exit rule,
    or the fleet's eviction reads as the command's own exit 143 and is never retried."""
    svc = make_service(sqlite_url, fleet_runner)
    headers = svc.token(GKE_NS)
    exp = svc.client.post("/api/v1/experiments", json={"job": GKE_JOB, "meta": GKE_META}, headers=headers).json()
    svc.step()
    (first,) = _gke_jobs(k8s)
    k8s.admit(GKE_NS, first, cluster_queue=GKE_NS, flavor="h100")
    k8s.pods_ready(GKE_NS, first, 2)
    svc.step()
    k8s.disrupt(GKE_NS, first, reason=reason, rank=0, exit_code=143)
    svc.step()
    shown = _state(svc, exp["id"], headers)
    assert shown["status"] == "retrying" and shown["failure_class"] == "infrastructure" and f"disruption-{reason}" in shown["reason"], shown["reason"]


class _PromptGarbageCollector:
    """The cluster runner, with Kubernetes' garbage collector finishing a Job's foreground deletion at once
    (the failed pods of a disrupted Job have no containers left to wait for): its pods and their logs go."""

    def __init__(self, runner, k8s) -> None:
        self.runner, self.scheduler, self._k8s = runner, runner.scheduler, k8s

    def stop(self, run_id):
        self.runner.stop(run_id)
        self._k8s.collect()

    def __getattr__(self, name):
        return getattr(self.runner, name)


def test_the_failed_attempts_logs_are_kept_before_its_gang_is_stopped(make_service, sqlite_url, k8s, fleet_runner):
    """Why attempt 1 died (the XID line) is in its logs: they are kept before the reconciler stops the
    retried attempt, whose stop deletes its pods with them."""
    from experiments.models import RunLog

    svc = make_service(sqlite_url, _PromptGarbageCollector(fleet_runner, k8s))
    headers = svc.token(GKE_NS)
    exp = svc.client.post("/api/v1/experiments", json={"job": GKE_JOB, "meta": GKE_META}, headers=headers).json()
    svc.step()
    (first,) = _gke_jobs(k8s)
    k8s.admit(GKE_NS, first, cluster_queue=GKE_NS, flavor="h100")
    k8s.pods_ready(GKE_NS, first, 2)
    svc.step()
    k8s.write_pod_log(GKE_NS, first, 1, "step 120 loss 1.93\nNVRM: Xid (PCI:0000:04:00): 79, GPU has fallen off the bus\n")
    k8s.disrupt(GKE_NS, first, reason="DeletionByTaintManager", rank=1)
    svc.step()
    assert _state(svc, exp["id"], headers)["status"] == "retrying"
    with svc.ctx.sessions() as session:
        kept = {(r.rank, r.stream): r.text for r in session.scalars(select(RunLog).where(RunLog.experiment_id == exp["id"]))}
    assert "GPU has fallen off the bus" in (kept.get((1, "stdout")) or ""), kept


def test_an_attempt_being_dispatched_is_not_shown_with_the_previous_attempts_run(make_service, sqlite_url, nomad, nomad_runner):
    """While attempt 2's dispatch is retried, the experiment row still holds attempt 1's run id: the API's
    attempt 2 has no run yet (a user reading it would look at, or stop, the wrong run)."""
    from tests.jobs.nomad_double import Fault

    svc = make_service(sqlite_url, nomad_runner)
    headers = svc.token("finetune")
    exp, first = _nomad_running(svc, nomad, headers)
    nomad.lose_node(first)
    svc.step()
    nomad.inject("POST", "dispatch", *[Fault(status=503)] * 3)
    svc.clock.advance(seconds=BACKOFF + 1)
    svc.step()
    shown = _state(svc, exp["id"], headers)
    assert shown["status"] == "dispatching" and [a["attempt"] for a in shown["attempts"]] == [1, 2]
    assert shown["attempts"][0]["run_id"] == f"{NOMAD_NS}/{first}" and shown["attempts"][1]["run_id"] is None


def test_a_cancel_while_the_previous_attempt_cannot_be_stopped_yet_ends_cancelled_at_once(make_service, sqlite_url, nomad, nomad_runner):
    """A retrying run is cancelled while Nomad refuses to stop attempt 1 (a drained node's allocation still
    runs). The cancel ends it now (quota freed, nothing dispatched), not after dispatch_stuck_seconds as
    failed; the stop of attempt 1 stays a debt until Nomad takes it."""
    from tests.jobs.nomad_double import Fault

    svc = make_service(sqlite_url, nomad_runner)
    headers = svc.token("finetune")
    exp, first = _nomad_running(svc, nomad, headers)
    nomad.drain(first)
    nomad.inject("DELETE", "job", *[Fault(status=503)] * 500)
    svc.step()
    assert _state(svc, exp["id"], headers)["status"] == "retrying"
    svc.client.post(f"/api/v1/experiments/{exp['id']}/cancel", headers=headers).raise_for_status()
    svc.step()
    shown = _state(svc, exp["id"], headers)
    assert shown["status"] == "cancelled" and len(nomad.dispatched(PARENT)) == 1
    assert _quota(svc, "finetune", "prod-nomad", "a100") == 0
    nomad.faults.clear()
    for _ in range(3):
        svc.clock.advance(seconds=120)
        svc.step()
    assert nomad.state.jobs[(NOMAD_NS, first)].get("Stop") is True
