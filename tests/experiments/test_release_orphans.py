"""Proof of release and the orphan scan (issue 25), against the Nomad and Kubernetes API doubles.

Allocation stubs are hashicorp/nomad api/allocations.go ``AllocationListStub`` (ID, Namespace, JobID,
NodeName, DesiredStatus, ClientStatus...), client statuses nomad/structs/alloc.go:29-36; job stubs
nomad/structs/structs.go ``JobListStub`` with ``Meta`` (``?meta=true``, command/agent/job_endpoint.go:45-52);
``namespace=*`` is structs.AllNamespacesSentinel (structs.go:187). Pods are core/v1 as the double's Job
controller makes them (labels, controller ownerReference, phase).
"""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import select

from experiments.models import Event, Experiment
from experiments.scheduler import ClusterRunners
from experiments.services.catalog import Catalog
from jobs.loader import find, load
from jobs.spec import EXPERIMENT_META
from tests.conftest import load_fleet

PARENT = "finetune-llama"
META = {"dataset_uri": "hf://datasets/acme/chat@v3", "run_id": "r1"}


def _metric(svc: Any, name: str) -> dict[str, float]:
    out = {}
    for line in svc.client.get("/metrics", headers=svc.token(None, admin=True)).text.splitlines():
        if m := re.match(rf"^{name}(\{{[^}}]*\}})? (\S+)$", line):
            out[m.group(1) or ""] = float(m.group(2))
    return out


def _events(svc: Any, kind: str, experiment: str | None = "any") -> list[Event]:
    with svc.ctx.sessions() as session:
        query = select(Event).where(Event.kind == kind)
        if experiment != "any":
            query = query.where(Event.experiment_id.is_(None) if experiment is None else Event.experiment_id == experiment)
        return list(session.scalars(query.order_by(Event.id)))


def _experiment(svc: Any, exp_id: str) -> Experiment:
    with svc.ctx.sessions() as session:
        exp = session.get(Experiment, exp_id)
        assert exp is not None
        return exp


def _stop_catalog() -> Catalog:
    return Catalog(configs=tuple(c.model_copy(update={"orphans": "stop"}) for c in load_fleet()))


def _deletes(nomad: Any) -> list[str]:
    return [r.path for r in nomad.requests if r.method == "DELETE"]


def test_a_run_that_ended_is_proven_released(make_service, sqlite_url, nomad, nomad_runner):
    svc = make_service(sqlite_url, ClusterRunners(nomad=("prod-nomad", nomad_runner)))
    headers = svc.token("finetune")
    exp = svc.submit(headers).json()
    svc.step()
    job_id = nomad.dispatched(PARENT)[0]
    nomad.finish(job_id, client_status="running")
    svc.step()
    assert not _events(svc, "released") and _experiment(svc, exp["id"]).released_at is None  # running: nothing to prove yet
    nomad.finish(job_id, client_status="complete", events=[{"Type": "Terminated", "Time": 2, "ExitCode": 0}])
    svc.step()
    released = _events(svc, "released", exp["id"])
    assert len(released) == 1 and "every allocation of it is terminal" in released[0].message
    assert _experiment(svc, exp["id"]).released_at == svc.clock() and _metric(svc, "gpufleet_runs_not_released") == {"": 0.0}
    svc.step()
    assert len(_events(svc, "released", exp["id"])) == 1  # proven once


def test_an_ended_run_whose_allocation_still_runs_is_not_released_until_it_stops(make_service, sqlite_url, nomad, nomad_runner):
    """A cancel stops the job on the servers (DesiredStatus stop); until the client reports the task
    gone, the allocation still holds its GPUs: a warning naming it, re-checked each pass."""
    svc = make_service(sqlite_url, ClusterRunners(nomad=("prod-nomad", nomad_runner)))
    headers = svc.token("finetune")
    exp = svc.submit(headers).json()
    svc.step()
    job_id = nomad.dispatched(PARENT)[0]
    nomad.finish(job_id, client_status="running")
    svc.step()
    svc.client.post(f"/api/v1/experiments/{exp['id']}/cancel", headers=headers)
    svc.step()
    assert _experiment(svc, exp["id"]).state == "cancelled" and nomad.state.jobs[("finetune", job_id)]["Stop"] is True
    assert not _events(svc, "not-released")  # within the grace a stopped task has to exit
    svc.clock.advance(minutes=6)
    svc.step()
    svc.step()
    warned = _events(svc, "not-released", exp["id"])
    alloc = nomad.state.allocations[job_id][0]["ID"]
    assert len(warned) == 1 and f"allocation {alloc} (running on " in warned[0].message  # once, not every pass
    assert _experiment(svc, exp["id"]).released_at is None and _metric(svc, "gpufleet_runs_not_released") == {"": 1.0}
    nomad.finish(job_id, client_status="complete")
    svc.step()
    assert len(_events(svc, "released", exp["id"])) == 1 and _metric(svc, "gpufleet_runs_not_released") == {"": 0.0}


def _stray(nomad: Any, cluster_configs: Any, vault_view: Any, token: str, meta: dict[str, str] | None = None) -> str:
    """A run of gpufleet's job that no experiment here made (an operator dispatch), running."""
    spec = load(find(PARENT), cluster_configs=cluster_configs, vault=vault_view)
    from jobs.nomad.client import NomadClient, NomadSettings

    client = NomadClient(NomadSettings(address=nomad.address, token=nomad.acl_token, timeout_seconds=5.0, retries=2, backoff_seconds=0.01))
    try:
        client.register(spec)
        client.dispatch(spec, {**META, **(meta or {})}, role_id="role", wrapping_token="s.wrap", idempotency_token=token)
    finally:
        client.close()
    job_id = nomad.dispatched(PARENT)[-1]
    nomad.finish(job_id, client_status="running")
    return job_id


def _foreign(nomad: Any, job_id: str, meta: dict[str, str]) -> None:
    """A job somebody else runs in the same namespace, with a running allocation (stubs as Nomad lists them)."""
    nomad.state.jobs[("finetune", job_id)] = {"ID": job_id, "Name": job_id, "Namespace": "finetune", "ParentID": job_id.split("/")[0],
                                               "Type": "batch", "Meta": meta, "TaskGroups": [{"Name": "g", "Count": 1}], "Status": "running"}
    nomad.state.allocations[job_id] = [{"ID": f"alloc-{job_id.replace('/', '-')}", "EvalID": "e", "Name": f"{job_id}.g[0]", "Namespace": "finetune",
                                        "NodeID": "node-x", "NodeName": "x", "JobID": job_id, "JobType": "batch", "TaskGroup": "g",
                                        "DesiredStatus": "run", "ClientStatus": "running", "TaskStates": {}, "CreateIndex": 1, "ModifyIndex": 1}]


def test_an_orphan_allocation_is_reported_and_nothing_not_ours_is(make_service, sqlite_url, nomad, nomad_runner):
    configs = load_fleet()
    from jobs.vault_refs import load_vault_view

    svc = make_service(sqlite_url, ClusterRunners(nomad=("prod-nomad", nomad_runner)))
    stray = _stray(nomad, configs, load_vault_view(), "operator-1")
    _foreign(nomad, "etl/dispatch-1", {"team": "data"})  # not gpufleet's at all
    _foreign(nomad, "finetune-llama/dispatch-9", {"gpufleet_cluster": "staging-nomad"})  # gpufleet's, of another cluster
    svc.step()
    svc.step()
    orphans = _events(svc, "orphan")
    assert len(orphans) == 1 and orphans[0].experiment_id is None  # reported once, though seen in two passes
    assert f"run finetune/{stray} holds GPUs" in orphans[0].message and "no experiment here owns it" in orphans[0].message
    assert "policy orphans: report" in orphans[0].message
    assert _metric(svc, "gpufleet_orphans") == {'{cluster="prod-nomad",scheduler="nomad"}': 1.0}
    assert _deletes(nomad) == []  # report only: nothing stopped
    scans = [c for c in nomad.calls("GET", "allocation-list") if c.query.get("namespace") == ["*"]]
    assert len(scans) == 2  # one allocation list for every namespace per pass


def test_policy_stop_stops_the_orphan_after_two_passes_and_never_what_is_not_ours(make_service, sqlite_url, nomad, nomad_runner):
    from jobs.vault_refs import load_vault_view

    svc = make_service(sqlite_url, ClusterRunners(nomad=("prod-nomad", nomad_runner)), jobs=_stop_catalog())
    stray = _stray(nomad, load_fleet(), load_vault_view(), "operator-2")
    _foreign(nomad, "etl/dispatch-1", {"team": "data"})
    _foreign(nomad, "finetune-llama/dispatch-9", {"gpufleet_cluster": "staging-nomad"})
    svc.step()
    assert _deletes(nomad) == []  # seen once: reported, not yet stopped
    svc.step()
    assert _deletes(nomad) == [f"/v1/job/{stray}"] and nomad.state.jobs[("finetune", stray)]["Stop"] is True
    assert not nomad.state.jobs[("finetune", "etl/dispatch-1")].get("Stop")
    assert not nomad.state.jobs[("finetune", "finetune-llama/dispatch-9")].get("Stop")
    stopped = _events(svc, "orphan-stopped")
    assert len(stopped) == 1 and "stopped on prod-nomad (policy orphans: stop)" in stopped[0].message
    assert _metric(svc, "gpufleet_orphans_stopped_total") == {'{cluster="prod-nomad"}': 1.0}
    svc.step()
    assert len(_deletes(nomad)) == 1  # stopped once


def test_a_live_experiments_attempt_is_not_an_orphan_before_its_run_id_is_recorded(make_service, sqlite_url, nomad, nomad_runner):
    """The dispatch meta names the experiment: a run placed before the dispatcher stored its id (or a new
    attempt of a live experiment) belongs to that experiment, under the stop policy too."""
    from jobs.vault_refs import load_vault_view

    svc = make_service(sqlite_url, ClusterRunners(nomad=("prod-nomad", nomad_runner)), jobs=_stop_catalog())
    headers = svc.token("finetune")
    exp = svc.client.post("/api/v1/experiments", json={"job": PARENT, "meta": META}, headers=headers).json()  # pending, not dispatched
    _stray(nomad, load_fleet(), load_vault_view(), "attempt-x", {EXPERIMENT_META: exp["id"]})
    from experiments.background.orphans import process_holders

    process_holders(svc.ctx)
    process_holders(svc.ctx)
    assert _events(svc, "orphan") == [] and _deletes(nomad) == []


def test_an_ended_experiments_run_still_holding_gpus_is_an_orphan(make_service, sqlite_url, nomad, nomad_runner):
    svc = make_service(sqlite_url, ClusterRunners(nomad=("prod-nomad", nomad_runner)))
    headers = svc.token("finetune")
    exp = svc.submit(headers).json()
    svc.step()
    job_id = nomad.dispatched(PARENT)[0]
    nomad.finish(job_id, client_status="running")
    svc.step()
    svc.client.post(f"/api/v1/experiments/{exp['id']}/cancel", headers=headers)
    svc.step()
    orphans = _events(svc, "orphan", exp["id"])
    assert len(orphans) == 1 and f"experiment {exp['id']} is cancelled" in orphans[0].message


GKE_NS = "research"
GKE_JOB = "finetune-llama-gke"
GKE_META = {"dataset_uri": "gs://acme-data/chat/v3/", "run_id": "llama-chat-gke-1"}


def test_gke_release_waits_until_the_pods_are_gone_and_a_stray_job_is_an_orphan(make_service, sqlite_url, k8s, fleet_runner):
    from jobs.k8s.client import K8sClient, K8sSettings

    svc = make_service(sqlite_url, fleet_runner, jobs=_stop_catalog())
    headers = svc.token(GKE_NS)
    exp = svc.client.post("/api/v1/experiments", json={"job": GKE_JOB, "meta": GKE_META}, headers=headers).json()
    svc.step()
    run = _experiment(svc, exp["id"]).run_id.rsplit("/", 1)[1]
    assert k8s.job(GKE_NS, run)["metadata"]["labels"]["gpufleet.dev/experiment"] == exp["id"]
    k8s.admit(GKE_NS, run, cluster_queue=GKE_NS, flavor="h100")
    k8s.pods_ready(GKE_NS, run, 2)
    svc.step()
    svc.client.post(f"/api/v1/experiments/{exp['id']}/cancel", headers=headers)
    svc.step()  # the Job is deleted in the foreground: its pods still run until the garbage collector is done
    svc.clock.advance(minutes=6)
    svc.step()
    warned = _events(svc, "not-released", exp["id"])
    assert len(warned) == 1 and warned[0].message.count("pod ") == 2 and "(Running on gke-node-" in warned[0].message
    k8s.collect()
    svc.step()
    assert len(_events(svc, "released", exp["id"])) == 1 and "no pod of it is left unfinished" in _events(svc, "released", exp["id"])[0].message
    # A Job dispatched from the command line (gpufleet's marks, no experiment here) is an orphan; stopped on the second pass.
    spec = load(find(GKE_JOB), cluster_configs=load_fleet())
    client = K8sClient(K8sSettings(kubeconfig=str(k8s.kubeconfig_path), timeout_seconds=5.0, retries=2, backoff_seconds=0.01))
    try:
        stray = client.dispatch(spec, dict(GKE_META), dispatch_id="operator-7", mint=lambda ranks: ("role", ["s.w"] * ranks)).run
    finally:
        client.close()
    k8s.admit(GKE_NS, stray, cluster_queue=GKE_NS, flavor="h100")
    k8s.pods_ready(GKE_NS, stray, 2)
    svc.step()
    orphans = [e for e in _events(svc, "orphan", None) if f"gke:{GKE_NS}/{stray}" in e.message]
    assert len(orphans) == 2 and all("no experiment here owns it" in e.message for e in orphans)  # one per pod
    assert not k8s.job(GKE_NS, stray)["metadata"].get("deletionTimestamp")
    svc.step()
    assert k8s.job(GKE_NS, stray)["metadata"].get("deletionTimestamp")
    assert len([e for e in _events(svc, "orphan-stopped") if stray in e.message]) == 1
