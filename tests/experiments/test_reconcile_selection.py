"""Reconcile selects only what the database tracks (security round three: 4,000 junk non-GPU Jobs
carrying the ``gpufleet.dev/run`` label, which any tenant with ``edit`` may set, took every pass
from 9 ms to 3.1 s for all tenants). Measured as the objects the Kubernetes double's list answers
carried and the requests one pass made, not wall time: the cost of the victim tenant's pass and
of the whole pass stays within 1.2x."""

from __future__ import annotations

import time
import uuid

from experiments.models import Experiment
from tests.experiments.test_gke import NS, _run, _state, _submit

JUNK = 4000


def _track(svc, like_id: str, *, run_id: str, new_id: str) -> None:
    """A second tracked run (the attacker tenant's own), as a row beside ``like_id``'s."""
    with svc.ctx.sessions() as session, session.begin():
        exp = session.get(Experiment, like_id)
        session.execute(Experiment.__table__.insert().values(
            **{c.name: getattr(exp, c.name) for c in Experiment.__table__.columns if c.name not in ("id", "run_id", "idempotency_key", "reconciled_at")},
            id=new_id, run_id=run_id, idempotency_key=None, reconciled_at=None))


def _put_job(k8s, namespace: str, name: str, run_label: str) -> None:
    """A plain Job as a tenant's kubectl would create it (stored directly: 4,000 POSTs would only slow the test)."""
    uid = str(uuid.uuid4())
    with k8s._lock:
        k8s.store.version += 1
        k8s.store.objects[("jobs", namespace, name)] = {
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": namespace, "uid": uid, "resourceVersion": str(k8s.store.version), "labels": {"gpufleet.dev/run": run_label}},
            "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}, "status": {}}


def _pass_cost(svc, k8s) -> tuple[dict[str, int], int]:
    """One reconcile pass: items listed per namespace, and requests made."""
    listed, asked = dict(k8s.listed), len(k8s.requests)
    svc.step()
    per_ns: dict[str, int] = {}
    for (_, namespace), count in k8s.listed.items():
        per_ns[namespace] = per_ns.get(namespace, 0) + count - listed.get((_, namespace), 0)
    return per_ns, len(k8s.requests) - asked


def _setup(make_service, sqlite_url, k8s, fleet_runner):
    svc = make_service(sqlite_url, fleet_runner)
    headers = svc.token(NS)
    victim = _submit(svc, headers).json()
    svc.step()
    run = _run(_state(svc, victim["id"], headers))
    k8s.admit(NS, run, cluster_queue=NS, flavor="h100")
    attacker_ns = next(ns for ns in sorted(k8s.namespaces) if ns != NS)
    _put_job(k8s, attacker_ns, "attacker-run", "attacker-run")
    _track(svc, victim["id"], run_id=f"gke:{attacker_ns}/attacker-run", new_id="attacker-0001")
    svc.step()
    return svc, headers, victim, attacker_ns


def test_junk_jobs_labelled_like_runs_do_not_slow_another_tenants_pass(make_service, sqlite_url, k8s, fleet_runner):
    svc, headers, victim, attacker_ns = _setup(make_service, sqlite_url, k8s, fleet_runner)
    base_listed, base_requests = _pass_cost(svc, k8s)
    for i in range(JUNK):
        _put_job(k8s, attacker_ns, f"junk-{i:05d}", f"junk-{i:05d}")
    listed, requests = _pass_cost(svc, k8s)
    assert listed.get(NS, 0) <= 1.2 * base_listed.get(NS, 0) and sum(listed.values()) <= 1.2 * sum(base_listed.values()), (base_listed, listed)
    assert requests <= 1.2 * base_requests, (base_requests, requests)
    k8s.pods_ready(NS, _run(_state(svc, victim["id"], headers)), 2)
    svc.step()
    assert _state(svc, victim["id"], headers)["status"] == "running"  # still followed


def test_junk_jobs_copying_a_tracked_run_label_cost_only_their_own_namespace(make_service, sqlite_url, k8s, fleet_runner):
    """A tenant who copies its own tracked run's label value onto 4,000 Jobs spends only its
    namespace's budget: the victim's pass is unchanged, the whole pass is bounded, and the
    attacker's run is still answered (its own GET), never failed as gone."""
    svc, headers, victim, attacker_ns = _setup(make_service, sqlite_url, k8s, fleet_runner)
    base_listed, _ = _pass_cost(svc, k8s)
    for i in range(JUNK):
        _put_job(k8s, attacker_ns, f"junk-{i:05d}", "attacker-run")
    svc.clock.advance(minutes=1)
    listed, _ = _pass_cost(svc, k8s)
    assert listed.get(NS, 0) <= 1.2 * base_listed.get(NS, 0), (base_listed, listed)
    runner = svc.ctx.runner._gke
    assert listed[attacker_ns] <= runner.objects_per_run * 1 + runner.objects_per_namespace + 200  # the budget, plus the page that spent it
    with svc.ctx.sessions() as session:
        attacker = session.get(Experiment, "attacker-0001")
        assert attacker.state == "queued" and attacker.reconciled_at == svc.clock()  # answered in this pass, by its own GET
    assert [r for r in k8s.requests if r.method == "GET" and r.path == f"/apis/batch/v1/namespaces/{attacker_ns}/jobs/attacker-run"]


FAT_JUNK, PAD = 400, 200_000


def _put_fat_job(k8s, namespace: str, name: str, run_label: str) -> None:
    """A Job with 200 KB of annotations (legal: the API server's limit for them is 256 KiB)."""
    _put_job(k8s, namespace, name, run_label)
    with k8s._lock:
        k8s.store.objects[("jobs", namespace, name)]["metadata"]["annotations"] = {"x/pad": "a" * PAD}


def _cost_in(k8s, namespace: str, since: int) -> tuple[int, int]:
    """Requests made to ``namespace`` since request number ``since``, and the first one's position."""
    paths = [i for i, r in enumerate(k8s.requests[since:]) if f"/namespaces/{namespace}/" in r.path]
    return len(paths), (paths[0] if paths else -1)


def _sent_to(k8s, namespace: str) -> int:
    """Body bytes the double wrote for ``namespace``, once its answers stopped being written: a
    dropped answer's writer fails only when the socket buffers are full."""
    last = -1
    for _ in range(100):
        with k8s._lock:
            now = sum(n for path, n in k8s.sent.items() if f"/namespaces/{namespace}/" in path)
        if now == last:
            return now
        last = now
        time.sleep(0.1)
    return last


def test_fat_junk_copying_a_tracked_run_label_costs_bytes_only_in_its_own_namespace(make_service, sqlite_url, k8s, fleet_runner):
    """400 Jobs copying the attacker tenant's own tracked run label, each with 200 KB of
    annotations: an item budget alone let them cost ~80 MB read and decoded every pass before any
    other tenant's answer was applied. Each list answer is now read only up to its namespace's
    bytes (and deadline), pages ask for no more items than are left, and a namespace that spent
    its budget is polled after the others, with a smaller one. The victim's pass reads, decodes
    and asks exactly what it did before; the attacker's run still gets its answer, never gone."""
    svc, headers, victim, attacker_ns = _setup(make_service, sqlite_url, k8s, fleet_runner)
    runner = svc.ctx.runner._gke
    asked = len(k8s.requests)
    svc.step()
    base_calls, _ = _cost_in(k8s, NS, asked)
    base = runner.last_poll[NS]
    for i in range(FAT_JUNK):
        _put_fat_job(k8s, attacker_ns, f"junk-{i:05d}", "attacker-run")
    sent_before = _sent_to(k8s, attacker_ns)
    for _ in range(2):
        svc.clock.advance(minutes=1)
        asked = len(k8s.requests)
        svc.step()
        calls, first_victim = _cost_in(k8s, NS, asked)
        _, first_attacker = _cost_in(k8s, attacker_ns, asked)
        victim_cost, attacker_cost = runner.last_poll[NS], runner.last_poll[attacker_ns]
        assert (victim_cost.objects, calls) == (base.objects, base_calls)
        assert victim_cost.bytes <= 1.01 * base.bytes  # the same objects; their resourceVersions grow a digit at most
        assert attacker_cost.bytes <= attacker_cost.max_bytes + 64 * 1024 < FAT_JUNK * PAD / 10
    assert 0 <= first_victim < first_attacker, "the namespace that overran its budget is polled after the others"
    assert attacker_cost.max_bytes < runner.bytes_per_run + runner.bytes_per_namespace
    # What the double wrote for the attacker's namespace in both passes: a budget, plus what the
    # sockets buffered before the dropped answers' writers failed; not the 80 MB a pass once read.
    assert _sent_to(k8s, attacker_ns) - sent_before < FAT_JUNK * PAD / 2
    with svc.ctx.sessions() as session:
        attacker = session.get(Experiment, "attacker-0001")
        assert attacker.state == "queued" and attacker.reconciled_at == svc.clock()  # answered by its own GET
    k8s.pods_ready(NS, _run(_state(svc, victim["id"], headers)), 2)
    svc.step()
    assert _state(svc, victim["id"], headers)["status"] == "running"
