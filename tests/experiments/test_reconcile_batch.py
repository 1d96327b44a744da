"""The reconciler asks each scheduler in list calls, not 3 GETs per run: against the Nomad double
(``GET /v1/jobs?prefix=``, ``GET /v1/allocations``) and the Kubernetes double (Jobs and Kueue
Workloads listed per namespace), counting the requests each pass makes."""

from __future__ import annotations

from experiments.background import reconcile
from experiments.background.context import Timing

PARENT = "finetune-llama"
META = {"dataset_uri": "hf://datasets/acme/chat@v3"}


def _per_run_gets(nomad) -> int:
    return sum(len(nomad.calls("GET", route)) for route in ("job", "evaluations", "allocations"))


def _lists(nomad) -> tuple[int, int]:
    """The reconciler's lists (per namespace); the GPU holder scan's ``namespace=*`` lists are counted by ``_scans``."""
    return tuple(len([c for c in nomad.calls("GET", route) if c.query.get("namespace") != ["*"]]) for route in ("register", "allocation-list"))


def _scans(nomad) -> tuple[int, int]:
    """experiments.background.orphans: one job list (with meta) and one allocation list for every namespace, per pass."""
    return tuple(len([c for c in nomad.calls("GET", route) if c.query.get("namespace") == ["*"]]) for route in ("register", "allocation-list"))


def _states(svc, ids, headers):
    return [svc.client.get(f"/api/v1/experiments/{i}", headers=headers).json() for i in ids]


def test_a_nomad_pass_is_two_list_calls_and_reads_only_changed_runs(make_service, sqlite_url, nomad, nomad_runner, monkeypatch):
    monkeypatch.setattr(reconcile, "COMMIT_BATCH", 2)  # several commits per pass
    svc = make_service(sqlite_url, nomad_runner)
    headers = svc.token("finetune")
    ids = [svc.submit(headers, meta={**META, "run_id": f"r{i}"}).json()["id"] for i in range(5)]
    svc.step()  # dispatch all five; the double has 4 A100s: four placed, one blocked
    shown = _states(svc, ids, headers)
    assert sorted(s["status"] for s in shown) == ["provisioning"] * 4 + ["queued"]
    # First read: the four with allocations come from the lists; only the queued one (no allocation:
    # its evaluations say why) costs its own 3 GETs.
    assert _per_run_gets(nomad) == 3 and _lists(nomad) == (1, 1)
    svc.step()  # nothing changed: two list calls, no GET
    assert _per_run_gets(nomad) == 3 and _lists(nomad) == (2, 2) and _scans(nomad) == (2, 2)
    assert [c for c in nomad.calls("GET", "register") if "prefix" in c.query][-1].query["prefix"] == [f"{PARENT}/dispatch-"]
    by_run = {s["run_id"].split("/", 1)[1]: s["id"] for s in shown}
    placed = [job for job in nomad.dispatched(PARENT) if nomad.state.allocations[job]]
    nomad.finish(placed[0], client_status="complete", events=[{"Type": "Terminated", "Time": 2, "ExitCode": 0}])
    nomad.finish(placed[1], client_status="failed", failed=True, events=[{"Type": "Terminated", "Time": 2, "ExitCode": 3, "DisplayMessage": "Exit Code: 3"}])
    for job in placed[2:]:
        nomad.finish(job, client_status="running")
    svc.step()
    assert _per_run_gets(nomad) == 3  # four changed runs, all read from the list answers
    after = {s["id"]: s for s in _states(svc, ids, headers)}
    assert (after[by_run[placed[0]]]["status"], after[by_run[placed[0]]]["exit_code"]) == ("succeeded", 0)
    assert (after[by_run[placed[1]]]["status"], after[by_run[placed[1]]]["exit_code"]) == ("failed", 3)
    assert [after[by_run[j]]["status"] for j in placed[2:]] == ["running", "running"]
    assert after[by_run[placed[2]]]["scheduler_ids"]["allocation"].startswith("alloc-")


def test_an_unchanged_run_is_still_read_in_full_after_refresh_seconds(make_service, sqlite_url, nomad, nomad_runner):
    for node in nomad.nodes:
        node.gpus_used = node.gpus  # nothing places: the run stays queued, its reason comes from GETs
    svc = make_service(sqlite_url, nomad_runner, timing=Timing(refresh_seconds=0))
    headers = svc.token("finetune")
    exp = svc.submit(headers, meta={**META, "run_id": "q"}).json()
    svc.step()
    svc.step()
    assert _per_run_gets(nomad) == 6 and "waiting for capacity" in _states(svc, [exp["id"]], headers)[0]["reason"]


def test_a_run_missing_from_the_lists_and_from_its_own_get_fails_as_forgotten(make_service, sqlite_url, nomad, nomad_runner):
    svc = make_service(sqlite_url, nomad_runner)
    headers = svc.token("finetune")
    exp = svc.submit(headers, meta={**META, "run_id": "gone"}).json()
    svc.step()
    job = nomad.dispatched(PARENT)[0]
    del nomad.state.jobs[("finetune", job)]
    svc.step()
    shown = _states(svc, [exp["id"]], headers)[0]
    assert shown["status"] == "failed" and "no longer knows run" in shown["reason"]


def test_a_gke_pass_lists_jobs_and_workloads_per_namespace_and_gets_nothing(make_service, sqlite_url, k8s, fleet_runner):
    svc = make_service(sqlite_url, fleet_runner)
    headers = svc.token("research")
    exp = svc.client.post("/api/v1/experiments", json={"job": "finetune-llama-gke", "meta": {"dataset_uri": "gs://acme-data/chat/v3/", "run_id": "b"}},
                          headers=headers).json()
    svc.step()
    run = svc.client.get(f"/api/v1/experiments/{exp['id']}", headers=headers).json()["run_id"].rsplit("/", 1)[1]
    k8s.admit("research", run, cluster_queue="research", flavor="h100")
    k8s.pods_ready("research", run, 2)
    before = len([r for r in k8s.requests if r.method == "GET" and r.path.endswith(f"/jobs/{run}")])
    for _ in range(2):
        svc.step()
    job_lists = [r for r in k8s.requests if r.method == "GET" and r.path == "/apis/batch/v1/namespaces/research/jobs"]
    workload_lists = [r for r in k8s.requests if r.method == "GET" and r.path == "/apis/kueue.x-k8s.io/v1beta2/namespaces/research/workloads"]
    assert len(job_lists) == 3 and len(workload_lists) >= 3 and job_lists[-1].query["labelSelector"] == [f"gpufleet.dev/run in ({run})"]
    assert len([r for r in k8s.requests if r.method == "GET" and r.path.endswith(f"/jobs/{run}")]) == before  # no per-run GET
    assert svc.client.get(f"/api/v1/experiments/{exp['id']}", headers=headers).json()["status"] == "running"


def test_one_scheduler_down_does_not_hold_up_the_other(make_service, sqlite_url, nomad, k8s, fleet_runner):
    from tests.jobs.nomad_double import Fault

    svc = make_service(sqlite_url, fleet_runner)
    finetune, research = svc.token("finetune"), svc.token("research")
    nomad_exp = svc.submit(finetune, meta={**META, "run_id": "n"}).json()
    gke_exp = svc.client.post("/api/v1/experiments", json={"job": "finetune-llama-gke", "meta": {"dataset_uri": "gs://acme-data/chat/v3/", "run_id": "g"}},
                              headers=research).json()
    svc.step()
    run = svc.client.get(f"/api/v1/experiments/{gke_exp['id']}", headers=research).json()["run_id"].rsplit("/", 1)[1]
    k8s.admit("research", run, cluster_queue="research", flavor="h100")
    k8s.pods_ready("research", run, 2)
    nomad.inject("GET", "register", *[Fault(status=503)] * 3)  # the job list fails past the client's retries
    svc.step()
    assert svc.client.get(f"/api/v1/experiments/{gke_exp['id']}", headers=research).json()["status"] == "running"
    assert svc.client.get(f"/api/v1/experiments/{nomad_exp['id']}", headers=finetune).json()["status"] == "provisioning"  # unchanged, asked again next pass


def test_a_gke_job_missing_from_the_list_is_confirmed_by_its_own_get(make_service, sqlite_url, k8s, fleet_runner):
    svc = make_service(sqlite_url, fleet_runner)
    headers = svc.token("research")
    exp = svc.client.post("/api/v1/experiments", json={"job": "finetune-llama-gke", "meta": {"dataset_uri": "gs://acme-data/chat/v3/", "run_id": "c"}},
                          headers=headers).json()
    svc.step()
    run = svc.client.get(f"/api/v1/experiments/{exp['id']}", headers=headers).json()["run_id"].rsplit("/", 1)[1]
    k8s.admit("research", run, cluster_queue="research", flavor="h100")
    gets_before = len([r for r in k8s.requests if r.method == "GET" and r.path.endswith(f"/jobs/{run}")])
    del k8s.store.objects[("jobs", "research", run)]
    svc.step()
    shown = svc.client.get(f"/api/v1/experiments/{exp['id']}", headers=headers).json()
    assert shown["status"] == "failed" and "no longer knows run" in shown["reason"]
    assert len([r for r in k8s.requests if r.method == "GET" and r.path.endswith(f"/jobs/{run}")]) == gets_before + 1


def test_most_runs_of_a_cluster_vanishing_at_once_are_not_failed_in_that_pass(make_service, sqlite_url, nomad, nomad_runner):
    """Defence in depth behind the identity check: one run the scheduler no longer knows is
    failed as forgotten, but most of a cluster's polled runs unknown at once (3 of 3 here) means
    another scheduler answered more likely than that they were all lost. The cluster counts as
    unobserved for that pass: none is failed, their GPUs stay held, their reason says why."""
    svc = make_service(sqlite_url, nomad_runner)
    headers = svc.token("finetune")
    ids = [svc.submit(headers, meta={**META, "run_id": f"v{i}"}).json()["id"] for i in range(4)]
    svc.step()
    jobs = nomad.dispatched(PARENT)
    ids = [nomad.state.jobs[("finetune", job)]["DispatchIdempotencyToken"] for job in jobs]  # dispatched concurrently: in any order
    for job in jobs:
        nomad.finish(job, client_status="running")
    svc.step()
    assert [s["status"] for s in _states(svc, ids, headers)] == ["running"] * 4
    nomad.gc(jobs[0])  # one lost: failed as forgotten, as before
    svc.step()
    assert [s["status"] for s in _states(svc, ids, headers)] == ["failed"] + ["running"] * 3
    for job in jobs[1:]:
        nomad.gc(job)
    for _ in range(2):
        svc.step()
        shown = _states(svc, ids[1:], headers)
        assert [s["status"] for s in shown] == ["running"] * 3, shown
        assert all(s["reason"].startswith("unobserved: 3 of the 3 runs of ") for s in shown)
