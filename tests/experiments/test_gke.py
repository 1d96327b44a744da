"""GKE through the control plane: the service routes a GKE job file to the Kubernetes API (the
double of tests/jobs/k8s_double.py: Jobs, Secrets, Kueue Workloads, foreground deletion,
faults) and follows it through Kueue and the Job controller (queued until Kueue admits,
provisioning until every rank is ready, running), with real wrapped secret_ids from
the session's OpenBao.

Exactly once is counted where Kubernetes would see it: Job objects created (201) in the double.
"""

from __future__ import annotations

import base64
import logging

import pytest

from experiments.background.context import Timing
from experiments.background.dispatch import process_outbox
from experiments.scheduler import ClusterRunners, build_runners
from jobs.k8s.render import ROLE_ID_KEY
from tests.experiments.test_dispatch import Crash, CrashAfterSubmit
from tests.experiments.test_secrets_and_migrations import _database_text

NS = "research"
JOB = "finetune-llama-gke"
META = {"dataset_uri": "gs://acme-data/chat/v3/", "run_id": "llama-chat-gke-1"}
GPUS = 16  # 2 nodes x 8 H100


def _submit(svc, headers, **body):
    return svc.client.post("/api/v1/experiments", json={"job": JOB, "meta": META, **body}, headers=headers)


def _state(svc, exp_id, headers):
    return svc.client.get(f"/api/v1/experiments/{exp_id}", headers=headers).json()


def _jobs(k8s):
    return sorted(name for (resource, ns, name) in k8s.store.objects if resource == "jobs" and ns == NS)


def _run(shown):
    assert shown["run_id"].startswith(f"gke:{NS}/{JOB}-"), shown["run_id"]
    return shown["run_id"].rsplit("/", 1)[1]


def test_a_gke_experiment_goes_queued_running_succeeded_with_kueue_ids_and_cost(make_service, sqlite_url, k8s, fleet_runner):
    svc = make_service(sqlite_url, fleet_runner)
    headers = svc.token(NS)
    answer = _submit(svc, headers)
    assert answer.status_code == 202 and answer.json()["scheduler"] == "gke" and answer.json()["gpus"] == GPUS
    exp = answer.json()
    svc.step()
    shown = _state(svc, exp["id"], headers)
    run = _run(shown)
    assert _jobs(k8s) == [run] and len(k8s.created("jobs")) == 1
    # Kueue made a Workload but has not admitted it: queued, with Kueue's words.
    assert shown["status"] == "queued" and "LocalQueue gpu-h100" in shown["reason"]
    k8s.wait_for_quota(NS, run, "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu in flavor h100, 8 more needed")
    svc.step()
    shown = _state(svc, exp["id"], headers)
    assert shown["status"] == "queued" and "insufficient unused quota" in shown["reason"]
    workload = k8s.workload(NS, run)["metadata"]["name"]
    assert shown["scheduler_ids"] == {"run": shown["run_id"], "job": f"{NS}/{run}", "workload": f"{NS}/{workload}"}
    k8s.admit(NS, run, cluster_queue=NS, flavor="h100")
    svc.clock.advance(minutes=10)  # within the wrap TTL (25 min): later, not-started ranks are stopped (reap)
    svc.step()
    shown = _state(svc, exp["id"], headers)  # admitted: GPUs held, ranks starting
    assert shown["status"] == "provisioning" and "0/2 rank(s) ready" in shown["reason"]
    k8s.pods_ready(NS, run, 2)
    svc.step()
    shown = _state(svc, exp["id"], headers)
    assert shown["status"] == "running" and "admitted to ClusterQueue research" in shown["reason"]
    assert shown["scheduler_ids"]["cluster_queue"] == NS and shown["scheduler_ids"]["flavor"] == "h100"
    svc.clock.advance(hours=2)
    k8s.succeed(NS, run)
    svc.step()
    done = _state(svc, exp["id"], headers)
    assert done["status"] == "succeeded" and done["exit_code"] == 0
    assert done["gpu_hours"] == pytest.approx(2.0 * GPUS) and done["estimated_cost_usd"] == pytest.approx(2.0 * GPUS * done["price_per_gpu_hour"], abs=1e-3)
    states = [e["to"] for e in svc.client.get(f"/api/v1/experiments/{exp['id']}/events", headers=headers).json()["events"] if e["kind"] == "state"]
    assert states == ["dispatching", "queued", "provisioning", "running", "succeeded"]
    # Kubernetes removes the finished Job after its TTL; the database is the record, ids included.
    k8s.store.objects.pop(("jobs", NS, run))
    svc.step()
    after = _state(svc, exp["id"], headers)
    assert after["status"] == "succeeded" and after["scheduler_ids"]["workload"] == f"{NS}/{workload}"


@pytest.mark.parametrize(("reason", "message", "code", "expect"), [
    ("PodFailurePolicy", "Container train for pod research/x-0-abc failed with exit code 137 matching FailJob rule at index 0", 137, "OOMKilled"),
    ("DeadlineExceeded", "Job was active longer than specified deadline", None, "ran past max_run_hours"),
])
def test_a_failed_gke_run_records_the_reason_and_exit_code(make_service, sqlite_url, k8s, fleet_runner, reason, message, code, expect):
    svc = make_service(sqlite_url, fleet_runner)
    headers = svc.token(NS)
    exp = _submit(svc, headers).json()
    svc.step()
    run = _run(_state(svc, exp["id"], headers))
    k8s.admit(NS, run, cluster_queue=NS, flavor="h100")
    svc.step()
    k8s.fail(NS, run, reason=reason, message=message)
    svc.step()
    shown = _state(svc, exp["id"], headers)
    assert shown["status"] == "failed" and shown["exit_code"] == code and expect in shown["reason"]


def test_exactly_once_on_gke_when_the_process_dies_between_accept_and_dispatch(make_service, db_url, k8s, fleet_runner):
    first = make_service(db_url, fleet_runner)
    headers = first.token(NS)
    exp = _submit(first, headers).json()
    first.close()
    second = make_service(db_url, fleet_runner, clock=first.clock)
    second.step()
    second.step()
    assert len(k8s.created("jobs")) == 1 and len(k8s.created("secrets")) == 1
    assert _state(second, exp["id"], headers)["status"] == "queued"


def test_exactly_once_on_gke_when_the_process_dies_after_kubernetes_accepted(make_service, sqlite_url, k8s, fleet_runner):
    doomed = make_service(sqlite_url, CrashAfterSubmit(fleet_runner))
    headers = doomed.token(NS)
    exp = _submit(doomed, headers).json()
    with pytest.raises(Crash):
        process_outbox(doomed.ctx)
    doomed.close()
    restarted = make_service(sqlite_url, fleet_runner, clock=doomed.clock)
    restarted.clock.advance(seconds=Timing().dispatch_lease_seconds + 1)
    restarted.step()
    shown = _state(restarted, exp["id"], headers)
    assert shown["status"] == "queued" and _jobs(k8s) == [_run(shown)]
    assert len(k8s.created("jobs")) == 1 and len(k8s.created("secrets")) == 1  # secret_ids minted once: the Secret existed


def test_exactly_once_on_gke_after_503s_then_a_lost_answer(make_service, sqlite_url, k8s, fleet_runner):
    svc = make_service(sqlite_url, fleet_runner)
    headers = svc.token(NS)
    exp = _submit(svc, headers).json()
    k8s.fail_next("POST", f"/namespaces/{NS}/jobs", 503, times=3)  # more than the client's 2 retries
    svc.step()
    shown = _state(svc, exp["id"], headers)
    assert shown["status"] == "dispatching" and "503" in shown["reason"] and not _jobs(k8s)
    # The next create is stored, but its answer is lost: the retry meets 409 and adopts that Job.
    k8s.fail_next("POST", f"/namespaces/{NS}/jobs", 503, after_commit=True)
    svc.clock.advance(seconds=5)
    svc.step()
    shown = _state(svc, exp["id"], headers)
    assert shown["status"] == "queued" and _jobs(k8s) == [_run(shown)] and len(k8s.created("secrets")) == 1


def test_cancel_deletes_the_gke_job_in_the_foreground(make_service, sqlite_url, k8s, fleet_runner):
    svc = make_service(sqlite_url, fleet_runner)
    headers = svc.token(NS)
    exp = _submit(svc, headers).json()
    svc.step()
    run = _run(_state(svc, exp["id"], headers))
    k8s.admit(NS, run, cluster_queue=NS, flavor="h100")
    svc.step()
    assert svc.client.post(f"/api/v1/experiments/{exp['id']}/cancel", headers=headers).status_code == 202
    svc.step()
    assert _state(svc, exp["id"], headers)["status"] == "cancelled"
    deletes = [r for r in k8s.requests if r.method == "DELETE" and r.path.endswith(f"/jobs/{run}")]
    assert len(deletes) == 1 and deletes[0].body["propagationPolicy"] == "Foreground"
    k8s.collect()  # pods gone: the Job and its Secret (owned by the Job) go too
    assert not _jobs(k8s) and not [k for k in k8s.store.objects if k[0] == "secrets"]


def test_the_reaper_expires_an_overdue_gke_experiment(make_service, sqlite_url, k8s, fleet_runner):
    svc = make_service(sqlite_url, fleet_runner)
    headers = svc.token(NS)
    exp = _submit(svc, headers, deadline_hours=1).json()
    svc.step()
    run = _run(_state(svc, exp["id"], headers))
    k8s.admit(NS, run, cluster_queue=NS, flavor="h100")
    svc.step()
    svc.clock.advance(minutes=61)
    svc.step()
    shown = _state(svc, exp["id"], headers)
    assert shown["status"] == "expired" and "deadline of 1h" in shown["reason"]
    assert k8s.job(NS, run)["metadata"].get("deletionTimestamp")


def test_a_restart_mid_gke_run_loses_nothing(make_service, db_url, k8s, fleet_runner):
    before = make_service(db_url, fleet_runner)
    headers = before.token(NS)
    exp = _submit(before, headers).json()
    before.step()
    run = _run(_state(before, exp["id"], headers))
    k8s.admit(NS, run, cluster_queue=NS, flavor="h100")
    before.step()
    before.close()
    k8s.succeed(NS, run)
    after = make_service(db_url, fleet_runner, clock=before.clock)
    after.step()
    shown = _state(after, exp["id"], headers)
    assert shown["status"] == "succeeded" and len(k8s.created("jobs")) == 1


def test_gke_quota_is_counted_like_nomad_over_all_ranks(make_service, sqlite_url, k8s, fleet_runner):
    svc = make_service(sqlite_url, fleet_runner)
    headers = svc.token(NS)
    assert _submit(svc, headers).status_code == 202  # 16 of research's 24 H100s
    refused = _submit(svc, headers, deadline_hours=3)
    assert refused.status_code == 409 and refused.json()["field"] == "job" and "holds 16 of its 24 GPUs on pool h100" in refused.json()["error"]


def test_cross_tenant_and_unbound_cluster_are_refused(make_service, sqlite_url, k8s, nomad_runner, gke_runner):
    svc = make_service(sqlite_url, ClusterRunners(nomad=("prod-nomad", nomad_runner), gke=("dev-gke", gke_runner)))
    refused = _submit(svc, svc.token("finetune"))
    assert refused.status_code == 403 and refused.json()["field"] == "job"
    unbound = _submit(svc, svc.token(NS))
    assert unbound.status_code == 422 and unbound.json()["field"] == "job" and "--gke-cluster prod-gke" in unbound.json()["fix"]
    assert {r.path for r in k8s.requests} <= {"/api/v1/namespaces/kube-system"}  # only asked which cluster it is


def test_no_secret_reaches_the_database_logs_or_responses_on_the_gke_path(make_service, db_url, k8s, fleet_runner, vault, caplog):
    caplog.set_level(logging.DEBUG)
    svc = make_service(db_url, fleet_runner)
    headers, admin = svc.token(NS), svc.token(None, admin=True)
    answer = _submit(svc, headers)
    responses = [answer.text]
    exp = answer.json()
    svc.step()
    run = _run(_state(svc, exp["id"], headers))
    secret = k8s.store.objects[("secrets", NS, f"{run}-vault")]
    decoded = {key: base64.b64decode(value).decode() for key, value in secret["data"].items()}
    wrapping_tokens = [value for key, value in decoded.items() if key != ROLE_ID_KEY]
    assert len(wrapping_tokens) == 2 and all(len(t) > 20 for t in wrapping_tokens)  # one per rank, only in the Secret
    k8s.admit(NS, run, cluster_queue=NS, flavor="h100")
    svc.step()
    k8s.succeed(NS, run)
    svc.step()
    for path in ("", "/events"):
        responses.append(svc.client.get(f"/api/v1/experiments/{exp['id']}{path}", headers=headers).text)
    responses += [svc.client.get(p, headers=admin).text for p in ("/api/v1/experiments", "/api/v1/costs", "/metrics", "/healthz")]
    secrets = {*wrapping_tokens, vault.orchestrator.token, k8s.token, headers["Authorization"].removeprefix("Bearer "), admin["Authorization"].removeprefix("Bearer ")}
    recorded = "\n".join(repr(r.body) for r in k8s.requests if r.body is not None and r.body.get("kind") != "Secret")
    haystacks = {"database": _database_text(svc), "logs": caplog.text, "responses": "\n".join(responses), "Kubernetes objects other than the Secret": recorded}
    assert "dispatched experiment" in caplog.text and f"gke:{NS}/{run}" in caplog.text
    for where, haystack in haystacks.items():
        leaked = [f"{s[:6]}..." for s in secrets if s in haystack]
        assert not leaked, f"secret values found in the {where}: {leaked}"


def test_serve_binds_clusters_by_name(catalog, k8s, vault, monkeypatch):
    env = {"VAULT_ADDR": vault.addr, "VAULT_TOKEN": vault.orchestrator.token}
    runners = build_runners(catalog.configs, env, nomad_cluster=None, gke_cluster=None, environ={"NOMAD_ADDR": "http://127.0.0.1:4646"})
    assert runners.clusters == {"prod-nomad": "nomad"}  # the only Nomad cluster; GKE only when named
    runners = build_runners(catalog.configs, env, nomad_cluster=None, gke_cluster="prod-gke", environ={"KUBECONFIG": str(k8s.kubeconfig_path)})
    assert runners.clusters == {"prod-gke": "gke"}  # no NOMAD_ADDR: the Nomad cluster is not bound by default
    from clusters.errors import UserError

    # Issue: serve with no NOMAD_ADDR accepted runs and retried them against 127.0.0.1:4646 for 15 minutes.
    with pytest.raises(UserError, match="bound to no scheduler: set NOMAD_ADDR"):
        build_runners(catalog.configs, env, nomad_cluster=None, gke_cluster=None, environ={})
    with pytest.raises(UserError, match="cluster prod-nomad \\(nomad\\) is bound to this service but NOMAD_ADDR is not set"):
        build_runners(catalog.configs, env, nomad_cluster="prod-nomad", gke_cluster=None, environ={})

    with pytest.raises(UserError, match="--gke-cluster 'prod-nomad' is not a gke cluster in clusters/; allowed: dev-gke, prod-gke, train-a3mega"):
        build_runners(catalog.configs, env, nomad_cluster=None, gke_cluster="prod-nomad", environ={})
