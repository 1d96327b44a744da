"""The GKE job client (official kubernetes package) against the local Kubernetes API double:
exactly one Job per dispatch id under retries, 5xx and lost answers, status through every
state Kueue and the Job controller report, stop, watch, and one-line errors."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from clusters.errors import UserError
from jobs.k8s.client import K8sError
from jobs.k8s.render import vault_secret
from jobs.k8s.status import State
from jobs.loader import find, load
from jobs.spec import FinetuneSpec

META = {"dataset_uri": "gs://acme-data/chat/v3/", "run_id": "r1"}


@pytest.fixture(scope="module")
def spec(cluster_configs: Any, vault_view: Any) -> FinetuneSpec:
    return load(find("finetune-llama-gke"), cluster_configs=cluster_configs, vault=vault_view)


class Minter:
    """Stands in for the Vault step here (the real one is tested against OpenBao)."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, ranks: int) -> tuple[str, list[str]]:
        self.calls.append(ranks)
        return "role-id-of-finetune", [f"wrapping-token-{len(self.calls)}-{rank}" for rank in range(ranks)]


def test_dispatch_creates_suspended_job_secret_and_service(k8s: Any, k8s_client_for: Callable[..., Any], spec: FinetuneSpec) -> None:
    mint = Minter()
    result = k8s_client_for(k8s).dispatch(spec, META, dispatch_id="d-1", mint=mint)
    assert result.created and result.namespace == "research" and result.run.startswith("finetune-llama-gke-")
    assert mint.calls == [2]
    job = k8s.job("research", result.run)
    assert job["spec"]["suspend"] is True and job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-h100"
    secret = k8s.store.objects[("secrets", "research", f"{result.run}-vault")]
    owner = secret["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"]) == ("Job", job["metadata"]["uid"])
    assert sorted(secret["data"]) == ["role-id", "wrapped-secret-id-0", "wrapped-secret-id-1"] and secret["immutable"] is True
    service = k8s.store.objects[("services", "research", result.run)]
    assert service["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    assert k8s.workload("research", result.run)["spec"]["queueName"] == "gpu-h100"
    assert all(r.body["data"] == {"role-id": "<redacted>", "wrapped-secret-id-0": "<redacted>", "wrapped-secret-id-1": "<redacted>"}
               for r in k8s.requests if r.path.endswith("/secrets") and r.method == "POST")


def test_retried_dispatch_never_creates_a_second_job_or_mints_again(k8s: Any, k8s_client_for: Callable[..., Any], spec: FinetuneSpec) -> None:
    client, mint = k8s_client_for(k8s), Minter()
    first = client.dispatch(spec, META, dispatch_id="same", mint=mint)
    again = client.dispatch(spec, META, dispatch_id="same", mint=mint)
    assert (first.run, first.created, again.run, again.created) == (again.run, True, first.run, False)
    assert len(k8s.created("jobs")) == 1 and mint.calls == [2]
    other = client.dispatch(spec, META, dispatch_id="other", mint=mint)
    assert other.run != first.run and len(k8s.created("jobs")) == 2


def test_a_5xx_then_success_creates_one_job(k8s: Any, k8s_client_for: Callable[..., Any], spec: FinetuneSpec) -> None:
    k8s.fail_next("POST", "/jobs", 503)
    result = k8s_client_for(k8s).dispatch(spec, META, dispatch_id="flaky", mint=Minter())
    posts = [r.status for r in k8s.requests if r.method == "POST" and r.path.endswith("/jobs")]
    assert posts == [503, 201] and result.created


def test_a_lost_answer_is_resolved_by_the_409_of_the_retry(k8s: Any, k8s_client_for: Callable[..., Any], spec: FinetuneSpec) -> None:
    """The create took effect but its answer was lost (500 after commit): the retry meets 409."""
    k8s.fail_next("POST", "/jobs", 500, after_commit=True)
    result = k8s_client_for(k8s).dispatch(spec, META, dispatch_id="lost", mint=Minter())
    posts = [r.status for r in k8s.requests if r.method == "POST" and r.path.endswith("/jobs")]
    assert posts == [500, 409] and [k[2] for k in k8s.store.objects if k[0] == "jobs"] == [result.run]
    assert ("secrets", "research", f"{result.run}-vault") in k8s.store.objects


def test_fails_when_the_secret_cannot_be_created_and_removes_the_job(k8s: Any, k8s_client_for: Callable[..., Any], spec: FinetuneSpec) -> None:
    k8s.fail_next("POST", "/secrets", 403)
    with pytest.raises(K8sError, match=r"^create Secret research/finetune-llama-gke-\w+-vault: Kubernetes answered 403 InternalError; your account may not") as caught:
        k8s_client_for(k8s).dispatch(spec, META, dispatch_id="no-secret", mint=Minter())
    assert "wrapping-token" not in str(caught.value)
    assert not [k for k in k8s.store.objects if k[0] in ("jobs", "workloads")]


def _lagging_garbage_collector(k8s: Any, monkeypatch: Any) -> Callable[[], None]:
    """Real Kubernetes removes a Background-deleted Job's dependents later (the garbage collector);
    the double cascades at once. Emulate the lag: dependents stay until the returned gc() runs."""
    def remove_no_cascade(key: tuple[str, str, str]) -> None:
        obj = k8s.store.objects.pop(key)
        k8s._bump(key[0], "DELETED", obj)

    def gc() -> None:
        with k8s._lock:
            uids = {o["metadata"]["uid"] for o in k8s.store.objects.values()}
            for key, obj in list(k8s.store.objects.items()):
                refs = obj["metadata"].get("ownerReferences") or []
                if refs and not any(r["uid"] in uids for r in refs):
                    remove_no_cascade(key)

    monkeypatch.setattr(k8s, "_remove", remove_no_cascade)
    return gc


def test_a_retry_replaces_the_secret_and_service_left_by_the_deleted_first_job(k8s: Any, k8s_client_for: Callable[..., Any], spec: FinetuneSpec, monkeypatch: Any) -> None:
    gc = _lagging_garbage_collector(k8s, monkeypatch)
    client, mint = k8s_client_for(k8s), Minter()
    k8s.fail_next("POST", "/services", 503, times=3)  # first attempt: Job + Secret made, the Service fails -> Job deleted
    with pytest.raises(K8sError, match="create Service"):
        client.dispatch(spec, META, dispatch_id="gc-lag", mint=mint)
    run = k8s.created("jobs")[0].body["metadata"]["name"]
    first_uid = k8s.store.objects[("secrets", "research", f"{run}-vault")]["metadata"]["ownerReferences"][0]["uid"]
    assert not [k for k in k8s.store.objects if k[0] == "jobs"]
    # A Service of the first Job lingering as well (e.g. its answer was lost after the commit).
    with k8s._lock:
        k8s.store.objects[("services", "research", run)] = {
            "apiVersion": "v1", "kind": "Service", "spec": {"clusterIP": "None"},
            "metadata": {"name": run, "namespace": "research", "uid": "old-service-uid", "resourceVersion": "1",
                         "labels": {"gpufleet.dev/run": run}, "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": run, "uid": first_uid}]}}
    result = client.dispatch(spec, META, dispatch_id="gc-lag", mint=mint)  # the retry, before the GC got to them
    job_uid = k8s.job("research", run)["metadata"]["uid"]
    assert result.created and job_uid != first_uid
    for key in (("secrets", "research", f"{run}-vault"), ("services", "research", run)):
        assert k8s.store.objects[key]["metadata"]["ownerReferences"][0]["uid"] == job_uid, key
    assert mint.calls == [2, 2]  # the old Secret's secret_ids are not reused: minted again
    deletes = [r for r in k8s.requests if r.method == "DELETE" and ("/secrets/" in r.path or "/services/" in r.path)]
    assert [r.body["preconditions"]["uid"] is not None for r in deletes] == [True, True]
    gc()  # the garbage collector catches up: nothing of the new Job's goes
    assert ("secrets", "research", f"{run}-vault") in k8s.store.objects and ("services", "research", run) in k8s.store.objects


def test_a_secret_not_made_for_the_run_is_an_error_and_left_alone(k8s: Any, k8s_client_for: Callable[..., Any], spec: FinetuneSpec) -> None:
    client = k8s_client_for(k8s)
    first = client.dispatch(spec, META, dispatch_id="foreign", mint=Minter())
    key = ("secrets", "research", f"{first.run}-vault")
    with k8s._lock:
        k8s.store.objects[key]["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "someone", "uid": "u-1"}]
    with pytest.raises(K8sError, match=rf"Secret research/{first.run}-vault exists and was not made for Job {first.run}"):
        client.dispatch(spec, META, dispatch_id="foreign", mint=Minter())
    assert key in k8s.store.objects and not [r for r in k8s.requests if r.method == "DELETE" and "/secrets/" in r.path]


def test_fails_when_the_dispatch_id_hash_names_another_dispatch(k8s: Any, k8s_client_for: Callable[..., Any], spec: FinetuneSpec) -> None:
    client = k8s_client_for(k8s)
    result = client.dispatch(spec, META, dispatch_id="mine", mint=Minter())
    k8s.job("research", result.run)["metadata"]["annotations"]["gpufleet.dev/dispatch-id"] = "someone-else"
    with pytest.raises(K8sError, match="belongs to dispatch 'someone-else', not 'mine'; pass another --dispatch-id"):
        client.dispatch(spec, META, dispatch_id="mine", mint=Minter())


def test_status_through_every_state(k8s: Any, k8s_client_for: Callable[..., Any], spec: FinetuneSpec) -> None:
    client = k8s_client_for(k8s)
    run = client.dispatch(spec, META, dispatch_id="life", mint=Minter()).run
    seen = [client.status("research", run)]
    k8s.wait_for_quota("research", run, "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu in flavor h100, 16 more needed")
    seen.append(client.status("research", run))
    k8s.admit("research", run, cluster_queue="research", flavor="h100")
    seen.append(client.status("research", run))
    k8s.pods_ready("research", run, 2)
    seen.append(client.status("research", run))
    k8s.succeed("research", run)
    seen.append(client.status("research", run))
    assert [s.state for s in seen] == [State.PENDING, State.PENDING, State.RUNNING, State.RUNNING, State.SUCCEEDED]
    assert "Kueue has not evaluated it yet" in seen[0].reason
    assert seen[1].reason.startswith("waiting for quota: Pending: couldn't assign flavors") and "16 more needed" in seen[1].reason
    assert seen[2].reason == "admitted to ClusterQueue research on flavor h100; 0/2 rank(s) ready, 2 active"
    assert "2/2 rank(s) ready" in seen[3].reason and (seen[3].queue, seen[3].flavor) == ("research", "h100")
    assert seen[4].reason == "all 2 rank(s) succeeded (CompletionsReached)"


def test_status_of_failures_deadline_and_eviction(k8s: Any, k8s_client_for: Callable[..., Any], spec: FinetuneSpec) -> None:
    client = k8s_client_for(k8s)
    late = client.dispatch(spec, META, dispatch_id="late", mint=Minter()).run
    k8s.admit("research", late, cluster_queue="research", flavor="h100")
    k8s.fail("research", late, reason="DeadlineExceeded", message="Job was active longer than specified deadline")
    status = client.status("research", late)
    assert (status.state, status.reason) == (State.FAILED, "ran past max_run_hours (activeDeadlineSeconds 72000): Job was active longer than specified deadline")

    evicted = client.dispatch(spec, META, dispatch_id="evicted", mint=Minter()).run
    k8s.admit("research", evicted, cluster_queue="research", flavor="h100")
    k8s.evict("research", evicted)
    status = client.status("research", evicted)
    assert status.state == State.PENDING
    assert status.reason.startswith("evicted by Kueue (Preempted; InClusterQueue: Preempted to accommodate") and "stop it and re-dispatch" in status.reason
    k8s.admit("research", evicted, cluster_queue="research", flavor="h100")
    k8s.fail("research", evicted, reason="PodFailurePolicy", message="Container train for pod research/x-0-abc failed with exit code 78 matching FailJob rule at index 0")
    status = client.status("research", evicted)
    assert status.state == State.FAILED and "already-used secret_id: re-dispatch it" in status.reason


def test_stop_shows_stopped_until_the_pods_are_gone(k8s: Any, k8s_client_for: Callable[..., Any], spec: FinetuneSpec) -> None:
    client = k8s_client_for(k8s)
    run = client.dispatch(spec, META, dispatch_id="stop-me", mint=Minter()).run
    k8s.admit("research", run, cluster_queue="research", flavor="h100")
    client.stop("research", run)
    assert client.status("research", run).state == State.STOPPED
    k8s.collect()
    assert not [k for k in k8s.store.objects if run in k[2]], "Secret, Service and Workload go with the Job"
    with pytest.raises(K8sError, match=r"^status: no Job .* in namespace research: it was never dispatched, or it was stopped"):
        client.status("research", run)
    with pytest.raises(K8sError, match=r"^stop: no Job"):
        client.stop("research", run)


def test_watch_follows_the_job_to_the_end(k8s: Any, k8s_client_for: Callable[..., Any], spec: FinetuneSpec) -> None:
    client = k8s_client_for(k8s)
    run = client.dispatch(spec, META, dispatch_id="watched", mint=Minter()).run

    def drive() -> None:
        time.sleep(0.3)
        k8s.admit("research", run, cluster_queue="research", flavor="h100")
        time.sleep(0.2)
        k8s.succeed("research", run)

    threading.Thread(target=drive, daemon=True).start()
    seen = []
    for job in client.watch_job("research", run, timeout_seconds=10):
        seen.append((job["spec"]["suspend"], [c["type"] for c in job["status"].get("conditions", []) if c["status"] == "True"]))
        if "Complete" in seen[-1][1]:
            break
    assert seen[0] == (True, []) and seen[-1][0] is False and "Complete" in seen[-1][1]
    assert any(r.query.get("watch") == ["True"] for r in k8s.requests)


def test_the_double_refuses_an_invalid_job_with_422(k8s: Any, k8s_client_for: Callable[..., Any], spec: FinetuneSpec) -> None:
    from jobs.k8s.render import job_manifest

    client = k8s_client_for(k8s)
    bad = job_manifest(spec, dispatch_id="bad")
    bad["spec"]["template"]["spec"]["restartPolicy"] = "Always"
    bad["spec"]["template"]["spec"]["containers"][0]["resourcez"] = {}
    with pytest.raises(K8sError, match=r"Kubernetes answered 422 Invalid \(Job \"finetune-llama-gke-\w+\" is invalid: .*'resourcez' was unexpected.*restartPolicy: Unsupported value"):
        client._create("Job", client._batch.create_namespaced_job, "research", bad)
    assert not k8s.created("jobs")


def test_fails_with_one_line_on_bad_credentials_and_unreachable_api(k8s: Any, k8s_client_for: Callable[..., Any], spec: FinetuneSpec, tmp_path: Any) -> None:
    k8s.token = "rotated"
    with pytest.raises(K8sError, match=r"^read Job research/x: Kubernetes answered 401 Unauthorized \(Unauthorized\); your credentials were refused"):
        k8s_client_for(k8s).get_job("research", "x")
    k8s.stop()
    with pytest.raises(K8sError, match=r"^read Job research/x: cannot reach the Kubernetes API after 3 attempts"):
        k8s_client_for(k8s, retries=2, timeout_seconds=1.0).get_job("research", "x")


def test_fails_when_kubeconfig_is_missing(tmp_path: Any) -> None:
    from jobs.k8s.client import K8sSettings

    with pytest.raises(UserError, match=r"KUBECONFIG '.*nope' is not a file; run `gcloud container clusters get-credentials"):
        K8sSettings.from_env({"KUBECONFIG": str(tmp_path / "nope")})
    assert K8sSettings.from_env({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}).in_cluster


def test_vault_secret_needs_one_token_per_rank(spec: FinetuneSpec) -> None:
    job = {"metadata": {"name": "r", "uid": "u"}}
    with pytest.raises(ValueError, match="1 wrapping tokens for 2 ranks"):
        vault_secret(spec, job, "role", ["t"])


def test_submit_is_a_dry_run_that_stores_nothing_and_needs_the_local_queue(k8s: Any, k8s_client_for: Callable[..., Any], spec: FinetuneSpec) -> None:
    client = k8s_client_for(k8s)
    assert client.dry_run(spec).startswith("finetune-llama-gke-")
    assert [r.query.get("dryRun") for r in k8s.requests if r.method == "POST"] == [["All"]]
    assert not k8s.store.objects
    k8s.namespaces["research"].discard("gpu-h100")
    with pytest.raises(K8sError, match=r"^submit: LocalQueue gpu-h100 does not exist in namespace research, so Kueue would never admit finetune-llama-gke; apply the prod-gke-scheduler stack"):
        client.dry_run(spec)
