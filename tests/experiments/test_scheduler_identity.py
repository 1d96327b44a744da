"""A binding checks the scheduler's identity, not only a cluster name (security round three: a
service bound to the right cluster name but pointed at the wrong scheduler address failed every
production run as gone). Two services share one real SQLite and one real PostgreSQL database:
production, bound to its cluster, and a second one bound to the same name but reaching another
scheduler (another Nomad with the same region name; another Kubernetes API server with the same
namespaces). The second starts degraded and says so, and leaves production's runs alone: not
polled there, not failed as gone, not expired, not dispatched, quota still held; production goes
on following them."""

from __future__ import annotations

from jobs.k8s.client import K8sClient, K8sSettings
from jobs.nomad.client import NomadClient, NomadSettings
from jobs.runner import GkeRunner, NomadRunner
from experiments.routers.ops import UNOBSERVED
from experiments.scheduler import ClusterRunners
from tests.experiments.test_dispatch import PARENT, running_on_nomad
from tests.experiments.test_gke import NS, _run, _state, _submit
from tests.jobs.conftest import a100_nodes
from tests.jobs.k8s_double import K8sDouble
from tests.jobs.nomad_double import NomadDouble


def _vault_env(vault):
    return {"VAULT_ADDR": vault.addr, "VAULT_TOKEN": vault.orchestrator.token}


def test_a_service_reaching_another_nomad_under_the_right_name_leaves_production_alone(make_service, db_url, nomad, nomad_runner, vault):
    prod = make_service(db_url, ClusterRunners(nomad=("prod-nomad", nomad_runner)))
    headers = prod.token("finetune")
    running, job_id = running_on_nomad(prod, nomad, headers, deadline_hours=1)

    wrong = NomadDouble(a100_nodes(), acl_token=nomad.acl_token, region=nomad.region).start()  # same region name, other servers
    client = NomadClient(NomadSettings(address=wrong.address, token=wrong.acl_token, timeout_seconds=2.0, retries=1, backoff_seconds=0.01))
    try:
        other = make_service(db_url, ClusterRunners(nomad=("prod-nomad", NomadRunner(client, _vault_env(vault)))), clock=prod.clock)
        health = other.client.get("/healthz").json()
        assert health["status"] == "degraded" and health["unobserved"] == {"prod-nomad": UNOBSERVED}
        assert wrong.address not in str(health) and nomad.address not in str(health)  # anyone may ask /healthz
        waiting = other.submit(headers, meta={"dataset_uri": "hf://datasets/acme/chat@v3", "run_id": "r2"}).json()
        other.clock.advance(hours=3)  # far past the running run's 1 h deadline
        for _ in range(3):
            other.step()
        shown = _state(other, running["id"], headers)
        assert shown["status"] == "running", shown  # not "failed: the scheduler no longer knows run ...", not expired
        assert shown["reason"].startswith("unobserved: ") and "point NOMAD_ADDR at prod-nomad" in shown["reason"]
        assert _state(other, waiting["id"], headers)["status"] == "pending"  # not dispatched to the wrong Nomad
        # Asked who it is (and, by /healthz, whether it answers), nothing else.
        assert {r.path for r in wrong.requests} <= {"/v1/agent/members", "/v1/status/leader"} and wrong.requests
        assert not nomad.state.jobs[("finetune", job_id)].get("Stop")
        # Production, on the same database at the same time, still follows and dispatches its runs.
        prod.step()
        assert len(nomad.dispatched(PARENT)) == 2 and _state(prod, waiting["id"], headers)["status"] in ("queued", "provisioning")
        assert _state(prod, running["id"], headers)["status"] == "expired" and nomad.state.jobs[("finetune", job_id)]["Stop"] is True
    finally:
        client.close()
        wrong.stop()


def test_a_service_reaching_another_kubernetes_cluster_under_the_right_name_leaves_production_alone(make_service, db_url, k8s, fleet_runner,
                                                                                                    nomad_runner, vault, tmp_path):
    prod = make_service(db_url, fleet_runner)
    headers = prod.token(NS)
    exp = _submit(prod, headers, deadline_hours=1).json()
    prod.step()
    run = _run(_state(prod, exp["id"], headers))
    k8s.admit(NS, run, cluster_queue=NS, flavor="h100")
    k8s.pods_ready(NS, run, 2)
    prod.step()
    assert _state(prod, exp["id"], headers)["status"] == "running"

    wrong = K8sDouble(namespaces={ns: set(queues) for ns, queues in k8s.namespaces.items()}).start()  # another cluster, same tenants
    client = K8sClient(K8sSettings(kubeconfig=str(wrong.kubeconfig(tmp_path / "wrong-kubeconfig")), timeout_seconds=5.0, retries=1, backoff_seconds=0.01))
    try:
        runners = ClusterRunners(nomad=("prod-nomad", nomad_runner), gke=("prod-gke", GkeRunner(client, _vault_env(vault))))
        other = make_service(db_url, runners, clock=prod.clock)
        assert "prod-gke" in other.client.get("/healthz").json()["unobserved"] and "prod-nomad" not in runners.blocked
        other.clock.advance(hours=3)
        for _ in range(3):
            other.step()
        shown = _state(other, exp["id"], headers)
        assert shown["status"] == "running", shown
        assert shown["reason"].startswith("unobserved: ") and "is not the one prod-gke's runs were made on" in shown["reason"]
        # Asked who it is (and, by /healthz, whether it answers): no Job listed, read or deleted there.
        assert {r.path for r in wrong.requests} - {"/version", "/version/"} == {"/api/v1/namespaces/kube-system"}
        # Its quota stays held: research's 24 H100 hold this 16-GPU run, so a second one is refused.
        second = _submit(other, headers, meta={"dataset_uri": "gs://acme-data/chat/v3/", "run_id": "second"})
        assert second.status_code == 409 and "quota" in second.json()["error"]
        prod.step()
        assert _state(prod, exp["id"], headers)["status"] == "expired" and k8s.job(NS, run)["metadata"].get("deletionTimestamp")
    finally:
        client.close()
        wrong.stop()


def test_a_service_that_cannot_ask_its_scheduler_who_it_is_starts_degraded_and_fails_nothing(make_service, sqlite_url, nomad, nomad_runner, vault):
    prod = make_service(sqlite_url, ClusterRunners(nomad=("prod-nomad", nomad_runner)))
    headers = prod.token("finetune")
    exp = prod.submit(headers, deadline_hours=1).json()
    prod.step()
    nomad.finish(nomad.dispatched(PARENT)[0], client_status="running")
    prod.step()
    down = NomadDouble(a100_nodes()).start()
    address = down.address
    down.stop()  # nothing listens there any more
    client = NomadClient(NomadSettings(address=address, timeout_seconds=0.5, retries=0, backoff_seconds=0.01))
    try:
        other = make_service(sqlite_url, ClusterRunners(nomad=("prod-nomad", NomadRunner(client, _vault_env(vault)))), clock=prod.clock)
        health = other.client.get("/healthz").json()
        assert health["unobserved"] == {"prod-nomad": UNOBSERVED} and address not in str(health)  # the address is no one's business there
        other.clock.advance(hours=3)
        other.step()
        shown = _state(other, exp["id"], headers)
        assert shown["status"] == "running" and shown["reason"].startswith("unobserved: this service cannot tell yet")
    finally:
        client.close()


def test_after_the_upgrade_a_wrong_scheduler_that_starts_first_is_not_recorded(make_service, db_url, nomad, nomad_runner, vault):
    """Runs made before identities were recorded: the first service to start after the upgrade
    is the misconfigured one. It knows none of the cluster's runs, so its scheduler is not
    recorded as the cluster's and the runs are left alone; production then records its own."""
    from sqlalchemy import delete, select

    from experiments.models import SchedulerIdentity

    prod = make_service(db_url, ClusterRunners(nomad=("prod-nomad", nomad_runner)))
    headers = prod.token("finetune")
    exp = prod.submit(headers).json()
    prod.step()
    nomad.finish(nomad.dispatched(PARENT)[0], client_status="running")
    prod.step()
    prod.close()
    with prod.ctx.sessions() as session, session.begin():
        session.execute(delete(SchedulerIdentity))  # as before this table existed
    wrong = NomadDouble(a100_nodes(), acl_token=nomad.acl_token, region=nomad.region).start()
    client = NomadClient(NomadSettings(address=wrong.address, token=wrong.acl_token, timeout_seconds=2.0, retries=1, backoff_seconds=0.01))
    try:
        other = make_service(db_url, ClusterRunners(nomad=("prod-nomad", NomadRunner(client, _vault_env(vault)))), clock=prod.clock)
        assert "knows none of the 1 most recent runs of prod-nomad" in other.ctx.runner.blocked["prod-nomad"]  # the why, for the log and the runs' reasons
        assert other.client.get("/healthz").json()["unobserved"] == {"prod-nomad": UNOBSERVED}
        for _ in range(2):
            other.step()
        assert _state(other, exp["id"], headers)["status"] == "running"
        with other.ctx.sessions() as session:
            assert session.scalars(select(SchedulerIdentity)).all() == []
        other.close()
    finally:
        client.close()
        wrong.stop()
    back = make_service(db_url, ClusterRunners(nomad=("prod-nomad", nomad_runner)), clock=prod.clock)
    assert back.client.get("/healthz").json()["status"] == "ok"
    with back.ctx.sessions() as session:
        assert session.get(SchedulerIdentity, "prod-nomad").identity.startswith(f"nomad region={nomad.region} servers=")


def test_a_first_record_that_waits_on_a_slow_scheduler_holds_up_no_submission_or_dispatch(make_service, sqlite_url, nomad, nomad_runner, vault):
    """The first record of a cluster's identity asks its scheduler about the cluster's recent runs,
    each with the client's full timeout. On SQLite every transaction holds the write lock
    (``BEGIN IMMEDIATE``), so asking inside one made every submission and dispatch claim wait
    behind a scheduler that stalls on job reads (a Nomad without a leader still answers
    ``/v1/agent/members``). The scheduler here is held on a latch, not a clock: while it is
    held, a submission and a dispatch claim by another service on the same database finish."""
    import threading

    from sqlalchemy import delete

    from experiments.background.dispatch import process_outbox
    from experiments.background.worker import refresh_bindings
    from experiments.models import SchedulerIdentity
    from tests.jobs.nomad_double import Fault

    prod = make_service(sqlite_url, ClusterRunners(nomad=("prod-nomad", nomad_runner)))
    headers = prod.token("finetune")
    prod.submit(headers).json()
    prod.step()
    nomad.finish(nomad.dispatched(PARENT)[0], client_status="running")
    prod.step()
    with prod.ctx.sessions() as session, session.begin():
        session.execute(delete(SchedulerIdentity))  # as right after the upgrade that added the table

    client = NomadClient(NomadSettings(address=nomad.address, token=nomad.acl_token, timeout_seconds=180.0, retries=0, backoff_seconds=0.01))
    runner = ClusterRunners(nomad=("prod-nomad", NomadRunner(client, _vault_env(vault))))
    nomad.inject("GET", "members", Fault(status=500))  # its start-up check fails: the check is due again
    slow = make_service(sqlite_url, runner, clock=prod.clock)
    assert "prod-nomad" in runner.blocked
    reached, release = threading.Event(), threading.Event()
    nomad.inject("GET", "job", Fault(reached=reached, release=release))
    probe = threading.Thread(target=refresh_bindings, args=(slow.ctx,), daemon=True)
    probe.start()
    done = threading.Event()
    outcome: dict[str, object] = {}

    def others() -> None:
        outcome["submitted"] = prod.submit(headers).status_code
        outcome["dispatched"] = process_outbox(prod.ctx)
        done.set()

    try:
        assert reached.wait(timeout=60), "the identity check never asked the scheduler about a run"
        worker = threading.Thread(target=others, daemon=True)
        worker.start()
        finished = done.wait(timeout=20)  # busy_timeout is 30 s: held behind the probe, they would still wait
        assert not release.is_set()
        assert finished, "a submission or a dispatch claim waited on the identity check's scheduler call"
        assert outcome == {"submitted": 202, "dispatched": 1}
    finally:
        release.set()
        probe.join(timeout=60)
        client.close()
    assert "prod-nomad" not in runner.blocked


def _gpus_held(svc, exp_id: str) -> int:
    from experiments.models import Experiment
    from experiments.services.experiments import gpus_in_use

    with svc.ctx.sessions() as session:
        exp = session.get(Experiment, exp_id)
        return gpus_in_use(session, exp.tenant, exp.cluster, exp.pool)


def test_another_nomad_sharing_one_of_the_three_server_ids_is_not_production(make_service, db_url, nomad, nomad_runner, vault):
    """Red team 22c: a second Nomad, region ``global`` like production's, whose servers were
    built from one image with a pre-seeded node-id, shares one of production's three server ids.
    One server in common passed as the same cluster, the record followed the answering set, and
    the misconfigured service failed production's running run as gone and freed its quota. Now
    a majority of the recorded servers must answer: the run stays running, its GPUs held, and the
    record is still production's."""
    from sqlalchemy import select

    from experiments.models import SchedulerIdentity

    prod = make_service(db_url, ClusterRunners(nomad=("prod-nomad", nomad_runner)))
    headers = prod.token("finetune")
    running = prod.submit(headers, deadline_hours=1).json()
    prod.step()
    nomad.finish(nomad.dispatched(PARENT)[0], client_status="running")
    prod.step()
    assert _state(prod, running["id"], headers)["status"] == "running"
    held = _gpus_held(prod, running["id"])
    with prod.ctx.sessions() as session:
        recorded = session.scalars(select(SchedulerIdentity)).one().identity

    wrong = NomadDouble(a100_nodes(), acl_token=nomad.acl_token, region=nomad.region)
    wrong.server_ids = [nomad.server_ids[0], "11111111-2222-3333-4444-555555555555", "66666666-7777-8888-9999-000000000000"]
    wrong.start()
    client = NomadClient(NomadSettings(address=wrong.address, token=wrong.acl_token, timeout_seconds=2.0, retries=1, backoff_seconds=0.01))
    try:
        other = make_service(db_url, ClusterRunners(nomad=("prod-nomad", NomadRunner(client, _vault_env(vault)))), clock=prod.clock)
        assert "is not the one prod-nomad's runs were made on" in other.ctx.runner.blocked["prod-nomad"]  # the why, for the log and the runs' reasons
        assert other.client.get("/healthz").json()["unobserved"] == {"prod-nomad": UNOBSERVED}
        for _ in range(2):
            other.step()
        shown = _state(other, running["id"], headers)
        assert shown["status"] == "running" and shown["reason"].startswith("unobserved: "), shown
        assert _gpus_held(other, running["id"]) == held > 0
        with other.ctx.sessions() as session:
            assert session.scalars(select(SchedulerIdentity)).one().identity == recorded
    finally:
        client.close()
        wrong.stop()


def test_servers_replaced_a_minority_at_a_time_are_followed_and_a_majority_at_once_is_not():
    """Replacing one of three servers is still the cluster, and the record follows it; a set
    sharing only a minority, or one whose new servers would outnumber the kept ones in the record,
    never moves the record in one step."""
    from jobs.runner import next_record, same_scheduler

    a, b, c, d, e, f = (f"{i}0000000-0000-0000-0000-000000000000" for i in range(1, 7))
    recorded = f"nomad region=global servers={a},{b},{c}"
    one_replaced = f"nomad region=global servers={a},{b},{d}"
    assert same_scheduler(recorded, one_replaced) and next_record(recorded, one_replaced) == one_replaced
    assert not same_scheduler(recorded, f"nomad region=global servers={a},{d},{e}")
    grown = f"nomad region=global servers={a},{b},{d},{e},{f}"  # 2 of 3 recorded answer, among 3 new ones
    assert same_scheduler(recorded, grown) and next_record(recorded, grown) == recorded
    assert not same_scheduler(recorded, f"nomad region=other servers={a},{b},{c}")
