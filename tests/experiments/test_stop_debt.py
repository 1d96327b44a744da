"""A dispatch that ends without a run id never leaves a run billing (red-team findings, issue 15).

An answer lost after the scheduler acted, then an outage past the stuck bound; a cancel while a
dispatch is being retried; a submit that outlives its lease and whose orphan stop meets a blip.
In each case the outbox row stays as a stop debt until ``runner.find`` + ``stop`` settle it.
Schedulers: the Nomad API double and the Kubernetes + Kueue API double (tests/jobs), real OpenBao.
"""

from __future__ import annotations

from experiments.background.context import Context
from experiments.background.dispatch import process_outbox
from experiments.models import Outbox
from tests.experiments.test_dispatch import PARENT
from tests.experiments.test_gke import NS, _jobs, _state, _submit


def _outbox(svc) -> int:
    with svc.ctx.sessions() as session:
        return session.query(Outbox).count()


def test_a_stuck_gke_dispatch_deletes_the_job_its_lost_answer_left(make_service, sqlite_url, k8s, fleet_runner):
    svc = make_service(sqlite_url, fleet_runner)
    headers = svc.token(NS)
    exp = _submit(svc, headers).json()
    k8s.fail_next("POST", f"/namespaces/{NS}/jobs", 503, after_commit=True)  # stored, answer lost
    k8s.fail_next("POST", f"/namespaces/{NS}/secrets", 503, times=10_000)   # the Secret never gets through
    svc.step()
    for _ in range(20):
        svc.clock.advance(seconds=61)
        svc.step()
    shown = _state(svc, exp["id"], headers)
    assert shown["status"] == "failed" and "not dispatched within" in shown["reason"]
    (run,) = _jobs(k8s)
    assert k8s.job(NS, run)["metadata"].get("deletionTimestamp") or run not in _jobs(k8s), "the Job the lost answer left must be stopped"
    assert shown["run_id"] and shown["run_id"].endswith(run)
    assert _outbox(svc) == 0
    kinds = [e["kind"] for e in svc.client.get(f"/api/v1/experiments/{exp['id']}/events", headers=headers).json()["events"]]
    assert "stop" in kinds


def test_a_stuck_nomad_dispatch_stops_the_child_its_lost_answer_left(make_service, sqlite_url, nomad, nomad_runner):
    from tests.jobs.nomad_double import Fault

    svc = make_service(sqlite_url, nomad_runner)
    headers = svc.token("finetune")
    exp = svc.submit(headers).json()
    nomad.inject("POST", "dispatch", Fault(delay_seconds=3.0), *[Fault(status=503)] * 200)
    svc.step()
    for _ in range(20):
        svc.clock.advance(seconds=61)
        svc.step()
    shown = _state(svc, exp["id"], headers)
    assert shown["status"] == "failed"
    (child,) = nomad.dispatched(PARENT)
    assert any(child.replace("/", "%2F") in c.path or child in c.path for c in nomad.calls("DELETE", "job")), "the dispatched child must be stopped"
    assert _outbox(svc) == 0


def test_a_stop_debt_survives_a_scheduler_outage_and_is_settled_later(make_service, sqlite_url, k8s, fleet_runner):
    """The debt is not forgotten while the API is down: it stays in the outbox and is shown."""
    svc = make_service(sqlite_url, fleet_runner)
    headers = svc.token(NS)
    exp = _submit(svc, headers).json()
    k8s.fail_next("POST", f"/namespaces/{NS}/jobs", 503, after_commit=True)
    k8s.fail_next("POST", f"/namespaces/{NS}/secrets", 503, times=10_000)
    svc.step()
    k8s.fail_next("GET", f"/namespaces/{NS}/jobs/", 503, times=10_000)  # from now on the Job cannot even be read
    for _ in range(20):
        svc.clock.advance(seconds=61)
        svc.step()
    assert _state(svc, exp["id"], headers)["status"] == "failed"
    (run,) = _jobs(k8s)
    assert not k8s.job(NS, run)["metadata"].get("deletionTimestamp")
    assert _outbox(svc) == 1, "the stop debt must stay until it is settled"
    k8s.faults.clear()  # the API server is back
    for _ in range(3):
        svc.clock.advance(seconds=61)
        svc.step()
    assert _outbox(svc) == 0 and (run not in _jobs(k8s) or k8s.job(NS, run)["metadata"].get("deletionTimestamp"))


def test_cancel_while_a_dispatch_is_retried_never_submits_again(make_service, sqlite_url, k8s, fleet_runner):
    svc = make_service(sqlite_url, fleet_runner)
    headers = svc.token(NS)
    exp = _submit(svc, headers).json()
    k8s.fail_next("GET", f"/namespaces/{NS}/jobs/", 503, times=3)  # the first attempt fails before anything is created
    svc.step()
    assert _state(svc, exp["id"], headers)["status"] == "dispatching"
    assert svc.client.post(f"/api/v1/experiments/{exp['id']}/cancel", headers=headers).status_code in (200, 202)
    svc.clock.advance(seconds=5)
    process_outbox(svc.ctx)
    svc.step()
    assert k8s.created("jobs") == [] and k8s.created("secrets") == [], "no Job created and no secret_id minted after the cancel"
    assert _state(svc, exp["id"], headers)["status"] == "cancelled"
    assert _outbox(svc) == 0


def test_an_orphan_whose_stop_fails_is_stopped_by_a_later_pass(make_service, sqlite_url, k8s, fleet_runner):
    """Dispatcher A's submit outlives its lease and the stuck bound; B fails the experiment; A's
    Job lands and A's stop meets a 503: the debt is kept and settled by the next pass."""
    holder = {}

    class SlowA:
        scheduler, clusters = fleet_runner.scheduler, fleet_runner.clusters

        def submit(self, job, meta, *, idempotency_key, attempt=1):
            svc = holder["svc"]
            svc.clock.advance(seconds=901)
            k8s.fail_next("GET", f"/namespaces/{NS}/jobs/", 503, times=3)
            b_ctx = Context(svc.ctx.sessions, fleet_runner, svc.ctx.catalog, svc.ctx.clock, svc.ctx.metrics, svc.ctx.timing)
            process_outbox(b_ctx)
            run = fleet_runner.submit(job, meta, idempotency_key=idempotency_key)
            k8s.fail_next("DELETE", f"/namespaces/{NS}/jobs/", 503, times=3)
            return run

        def status(self, run_id):
            return fleet_runner.status(run_id)

        def stop(self, run_id):
            return fleet_runner.stop(run_id)

        def find(self, job, key):
            return fleet_runner.find(job, key)

        def __getattr__(self, name):
            return getattr(fleet_runner, name)  # the binding state (blocked, members...) of the runner it wraps

    svc = make_service(sqlite_url, SlowA())
    holder["svc"] = svc
    headers = svc.token(NS)
    exp = _submit(svc, headers).json()
    process_outbox(svc.ctx)
    for _ in range(3):
        svc.clock.advance(minutes=5)
        svc.step()
    assert _state(svc, exp["id"], headers)["status"] == "failed"
    assert all(k8s.job(NS, j)["metadata"].get("deletionTimestamp") for j in _jobs(k8s)), _jobs(k8s)
    assert _outbox(svc) == 0


def test_a_service_bound_to_another_cluster_leaves_the_dispatch_alone(make_service, sqlite_url, k8s, fleet_runner, nomad_runner):
    """Two services on one database, one per cluster: the Nomad-only one never claims (nor fails
    as stuck) a GKE experiment's dispatch; the GKE-bound one dispatches it."""
    from experiments.scheduler import ClusterRunners

    svc = make_service(sqlite_url, fleet_runner)
    headers = svc.token(NS)
    exp = _submit(svc, headers).json()
    nomad_only = ClusterRunners(nomad=("prod-nomad", nomad_runner))
    other = Context(svc.ctx.sessions, nomad_only, svc.ctx.catalog, svc.ctx.clock, svc.ctx.metrics, svc.ctx.timing)
    for _ in range(20):
        svc.clock.advance(seconds=61)
        assert process_outbox(other) == 0
    with svc.ctx.sessions() as session:
        assert session.get(Outbox, exp["id"]).attempts == 0
    assert _state(svc, exp["id"], headers)["status"] == "pending"
    assert process_outbox(svc.ctx) == 1
