"""Which runs a service may act on, and what a pass without an answer looks like.

A service follows, stops and fails only runs of the clusters it is bound to: restarted against
another cluster (another kubeconfig context, another NOMAD_ADDR) it must not call the first
cluster's runs gone, free their quota or cancel them without stopping them (red team 15, 3).
A namespace the service cannot list leaves only that namespace's runs without an answer
(finding 4), and a run without an answer is not stamped as reconciled, so the lag metric shows
a blind poll (finding 5). Kubernetes and Nomad are the API doubles of tests/jobs (documented
JSON), Vault is the session's OpenBao.
"""

from __future__ import annotations

import re

from experiments.scheduler import ClusterRunners
from jobs.k8s.client import K8sClient, K8sSettings
from jobs.runner import GkeRunner
from tests.experiments.test_dispatch import PARENT, running_on_nomad
from tests.experiments.test_gke import NS, _jobs, _run, _state, _submit
from tests.jobs.k8s_double import K8sDouble


def _metric(svc, name: str) -> dict[str, float]:
    """``name``'s samples from /metrics: label text (or "") -> value."""
    out = {}
    for line in svc.client.get("/metrics", headers=svc.token(None, admin=True)).text.splitlines():
        if m := re.match(rf"^{name}(\{{[^}}]*\}})? (\S+)$", line):
            out[m.group(1) or ""] = float(m.group(2))
    return out


def test_a_service_bound_to_another_gke_cluster_leaves_the_first_clusters_runs_alone(make_service, sqlite_url, k8s, fleet_runner, nomad_runner, vault, tmp_path):
    prod = make_service(sqlite_url, fleet_runner)
    headers = prod.token(NS)
    exp = _submit(prod, headers, deadline_hours=1).json()
    prod.step()
    run = _run(_state(prod, exp["id"], headers))
    k8s.admit(NS, run, cluster_queue=NS, flavor="h100")
    prod.step()
    assert _state(prod, exp["id"], headers)["status"] == "provisioning"
    prod.close()
    # Restarted with --gke-cluster dev-gke: its kubeconfig context is another API server, which has no such Job.
    dev_api = K8sDouble(namespaces={NS: {"gpu-h100"}}).start()
    client = K8sClient(K8sSettings(kubeconfig=str(dev_api.kubeconfig(tmp_path / "dev-kubeconfig")), timeout_seconds=5.0, retries=2, backoff_seconds=0.01))
    try:
        dev_runners = ClusterRunners(nomad=("prod-nomad", nomad_runner), gke=("dev-gke", GkeRunner(client, {"VAULT_ADDR": vault.addr, "VAULT_TOKEN": vault.orchestrator.token})))
        dev = make_service(sqlite_url, dev_runners, clock=prod.clock)
        deletes_before = [r.path for r in k8s.requests if r.method == "DELETE"]
        dev.step()
        shown = _state(dev, exp["id"], headers)
        assert shown["status"] == "provisioning", shown  # not "failed: the scheduler no longer knows run ..."
        assert "cluster prod-gke (gke) is not bound to this service" in shown["reason"] and "--gke-cluster prod-gke" in shown["reason"]
        assert _metric(dev, "gpufleet_experiments_not_bound") == {'{cluster="prod-gke"}': 1.0}
        # Cancel: recorded, but not carried out (and not marked cancelled) by a service that cannot stop it.
        answer = dev.client.post(f"/api/v1/experiments/{exp['id']}/cancel", headers=headers)
        assert answer.status_code == 202 and answer.json()["cancel_requested"]
        # Past its deadline: the reaper does not mark it expired either.
        dev.clock.advance(hours=2)
        dev.step()
        dev.step()
        shown = _state(dev, exp["id"], headers)
        assert shown["status"] == "provisioning" and shown["cancel_requested"] and "not bound" in shown["reason"]
        assert not [r for r in dev_api.requests if r.path.startswith(f"/apis/batch/v1/namespaces/{NS}/jobs")], "asked dev-gke about a prod-gke run"
        assert [r.path for r in k8s.requests if r.method == "DELETE"] == deletes_before
        assert run in _jobs(k8s) and not k8s.job(NS, run)["metadata"].get("deletionTimestamp")
        dev.close()
    finally:
        client.close()
        dev_api.stop()
    # The service bound to prod-gke again carries out the cancel on the cluster that runs it.
    back = make_service(sqlite_url, fleet_runner, clock=prod.clock)
    back.step()
    assert _state(back, exp["id"], headers)["status"] == "cancelled"
    assert k8s.job(NS, run)["metadata"].get("deletionTimestamp")
    assert _metric(back, "gpufleet_experiments_not_bound") == {}


def test_a_service_bound_to_another_nomad_cluster_neither_polls_nor_stops_nor_expires_its_runs(make_service, sqlite_url, nomad, nomad_runner):
    prod = make_service(sqlite_url, ClusterRunners(nomad=("prod-nomad", nomad_runner)))
    headers = prod.token("finetune")
    exp, job_id = running_on_nomad(prod, nomad, headers, deadline_hours=1)
    prod.close()
    other = make_service(sqlite_url, ClusterRunners(nomad=("other-nomad", nomad_runner)), clock=prod.clock)
    asked = len(nomad.requests)
    other.clock.advance(hours=3)  # far past its 1 h deadline
    other.step()
    shown = _state(other, exp["id"], headers)
    assert shown["status"] == "running" and "cluster prod-nomad (nomad) is not bound to this service" in shown["reason"]
    assert len(nomad.requests) == asked and not nomad.state.jobs[("finetune", job_id)].get("Stop")
    other.close()
    back = make_service(sqlite_url, ClusterRunners(nomad=("prod-nomad", nomad_runner)), clock=prod.clock)
    back.step()
    assert _state(back, exp["id"], headers)["status"] == "expired" and nomad.state.jobs[("finetune", job_id)]["Stop"] is True


def test_a_namespace_the_service_cannot_list_leaves_only_its_own_runs_without_an_answer(make_service, sqlite_url, k8s, fleet_runner):
    svc = make_service(sqlite_url, fleet_runner)
    research = svc.token(NS)
    a = _submit(svc, research).json()
    svc.step()
    run = _run(_state(svc, a["id"], research))
    # A second tenant namespace with a run, which the control plane identity may not list (403).
    other_ns = next(ns for ns in k8s.namespaces if ns != NS)
    with svc.ctx.sessions() as session, session.begin():
        from experiments.models import Experiment
        exp = session.get(Experiment, a["id"])
        blind_run_id = f"gke:{other_ns}/some-run"
        session.execute(Experiment.__table__.insert().values(
            **{c.name: getattr(exp, c.name) for c in Experiment.__table__.columns if c.name not in ("id", "run_id", "idempotency_key", "reconciled_at")},
            id="blind-0000", run_id=blind_run_id, idempotency_key=None, reconciled_at=None))
    k8s.fail_next("GET", f"/namespaces/{other_ns}/jobs", 403, times=10_000)
    errors_before = _metric(svc, "gpufleet_reconcile_errors_total").get("", 0.0)
    k8s.admit(NS, run, cluster_queue=NS, flavor="h100")
    k8s.pods_ready(NS, run, 2)
    svc.clock.advance(minutes=1)
    svc.step()
    assert _state(svc, a["id"], research)["status"] == "running"  # research's runs are still followed
    with svc.ctx.sessions() as session:
        blind = session.get(Experiment, "blind-0000")
        assert blind.state == "queued" and blind.reconciled_at is None  # no answer: unchanged, not stamped
    assert _metric(svc, "gpufleet_reconcile_errors_total")[""] >= errors_before + 1


def test_reconcile_lag_grows_while_a_scheduler_gives_no_answer(make_service, sqlite_url, k8s, fleet_runner):
    svc = make_service(sqlite_url, fleet_runner)
    research, finetune = svc.token(NS), svc.token("finetune")
    a = _submit(svc, research).json()
    assert svc.submit(finetune).status_code == 202
    svc.step()
    assert _state(svc, a["id"], research)["status"] == "queued"
    k8s.fail_next("GET", f"/namespaces/{NS}/jobs", 503, times=100_000)  # the GKE API down for good; Nomad answers
    for _ in range(10):
        svc.clock.advance(seconds=30)
        svc.step()
    lag = _metric(svc, "gpufleet_reconcile_lag_seconds")[""]
    assert lag >= 300, lag  # the GKE run was last answered for 5 min ago


def test_a_nomad_namespace_the_token_cannot_list_leaves_only_its_own_runs_without_an_answer(make_service, sqlite_url, nomad, nomad_runner):
    from tests.jobs.nomad_double import Fault

    svc = make_service(sqlite_url, nomad_runner)
    exp = svc.submit(svc.token("finetune")).json()
    svc.step()
    run_id = _state(svc, exp["id"], svc.token("finetune"))["run_id"]
    blind = "applied/finetune-llama/dispatch-1700000000-0123abcd"  # a namespace the ACL token may not list
    nomad.inject("GET", "allocation-list", Fault(status=403))  # the first namespace's allocation list (blind's)
    polled = nomad_runner.poll([blind, run_id], {})
    assert set(polled) == {run_id} and polled[run_id].report is not None


def test_a_run_placed_but_not_started_past_its_wrap_ttl_is_stopped_and_failed(make_service, sqlite_url, k8s, fleet_runner):
    """Kueue admitted it, but a rank never starts (images pulling for ever, a Secret it cannot
    mount): past the wrap TTL counted from dispatch it could not log in to Vault if it started,
    so it is stopped (Job deleted) and failed instead of holding 16 H100 until its deadline."""
    svc = make_service(sqlite_url, fleet_runner)
    headers = svc.token(NS)
    exp = _submit(svc, headers).json()
    svc.step()
    run = _run(_state(svc, exp["id"], headers))
    k8s.admit(NS, run, cluster_queue=NS, flavor="h100")
    k8s.pods_ready(NS, run, 1)  # one of two ranks ready
    svc.clock.advance(minutes=20)  # image pulls may take a while: within the 25 min bound nothing happens
    svc.step()
    assert _state(svc, exp["id"], headers)["status"] == "provisioning" and not k8s.job(NS, run)["metadata"].get("deletionTimestamp")
    svc.clock.advance(minutes=6)
    svc.step()
    shown = _state(svc, exp["id"], headers)
    assert shown["status"] == "failed" and "placed but not started on every rank 25 min after dispatch" in shown["reason"]
    assert k8s.job(NS, run)["metadata"].get("deletionTimestamp")


def test_the_wrap_ttl_bound_acts_only_on_what_the_scheduler_said_after_it_passed(make_service, sqlite_url, k8s, fleet_runner):
    """A queued run whose namespace cannot be read past the bound may be running by now: not killed blind."""
    svc = make_service(sqlite_url, fleet_runner)
    headers = svc.token(NS)
    exp = _submit(svc, headers).json()
    svc.step()
    run = _run(_state(svc, exp["id"], headers))
    k8s.fail_next("GET", f"/namespaces/{NS}/workloads", 503, times=100_000)  # the poll fails; a stop would still work
    k8s.admit(NS, run, cluster_queue=NS, flavor="h100")
    k8s.pods_ready(NS, run, 2)
    svc.clock.advance(hours=1)
    svc.step()
    assert _state(svc, exp["id"], headers)["status"] == "queued" and not k8s.job(NS, run)["metadata"].get("deletionTimestamp")
    k8s.faults.clear()
    svc.step()
    assert _state(svc, exp["id"], headers)["status"] == "running"


def test_a_local_development_service_on_the_production_database_leaves_production_runs_alone(make_service, db_url, nomad, nomad_runner, vault):
    """Red team (security round three): ``gpufleet serve --scheduler local`` started on the
    production database marked every Nomad/GKE run gone in one pass, freed its quota and claimed
    production dispatches. On real SQLite and PostgreSQL, the local service neither polls, stops,
    expires nor dispatches a run it did not run itself; production follows its runs after it."""
    from experiments.runner_local import LocalRunner

    prod = make_service(db_url, ClusterRunners(nomad=("prod-nomad", nomad_runner)))
    headers = prod.token("finetune")
    running, job_id = running_on_nomad(prod, nomad, headers, deadline_hours=1)
    waiting = prod.submit(headers, meta={"dataset_uri": "hf://datasets/acme/chat@v3", "run_id": "r2"}).json()  # in the outbox, not yet dispatched
    prod.close()

    local = make_service(db_url, LocalRunner({"VAULT_ADDR": vault.addr, "VAULT_TOKEN": vault.orchestrator.token}), clock=prod.clock)
    asked = len(nomad.requests)
    local.clock.advance(hours=3)  # far past the running run's 1 h deadline
    for _ in range(3):
        local.step()
    shown = _state(local, running["id"], headers)
    assert shown["status"] == "running", shown  # not "failed: the scheduler no longer knows run ..." nor expired
    assert "does not follow nomad runs" in shown["reason"]
    assert _state(local, waiting["id"], headers)["status"] == "pending"  # its dispatch is not claimed here
    assert len(nomad.requests) == asked and not nomad.state.jobs[("finetune", job_id)].get("Stop")
    local.close()

    back = make_service(db_url, ClusterRunners(nomad=("prod-nomad", nomad_runner)), clock=prod.clock)
    back.step()
    assert _state(back, running["id"], headers)["status"] == "expired" and nomad.state.jobs[("finetune", job_id)]["Stop"] is True
    assert len(nomad.dispatched(PARENT)) == 2  # the waiting run went to Nomad, exactly once


def test_two_local_services_on_one_database_leave_each_others_runs_alone(make_service, db_url, vault):
    """Red team 22: a second ``--scheduler local`` service on the same database failed the first
    one's live run as gone ("the scheduler no longer knows run local/...") in its first pass and
    freed its quota, while the first service's task still ran. Each local service now follows only
    the runs it started (scheduler ``local:<instance>``); the other's show as unobserved."""
    from experiments.runner_local import LocalRunner

    env = {"VAULT_ADDR": vault.addr, "VAULT_TOKEN": vault.orchestrator.token}
    a_runner = LocalRunner(env)
    a = make_service(db_url, a_runner)
    headers = a.token("finetune")
    exp = a.submit(headers, meta={"dataset_uri": "hf://datasets/acme/chat@v3", "run_id": "two-local"}).json()
    a.step()
    (run,) = a_runner._runs.values()
    try:
        assert _state(a, exp["id"], headers)["status"] == "running"
        b = make_service(db_url, LocalRunner(env), clock=a.clock)
        for _ in range(2):
            b.step()
        shown = _state(b, exp["id"], headers)
        assert shown["status"] == "running" and shown["reason"].startswith("unobserved: another --scheduler local service"), shown
        theirs = b.submit(headers, meta={"dataset_uri": "hf://datasets/acme/chat@v3", "run_id": "two-local-b"}).json()
        a.step()
        assert _state(a, theirs["id"], headers)["status"] == "pending"  # a does not claim b's dispatch
        b.close()
    finally:
        run.process.kill()
