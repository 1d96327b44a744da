"""Issue 28, the control plane: one counter row per tenant and pool instead of a sum over live
runs under a lock, and several workers on one database (real SQLite and PostgreSQL; the Nomad
API double and the session's real OpenBao; worker processes killed with SIGKILL).

Exactly once is checked where Nomad would see it: the dispatched children of the parent job in
the double, one per experiment, each carrying its experiment id as idempotency token.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from datetime import datetime

import pytest
from sqlalchemy import literal, select, update
from sqlalchemy.orm.exc import StaleDataError

from experiments.auth import Caller
from experiments.background.dispatch import _claim, _dispatch_claimed, process_outbox
from experiments.background.membership import BUCKETS, buckets_of
from experiments.background.pool_usage import check_pool_usage
from experiments.errors import ApiError
from experiments.models import Event, Experiment, Outbox, PoolUsage, WorkerBeat
from experiments.services import experiments as service
from experiments.services import pool_usage
from experiments.services.catalog import Catalog
from experiments.services.lifecycle import transition
from experiments.states import State
from tests.conftest import REPO_ROOT
from tests.experiments.test_dispatch import PARENT
from tests.experiments.worker_process import TIMING

META = {"dataset_uri": "hf://datasets/acme/chat@v3"}
QUOTA = 8  # finetune's a100 quota in tests/fleet/clusters/prod-nomad.yaml; finetune-llama asks for 1 GPU
pytestmark = pytest.mark.usefixtures("still_fence")  # workers beaten by hand (_worker) age only when a test says so


def _submit(ctx, i: int, *, tenant: str = "finetune", job: str = "finetune-llama", catalog: Catalog | None = None):
    with ctx.sessions() as session:
        return service.submit(session, catalog or ctx.catalog, Caller("test", tenant, False), job=job, meta={**META, "run_id": f"r{i}"},
                              deadline_hours=None, idempotency_key=f"k{i}", scheduler="nomad", now=ctx.clock())[0]


def _counters_match(ctx) -> None:
    with ctx.sessions() as session:
        sums, held = pool_usage.live_sums(session), pool_usage.counters(session)
    assert {k: v for k, v in held.items() if v} == sums, (held, sums)


def _roomy(catalog: Catalog) -> Catalog:
    """The suite's fleet with every quota raised: a burst of dispatches, not the quota, is the point."""
    configs = tuple(c.model_copy(update={"tenants": [t.model_copy(update={"gpu_quota": {p: 10_000 for p in t.gpu_quota}}) for t in c.tenants]})
                    for c in catalog.configs)
    return Catalog(configs=configs)


def test_racing_submissions_never_overshoot_the_quota(make_service, db_url, nomad_runner):
    """40 clients race for the 8 GPUs of finetune's a100 quota: exactly 8 are admitted, the rest
    get 409, and the counter says 8 (PostgreSQL: the row lock; without FOR UPDATE this admits more)."""
    svc = make_service(db_url, nomad_runner)
    barrier = threading.Barrier(40)
    outcomes: list[str] = []

    def client(i: int) -> None:
        barrier.wait()
        try:
            _submit(svc.ctx, i)
            outcomes.append("admitted")
        except ApiError as exc:
            outcomes.append(str(exc.status))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(40)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outcomes.count("admitted") == QUOTA and outcomes.count("409") == 40 - QUOTA, outcomes
    with svc.ctx.sessions() as session:
        assert session.get(PoolUsage, ("prod-nomad", "finetune", "a100")).gpus_committed == QUOTA
        assert service.gpus_in_use(session, "finetune", "prod-nomad", "a100") == QUOTA
    _counters_match(svc.ctx)


def test_the_counter_equals_the_live_sum_after_random_workloads(make_service, db_url, nomad, nomad_runner):
    """Submissions, cancels before and after dispatch, runs that succeed, fail, are lost by the
    scheduler, expire past their deadline and get stuck in dispatch, in a seeded random order:
    after every step the counters equal the GPUs of the live experiments, and a freed quota admits again."""
    from tests.jobs.nomad_double import Fault, FakeNode

    nomad.nodes.extend(FakeNode(f"a100-extra-{i}", "a100", "a100", "NVIDIA A100-SXM4-40GB", 40960, 2) for i in range(40))  # the double never frees GPUs
    svc = make_service(db_url, nomad_runner)
    headers = svc.token("finetune")
    admin = svc.token(None, admin=True)
    rng = random.Random(28)
    submitted = 0
    actions = ["submit"] * 6 + ["step", "cancel", "cancel"] + ["finish"] * 4 + ["fail", "fail", "forget", "expire", "stuck"]
    for _ in range(100):
        action = rng.choice(actions)
        live = [e for e in svc.client.get("/api/v1/experiments?limit=500", headers=admin).json()["items"]
                if e["status"] not in ("succeeded", "failed", "cancelled", "expired")]
        on_nomad = [e for e in live if e["run_id"] and e["status"] in ("queued", "provisioning", "running")]
        placed = [e for e in on_nomad if nomad.state.allocations.get(e["run_id"].split("/", 1)[1])]
        if action == "submit":
            try:
                _submit(svc.ctx, submitted)
            except ApiError as exc:
                assert exc.status == 409
            submitted += 1
        elif action == "cancel" and live:
            svc.client.post(f"/api/v1/experiments/{rng.choice(live)['id']}/cancel", headers=admin)
        elif action in ("finish", "fail") and placed:
            job_id = rng.choice(placed)["run_id"].split("/", 1)[1]
            if action == "finish":
                nomad.finish(job_id, client_status="complete", events=[{"Type": "Terminated", "Time": 2, "ExitCode": 0}])
            else:
                nomad.finish(job_id, client_status="failed", failed=True, events=[{"Type": "Terminated", "Time": 2, "ExitCode": 1}])
        elif action == "forget" and on_nomad:
            victim = rng.choice(on_nomad)["run_id"]
            namespace, job_id = victim.split("/", 1)
            del nomad.state.jobs[(namespace, job_id)]
        elif action == "expire":
            svc.clock.advance(hours=13)  # past finetune-llama's 12 h deadline for everything placed
        elif action == "stuck":
            try:
                _submit(svc.ctx, submitted)
            except ApiError as exc:
                assert exc.status == 409
            submitted += 1
            nomad.inject("POST", "dispatch", *[Fault(status=503)] * 3)  # every try of one dispatch
            svc.step()
            nomad.faults.clear()
            svc.clock.advance(seconds=901)  # past the stuck bound: the next pass fails it
        svc.step()
        _counters_match(svc.ctx)
    assert submitted >= 8
    with svc.ctx.sessions() as session:
        ended = session.scalars(select(Experiment.state).where(Experiment.state.in_(["succeeded", "failed", "cancelled", "expired"]))).all()
    assert {"succeeded", "failed", "cancelled", "expired"} <= set(ended), set(ended)


def test_a_drifted_counter_is_corrected_by_the_periodic_check(make_service, db_url, nomad_runner):
    svc = make_service(db_url, nomad_runner)
    for i in range(3):
        _submit(svc.ctx, i)
    with svc.ctx.sessions() as session, session.begin():
        session.execute(update(PoolUsage).values(gpus_committed=7))  # edited by hand, or restored from an older backup
    assert check_pool_usage(svc.ctx) == 1
    _counters_match(svc.ctx)
    assert svc.ctx.metrics.pool_usage_repairs._value.get() == 1
    assert check_pool_usage(svc.ctx) == 0  # not due again until Timing.pool_usage_check_seconds


def test_the_migration_backfills_the_counter_from_live_experiments(db_url):
    from experiments import db

    engine = db.make_engine(db_url)
    try:
        db.upgrade(engine, "0009")
        now = datetime(2026, 12, 3, 8)
        # The table as it is at 0009 (the model has columns of later revisions, with defaults it would insert).
        from sqlalchemy import JSON, DateTime, Float, Integer, String, column, table

        at_0009 = table("experiments", *(column(n, t) for n, t in (
            ("id", String), ("tenant", String), ("job", String), ("cluster", String), ("pool", String), ("gpus", Integer), ("meta", JSON),
            ("state", String), ("scheduler", String), ("submitted_by", String), ("request_hash", String), ("deadline_hours", Float),
            ("price_per_gpu_hour", Float), ("price_kind", String), ("created_at", DateTime), ("updated_at", DateTime))))
        with engine.begin() as connection:
            for i, (state, gpus) in enumerate([("running", 2), ("pending", 1), ("succeeded", 4), ("queued", 3)]):
                connection.execute(at_0009.insert().values(
                    id=f"e{i}", tenant="finetune", job="finetune-llama", cluster="prod-nomad", pool="a100", gpus=gpus, meta={}, state=state,
                    scheduler="nomad", submitted_by="t", request_hash="-", deadline_hours=1, price_per_gpu_hour=1.0, price_kind="list",
                    created_at=now, updated_at=now))
        db.upgrade(engine)
        with engine.connect() as connection:
            assert connection.execute(select(PoolUsage.gpus_committed)).scalars().all() == [6]
    finally:
        engine.dispose()


def test_two_workers_ending_one_run_at_once_release_its_gpus_once(make_service, pg_url, nomad_runner):
    """Two workers read the same run as running and both end it: the second commit fails on the
    state-guarded UPDATE and its release of the GPUs rolls back with it."""
    from experiments.db import database_url

    svc = make_service(database_url(pg_url), nomad_runner)
    exp = _submit(svc.ctx, 1)
    first, second = svc.ctx.sessions(), svc.ctx.sessions()
    try:
        a, b = first.get(Experiment, exp.id), second.get(Experiment, exp.id)
        transition(first, a, State.CANCELLED, actor="a", now=svc.clock())
        transition(second, b, State.FAILED, actor="b", now=svc.clock())
        first.commit()
        with pytest.raises(StaleDataError):
            second.commit()
    finally:
        first.close()
        second.close()
    with svc.ctx.sessions() as session:
        assert session.get(PoolUsage, ("prod-nomad", "finetune", "a100")).gpus_committed == 0
        assert session.get(Experiment, exp.id).state == "cancelled"
    _counters_match(svc.ctx)


# For the tests that do not measure the fence itself. A worker fences itself once its own last beat started
# longer ago than worker_lost_seconds less a heartbeat, in wall-clock time (0.6 s with TIMING), while these
# tests move only the service's clock: under load (CPU-bound processes on both cores) their own steps
# between two beats took longer than that, and a live worker followed nothing (share() false, 0 dispatches).
STEADY = replace(TIMING, worker_ttl_seconds=60.0, worker_lost_seconds=30.0)


def _worker(svc, clock, timing=TIMING):
    """Another worker's context on the same database, registered with a heartbeat at ``clock``; its own fence
    needs the ``still_fence`` fixture (conftest) to hold still between the test's steps."""
    from experiments.background.context import Context

    ctx = Context(svc.ctx.sessions, svc.ctx.runner, svc.ctx.catalog, clock, svc.ctx.metrics, timing)
    ctx.membership.beat(ctx.sessions, clock())
    return ctx


def test_a_dead_workers_claim_is_taken_over_after_the_ttl_not_the_lease(make_service, db_url, nomad, nomad_runner):
    """Worker A claims a dispatch and goes silent. While its heartbeat is younger than the TTL its
    claim holds; past the TTL, B takes it over (the 600 s lease notwithstanding) with an event
    saying so. A, waking up, finds its claim is B's and submits nothing; B submits. One child job
    in Nomad, one submit."""
    svc = make_service(db_url, nomad_runner)
    exp = _submit(svc.ctx, 1)
    a, b = _worker(svc, svc.clock), _worker(svc, svc.clock)
    [claim_a] = _claim(a, None)
    assert claim_a.attempt == 1
    svc.clock.advance(seconds=TIMING.worker_ttl_seconds - 0.5)
    b.membership.beat(b.sessions, svc.clock())
    assert _claim(b, None) == []  # A's heartbeat is still within the TTL
    svc.clock.advance(seconds=1)
    b.membership.beat(b.sessions, svc.clock())
    [claim_b] = _claim(b, None)
    assert claim_b.attempt == 2 and claim_b.worker == b.membership.worker_id
    assert not _dispatch_claimed(a, claim_a) and not nomad.calls("POST", "dispatch")  # its claim is B's now
    with svc.ctx.sessions() as session:
        assert session.get(Experiment, exp.id).state == "dispatching" and session.get(Outbox, exp.id).claimed_by == b.membership.worker_id
    assert _dispatch_claimed(b, claim_b)
    with svc.ctx.sessions() as session:
        done = session.get(Experiment, exp.id)
        kinds = session.scalars(select(Event.kind).where(Event.experiment_id == exp.id)).all()
    assert done.state == "queued" and done.run_id == f"finetune/{nomad.dispatched(PARENT)[0]}" and "takeover" in kinds
    tokens = [call.query["idempotency_token"][0] for call in nomad.calls("POST", "dispatch")]
    assert tokens == [exp.id] and len(nomad.dispatched(PARENT)) == 1


def test_a_live_workers_claim_is_not_taken_over(make_service, db_url, nomad_runner):
    svc = make_service(db_url, nomad_runner)
    _submit(svc.ctx, 1)
    a, b = _worker(svc, svc.clock), _worker(svc, svc.clock)
    assert _claim(a, None)
    for _ in range(5):
        svc.clock.advance(seconds=TIMING.worker_ttl_seconds / 2)
        a.membership.beat(a.sessions, svc.clock())
        b.membership.beat(b.sessions, svc.clock())
        assert _claim(b, None) == []


def test_a_worker_whose_own_heartbeat_lapsed_claims_and_submits_nothing(make_service, db_url, nomad, nomad_runner):
    svc = make_service(db_url, nomad_runner)
    _submit(svc.ctx, 1)
    a = _worker(svc, svc.clock)
    a.membership._last_beat -= TIMING.worker_ttl_seconds  # its heartbeat thread has not written for a TTL
    assert a.fenced()
    assert process_outbox(a) == 0 and not nomad.calls("POST", "dispatch")
    with svc.ctx.sessions() as session:
        assert a.share(session, Experiment.id) is not None  # follows nothing either
        assert session.scalars(select(Experiment.id).where(a.share(session, Experiment.id))).all() == []


def test_live_workers_split_the_runs_and_a_dead_ones_share_passes_on(make_service, db_url, nomad_runner, catalog):
    assert sorted(b for i in range(3) for b in buckets_of(i, 3)) == [f"{b:02x}" for b in range(BUCKETS)]
    svc = make_service(db_url, nomad_runner, jobs=_roomy(catalog))
    ids = {_submit(svc.ctx, i).id for i in range(40)}
    a, b = _worker(svc, svc.clock, STEADY), _worker(svc, svc.clock, STEADY)

    def followed(ctx) -> set[str]:
        with ctx.sessions() as session:
            return set(session.scalars(select(Experiment.id).where(ctx.share(session, Experiment.id))).all())

    mine_a, mine_b = followed(a), followed(b)
    assert mine_a and mine_b and not mine_a & mine_b and mine_a | mine_b == ids
    svc.clock.advance(seconds=STEADY.worker_ttl_seconds + 1)
    b.membership.beat(b.sessions, svc.clock())  # A stays silent
    with b.sessions() as session:
        assert b.share(session, Experiment.id) is None  # B alone: every run


def test_two_worker_processes_dispatch_exactly_once_through_a_kill_9(make_service, pg_url, nomad, vault, catalog, tmp_path):
    """Two worker processes on PostgreSQL and a burst of 24 dispatches. Worker A dispatches 3; every
    later submit of A reaches Nomad, then hangs before A records it (its heartbeat thread still
    beats), until every one of A's dispatch threads holds one: several of its dispatches are in
    flight at once. Worker B starts and dispatches the rest of the burst, leaving A's live claims
    alone; then A is killed with SIGKILL. B takes each of A's claims over because no session holds A's
    advisory lock any more (``Timing.worker_lost_seconds``): both run with a 600 s TTL and the lease
    is 600 s, so nothing else could end the claims in this test. Nomad holds exactly one child per
    experiment, each submitted once: B finds the run of each claim A held and records it without
    a submit (no second secret_id)."""
    from experiments.db import database_url
    from tests.experiments.conftest import UnusedRunner

    url = database_url(pg_url)
    svc = make_service(url, UnusedRunner(), jobs=_roomy(catalog))
    burst = [_submit(svc.ctx, i).id for i in range(24)]
    env = {**os.environ, "VAULT_ADDR": vault.addr, "VAULT_TOKEN": vault.orchestrator.token, "NOMAD_TOKEN": nomad.acl_token}
    marker = tmp_path / "in-flight"
    command = [sys.executable, "-m", "tests.experiments.worker_process", url, nomad.address, "--ttl", "600"]
    width = TIMING.dispatch_concurrency

    def recorded() -> set[str]:
        with svc.ctx.sessions() as session:
            return set(session.scalars(select(Experiment.id).where(Experiment.id.in_(burst), Experiment.run_id.is_not(None))).all())

    def takeovers() -> list[str]:
        with svc.ctx.sessions() as session:
            return list(session.scalars(select(Event.experiment_id).where(Event.kind == "takeover")).all())

    def hung() -> set[str]:
        return set(marker.read_text().split()) if marker.exists() else set()

    deadline = time.monotonic() + 120  # a hang guard, not a speed bound
    doomed = subprocess.Popen([*command, "--hang-after", "3", "--marker", str(marker)], cwd=REPO_ROOT, env=env)
    survivor = None
    try:
        while len(hung()) < width:
            assert doomed.poll() is None and time.monotonic() < deadline, f"worker A never had {width} dispatches in flight ({len(hung())})"
            time.sleep(0.05)
        in_flight = hung()
        survivor = subprocess.Popen(command, cwd=REPO_ROOT, env=env)
        while len(recorded()) < 8:
            assert survivor.poll() is None and time.monotonic() < deadline, "worker B never dispatched"
            time.sleep(0.05)
        assert not in_flight & recorded() and not takeovers()  # A lives: its claims hold, whatever B does
        with svc.ctx.sessions() as session:  # A's claims: its hung submits, and the rows it claimed ahead for its threads
            held = set(session.scalars(select(Outbox.experiment_id).join(WorkerBeat, WorkerBeat.id == Outbox.claimed_by)
                                       .where(WorkerBeat.pid == doomed.pid)).all())
        assert in_flight <= held
        os.kill(doomed.pid, signal.SIGKILL)
        doomed.wait(timeout=30)
        while len(recorded()) < len(burst):
            assert survivor.poll() is None and time.monotonic() < deadline, f"{len(burst) - len(recorded())} experiments never dispatched"
            time.sleep(0.1)
    finally:
        for process in (doomed, survivor):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait(timeout=30)
    children = {job_id: nomad.state.jobs[("finetune", job_id)]["DispatchIdempotencyToken"] for job_id in nomad.dispatched(PARENT)}
    assert sorted(children.values()) == sorted(burst), "each experiment exactly one Nomad child, none twice"
    with svc.ctx.sessions() as session:
        runs = dict(session.execute(select(Experiment.id, Experiment.run_id).where(Experiment.id.in_(burst))).all())
    assert {runs[token] for token in children.values()} == {f"finetune/{job_id}" for job_id in children}
    assert sorted(takeovers()) == sorted(held)
    tokens = [call.query["idempotency_token"][0] for call in nomad.calls("POST", "dispatch")]
    assert sorted(tokens) == sorted(burst)  # A's in-flight ones found by B, not submitted again
    _counters_match(svc.ctx)


def _ghost(svc, clock):
    """A worker of a process that has exited: its advisory lock's connection closed, so no session holds the lock."""
    ctx = _worker(svc, clock)
    ctx.membership.release()
    _lock_released(svc, ctx.membership.worker_id)
    return ctx


def _lock_released(svc, worker_id: str) -> None:
    """Wait until no session holds ``worker_id``'s advisory lock. Closing the lock's connection only sends
    PostgreSQL its Terminate message; the backend releases the session's locks as it exits, a moment later: on a
    loaded machine pg_locks still listed the lock at another session's next query."""
    from experiments.background.membership import lock_held

    deadline = time.monotonic() + 30  # a hang guard, not a speed bound
    while True:
        with svc.ctx.sessions() as session:
            if not session.scalar(select(lock_held(literal(worker_id)))):
                return
        assert time.monotonic() < deadline, f"the advisory lock of worker {worker_id} is still held 30 s after its connection closed"
        time.sleep(0.02)


def test_an_exited_workers_claim_is_taken_over_before_the_ttl(make_service, pg_url, nomad_runner):
    """PostgreSQL: a worker whose advisory lock no session holds (its process exited) is dead once
    its heartbeat is older than ``worker_lost_seconds``, well before the TTL; a silent worker whose
    lock is still held (this one) keeps its claim
    until the TTL, since it may resume in the middle of a submit."""
    from experiments.db import database_url

    svc = make_service(database_url(pg_url), nomad_runner)
    first, second = _submit(svc.ctx, 1), _submit(svc.ctx, 2)
    silent, gone, other = _worker(svc, svc.clock), _ghost(svc, svc.clock), _worker(svc, svc.clock)
    assert [c.experiment_id for c in _claim(silent, first.id)] == [first.id]
    assert [c.experiment_id for c in _claim(gone, second.id)] == [second.id]
    svc.clock.advance(seconds=TIMING.worker_lost_seconds - 0.1)
    other.membership.beat(other.sessions, svc.clock())
    assert _claim(other, None, limit=2) == []  # both heartbeats are still fresh
    svc.clock.advance(seconds=0.2)
    other.membership.beat(other.sessions, svc.clock())
    assert [c.experiment_id for c in _claim(other, None, limit=2)] == [second.id]  # the exited one's only
    svc.clock.advance(seconds=TIMING.worker_ttl_seconds)
    other.membership.beat(other.sessions, svc.clock())
    assert [c.experiment_id for c in _claim(other, None, limit=2)] == [first.id]  # the silent one's after the TTL
    with svc.ctx.sessions() as session:
        assert sorted(session.scalars(select(Event.experiment_id).where(Event.kind == "takeover")).all()) == sorted([first.id, second.id])


def test_a_fenced_worker_gives_its_claims_back_instead_of_holding_them_for_the_lease(make_service, db_url, nomad, nomad_runner, catalog):
    """A worker that claimed a batch and then lost its heartbeat submits none of it and hands every
    row back at once (due again, not held for the 600 s lease); the next live worker dispatches them."""
    svc = make_service(db_url, nomad_runner, jobs=_roomy(catalog))
    ids = {_submit(svc.ctx, i).id for i in range(3)}
    a, b = _worker(svc, svc.clock, STEADY), _worker(svc, svc.clock, STEADY)
    claims = _claim(a, None, limit=3)
    assert {c.experiment_id for c in claims} == ids
    a.membership._last_beat -= STEADY.worker_ttl_seconds  # its heartbeat thread has not written for a TTL
    assert not any(_dispatch_claimed(a, claim) for claim in claims) and not nomad.calls("POST", "dispatch")
    assert process_outbox(b) == 3
    assert sorted(call.query["idempotency_token"][0] for call in nomad.calls("POST", "dispatch")) == sorted(ids)


def test_two_workers_scan_for_orphans_once(make_service, pg_url, nomad, nomad_runner):
    """Two workers on one PostgreSQL database, one stray run holding GPUs: only the worker that leads
    the pass scans, so the orphan is one event (and the holders are listed once), not one per worker.
    Once the leader stops, the other takes the scan over."""
    from experiments.db import database_url
    from experiments.background.orphans import process_holders
    from experiments.scheduler import ClusterRunners
    from jobs.vault_refs import load_vault_view
    from tests.conftest import load_fleet
    from tests.experiments.test_release_orphans import _stray

    svc = make_service(database_url(pg_url), ClusterRunners(nomad=("prod-nomad", nomad_runner)))
    _stray(nomad, load_fleet(), load_vault_view(), "operator-1")
    a, b = _worker(svc, svc.clock, STEADY), _worker(svc, svc.clock, STEADY)
    scanned = [process_holders(a), process_holders(b)]
    with svc.ctx.sessions() as session:
        orphans = session.scalars(select(Event).where(Event.kind == "orphan")).all()
    assert len(orphans) == 1 and "holds GPUs" in orphans[0].message
    assert sorted(scanned) == [0, 1]
    leader, follower = (a, b) if scanned[0] else (b, a)
    leader.membership.leave(leader.sessions)
    assert process_holders(follower) == 1


def test_a_stopped_worker_leaves_and_its_share_passes_on_at_once(make_service, db_url, nomad_runner):
    from experiments.background.worker import Worker

    svc = make_service(db_url, nomad_runner)
    clock = svc.clock
    worker = Worker(_worker(svc, clock, STEADY))
    other = _worker(svc, clock, STEADY)
    worker.start()
    worker.stop()
    with other.sessions() as session:
        assert other.share(session, Experiment.id) is None  # the only live worker now



def test_gpufleet_serve_worker_only_joins_the_workers_and_leaves_on_sigterm(tmp_path, pg_url):
    """The real CLI, API-less: its heartbeat row appears while it runs, and SIGTERM (how systemd
    and Kubernetes stop it) removes the row at once instead of leaving it to go stale."""
    from experiments import db
    from experiments.db import database_url
    from experiments.models import WorkerBeat
    from tests.experiments.test_worker_only_stop import worker_repo

    repo = worker_repo(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "GPUFLEET_"))}
    process = subprocess.Popen([sys.executable, "-m", "gpufleet.cli", "--repo", str(repo), "serve", "--worker-only", "--scheduler", "local",
                                "--db", pg_url], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    engine = db.make_engine(database_url(pg_url))
    try:
        deadline = time.monotonic() + 120  # a hang guard, not a speed bound
        rows: list[WorkerBeat] = []
        while not rows:
            assert process.poll() is None and time.monotonic() < deadline, "the worker never wrote its heartbeat"
            time.sleep(0.1)
            with db.session_factory(engine)() as session:
                rows = list(session.scalars(select(WorkerBeat)).all()) if "workers" in _tables(engine) else []
        assert rows[0].pid == process.pid
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0, process.stdout.read() if process.stdout else ""
        with db.session_factory(engine)() as session:
            assert session.scalars(select(WorkerBeat)).all() == []
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
        engine.dispose()


def _tables(engine) -> set[str]:
    from sqlalchemy import inspect

    return set(inspect(engine).get_table_names())


def test_the_idempotency_lookup_reads_the_unique_index_not_the_table(make_service, db_url, nomad_runner):
    """Submit's lookup of (tenant, Idempotency-Key) is answered by the unique index of 0001
    (``uq_experiments_tenant_idempotency_key``), not by the tenant's rows: with 2,000 of them
    (and the planner's statistics) the plan names that index."""
    from sqlalchemy import text

    svc = make_service(db_url, nomad_runner)
    now = svc.clock()
    with svc.ctx.sessions() as session, session.begin():
        session.execute(Experiment.__table__.insert(), [
            {"id": f"x{i}", "tenant": "finetune", "job": "finetune-llama", "cluster": "prod-nomad", "pool": "a100", "gpus": 1, "meta": {},
             "state": "running", "scheduler": "nomad", "submitted_by": "t", "idempotency_key": f"k{i}", "request_hash": "-", "deadline_hours": 1,
             "price_per_gpu_hour": 1.0, "price_kind": "list", "created_at": now, "updated_at": now} for i in range(2000)])
        session.execute(text("ANALYZE experiments" if session.get_bind().dialect.name == "postgresql" else "ANALYZE"))
    query = "SELECT id FROM experiments WHERE tenant = 'finetune' AND idempotency_key = 'k1'"
    with svc.ctx.sessions() as session:
        if session.get_bind().dialect.name == "postgresql":
            plan = "\n".join(session.scalars(text(f"EXPLAIN {query}")).all())
            assert "uq_experiments_tenant_idempotency_key" in plan and "Seq Scan" not in plan, plan
        else:
            plan = "\n".join(row[-1] for row in session.execute(text(f"EXPLAIN QUERY PLAN {query}")).all())
            assert "USING INDEX" in plan and "autoindex_experiments" in plan, plan


def test_two_workers_reconciling_the_same_runs_at_once_move_each_once(make_service, pg_url, nomad, nomad_runner, catalog, monkeypatch):
    """Two workers whose views of the membership differ follow the same 12 finished runs in the same
    moment, each committing its state changes in several chunks on parallel threads (PostgreSQL):
    every run moves to succeeded once, with one event, and its GPUs are released once."""
    from experiments.background import reconcile
    from experiments.background.context import Context
    from experiments.db import database_url

    from tests.jobs.nomad_double import FakeNode

    monkeypatch.setattr(reconcile, "COMMIT_BATCH", 2)  # six chunks a pass, committed side by side
    nomad.nodes.extend(FakeNode(f"a100-extra-{i}", "a100", "a100", "NVIDIA A100-SXM4-40GB", 40960, 2) for i in range(6))  # room for 12
    svc = make_service(database_url(pg_url), nomad_runner, jobs=_roomy(catalog))
    ids = [_submit(svc.ctx, i).id for i in range(12)]
    svc.step()
    jobs = nomad.dispatched(PARENT)
    assert len(jobs) == 12
    for job in jobs:
        nomad.finish(job, client_status="running")
    svc.step()
    for job in jobs:
        nomad.finish(job, client_status="complete", events=[{"Type": "Terminated", "Time": 2, "ExitCode": 0}])
    # Unregistered contexts follow every run: the worst case of two views that differ.
    a, b = (Context(svc.ctx.sessions, svc.ctx.runner, svc.ctx.catalog, svc.clock, svc.ctx.metrics, svc.ctx.timing) for _ in range(2))
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def follow(ctx) -> None:
        barrier.wait()
        try:
            reconcile.process_scheduled(ctx)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=follow, args=(ctx,)) for ctx in (a, b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    with svc.ctx.sessions() as session:
        states = dict(session.execute(select(Experiment.id, Experiment.state).where(Experiment.id.in_(ids))).all())
        ended = session.scalars(select(Event.experiment_id).where(Event.kind == "state", Event.to_state == "succeeded")).all()
    assert set(states.values()) == {"succeeded"}
    assert sorted(ended) == sorted(ids), "each run moved to succeeded exactly once"
    _counters_match(svc.ctx)


def test_a_reconcile_pass_stamps_around_a_row_another_worker_holds_instead_of_waiting(make_service, pg_url, nomad, nomad_runner, catalog):
    """The stamp of a pass (one UPDATE over every run the scheduler answered for) never waits on a
    row lock (PostgreSQL). It used to lock its rows in heap order: holding a run that another
    worker's chunk (which locks in id order) wanted next while waiting on one that chunk held, a
    deadlock PostgreSQL broke by aborting one of them (seen in CI in the test above). Here another
    transaction holds the lowest run, as such a chunk would: the pass stamps the other runs and
    commits while that lock is still held, and the held run keeps its old stamp."""
    from experiments.background import reconcile
    from experiments.db import database_url

    svc = make_service(database_url(pg_url), nomad_runner, jobs=_roomy(catalog))
    ids = sorted(_submit(svc.ctx, i).id for i in range(4))
    svc.step()
    for job in nomad.dispatched(PARENT):
        nomad.finish(job, client_status="running")
    svc.step()
    with svc.ctx.sessions() as session:
        before = dict(session.execute(select(Experiment.id, Experiment.reconciled_at).where(Experiment.id.in_(ids))).all())
    svc.clock.advance(seconds=60)
    holder = svc.ctx.sessions()
    done = threading.Event()
    errors: list[BaseException] = []

    def stamp() -> None:
        try:
            reconcile._apply_all(svc.ctx, [], ids)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)
        done.set()

    try:
        holder.begin()
        holder.execute(select(Experiment.id).where(Experiment.id == ids[0]).with_for_update()).all()
        thread = threading.Thread(target=stamp)
        thread.start()
        assert done.wait(30), "the stamp waited on the row another transaction holds"
        assert not errors, errors
        # Had the stamp kept any row locked, this would now wait on it (a cycle with the stamp waiting on ids[0]).
        holder.execute(select(Experiment.id).where(Experiment.id.in_(ids)).order_by(Experiment.id).with_for_update()).all()
    finally:
        holder.rollback()
        holder.close()
    thread.join()
    with svc.ctx.sessions() as session:
        after = dict(session.execute(select(Experiment.id, Experiment.reconciled_at).where(Experiment.id.in_(ids))).all())
    assert after[ids[0]] == before[ids[0]], "the held run keeps its stamp (the chunk holding it stamps it itself)"
    assert all(after[i] == svc.clock() and after[i] != before[i] for i in ids[1:]), (before, after)


def _done_or_waiting_on_a_lock(engine, done: threading.Event, *, besides: int) -> None:
    """Return once ``done`` is set or a session of this database other than ``besides`` (a backend pid)
    waits on a lock: PostgreSQL's own view of it (pg_stat_activity, read afresh each time), not a sleep."""
    from sqlalchemy import text

    deadline = time.monotonic() + 60
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        while not done.wait(0.02):
            if connection.execute(text("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
                                       " AND pid <> :besides"), {"besides": besides}).scalar():
                return
            assert time.monotonic() < deadline, "neither done nor waiting on a lock after 60 s"


def test_events_written_for_several_runs_never_close_a_cycle_with_a_chunk_that_locks_them(make_service, pg_url, nomad, nomad_runner, monkeypatch):
    """Each event's foreign key takes a key-share lock on its run's row (PostgreSQL). The idle policy
    writes its notes for several running runs in one transaction, in the order its query returns them
    (no ORDER BY: heap order). A reconcile chunk of another worker whose view of the membership
    differs locks the same runs in id order. With the chunk's lock a plain FOR UPDATE, the notes held
    the higher run's key share while waiting on the lower run the chunk held, and the chunk waited on
    the higher one next: PostgreSQL aborted one of them (deadlock detected). The chunk's lock is FOR
    NO KEY UPDATE (experiments.row_locks), which a key share does not conflict with."""
    from sqlalchemy import text

    from experiments.background import idle
    from experiments.background.context import Context
    from experiments.background.idle import UNKNOWN_UTIL
    from experiments.row_locks import lock_in_id_order
    from experiments.db import database_url
    from tests.experiments.test_idle import _running

    svc = make_service(database_url(pg_url), nomad_runner)
    low, high = sorted(_running(svc, nomad, f"r{i}")[0] for i in range(2))
    svc.step()  # both running since 08:00; no GPU stats, so their utilization stays unknown
    svc.clock.advance(minutes=31)  # past the 30 min window: the idle pass notes that, once per run
    tracked = idle._tracked
    # Highest id first, as a heap may return them: the order that closes the cycle.
    monkeypatch.setattr(idle, "_tracked", lambda ctx, session: sorted(tracked(ctx, session), key=lambda t: t.id, reverse=True))
    other = Context(svc.ctx.sessions, svc.ctx.runner, svc.ctx.catalog, svc.clock, svc.ctx.metrics, svc.ctx.timing)
    done = threading.Event()
    errors: list[BaseException] = []

    def notes() -> None:
        try:
            idle.process_idle(other)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)
        finally:
            done.set()

    chunk = svc.ctx.sessions()
    thread = threading.Thread(target=notes)
    try:
        chunk.begin()
        lock_in_id_order(chunk, [low])  # a chunk over both runs has locked the first in id order ...
        pid = chunk.execute(text("SELECT pg_backend_pid()")).scalar()
        thread.start()
        _done_or_waiting_on_a_lock(chunk.get_bind(), done, besides=pid)
        lock_in_id_order(chunk, [high])  # ... and takes the next (its one SELECT locks row by row, in this order)
    finally:
        chunk.rollback()
        chunk.close()
        thread.join()
    assert not errors, errors
    with svc.ctx.sessions() as session:
        noted = session.scalars(select(Event.experiment_id).where(Event.kind == UNKNOWN_UTIL)).all()
    assert sorted(noted) == [low, high]


def _the_second_meets_the_firsts_held_commit(svc, work) -> None:
    """Two workers do ``work(sessions, n)`` at once (n = 0, then 1; PostgreSQL): the first's first commit
    waits, its writes flushed, while the second runs until it ends or waits on a lock (held by the first),
    then the first commits. Fails with whatever either raised."""
    from sqlalchemy import event, text

    flushed, release, done = threading.Event(), threading.Event(), threading.Event()
    held: list[int] = []  # the backend of the first worker's held transaction
    errors: list[BaseException] = []

    def first_sessions():
        session = svc.ctx.sessions()

        @event.listens_for(session, "before_commit")
        def hold(session) -> None:
            if not held:
                session.flush()
                held.append(session.execute(text("SELECT pg_backend_pid()")).scalar())
                flushed.set()
                assert release.wait(60)
        return session

    def run(sessions, n: int, finished: threading.Event | None = None) -> None:
        try:
            work(sessions, n)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)
        finally:
            if finished is not None:
                finished.set()

    first = threading.Thread(target=run, args=(first_sessions, 0))
    second = threading.Thread(target=run, args=(svc.ctx.sessions, 1, done))
    first.start()
    try:
        assert flushed.wait(60), "the first worker did not write"
        second.start()
        _done_or_waiting_on_a_lock(svc.ctx.sessions().get_bind(), done, besides=held[0])
    finally:
        release.set()
        first.join()
        if second.ident is not None:
            second.join()
    assert not errors, errors


def test_two_workers_keeping_one_runs_log_tail_at_once_both_succeed(make_service, pg_url, nomad, nomad_runner):
    """Two workers whose views of the membership differ pick the same running run for its log tail
    (the least recently kept come first on both) and write it at once (PostgreSQL). It used to be a
    DELETE then an INSERT of the (run, rank, stream) row: the second worker's INSERT waited on the
    first's uncommitted row and, once that committed, failed on the primary key (UniqueViolation),
    ending its reconcile pass with an error. The tail is one INSERT ... ON CONFLICT DO UPDATE now."""
    from experiments.db import database_url
    from experiments.models import RunLog
    from experiments.services import logs as run_logs
    from tests.experiments.test_idle import _running

    svc = make_service(database_url(pg_url), nomad_runner)
    exp_id, _, alloc = _running(svc, nomad, "tail")
    nomad.write_log(alloc, "step 1 loss 2.31\n")
    _the_second_meets_the_firsts_held_commit(svc, lambda sessions, _: run_logs.keep(sessions, svc.ctx.runner, [exp_id], now=svc.clock()))
    with svc.ctx.sessions() as session:
        kept = session.scalars(select(RunLog.text).where(RunLog.experiment_id == exp_id, RunLog.stream == "stdout")).all()
    assert kept == ["step 1 loss 2.31\n"], kept


def test_two_workers_downsampling_one_runs_usage_at_once_keep_every_sample(make_service, pg_url, nomad_runner):
    """Two workers whose views of the membership differ sample the same run in the same moment, and
    its series reaches MAX_POINTS rows in both (PostgreSQL). Each halved the series: it read the rows,
    deleted them and inserted the merged pairs. The second one's DELETE waited on the first's and
    then, its snapshot older than the first's commit, deleted none of the first's merged rows, and its
    own merged pairs (the same timestamps) failed on the primary key (UniqueViolation), losing its
    sample. The run's row is locked before the series is counted for halving: the second then counts
    what the first left. Every sample counts once: the sum of ``samples`` is what was recorded."""
    from datetime import timedelta

    from sqlalchemy import func

    from experiments.db import database_url
    from experiments.models import RunUsage
    from experiments.services import usage as run_usage
    from jobs.usage import Usage

    svc = make_service(database_url(pg_url), nomad_runner)
    exp_id = _submit(svc.ctx, 1).id
    start = svc.clock()
    with svc.ctx.sessions() as session, session.begin():
        session.add_all(RunUsage(experiment_id=exp_id, at=start + timedelta(minutes=i), samples=1, util_mean_pct=50.0, util_peak_pct=50.0,
                                 memory_peak_mib=1000.0, util_max_pct=50.0) for i in range(run_usage.MAX_POINTS))

    def record(sessions, n: int) -> None:
        with sessions() as session, session.begin():
            run_usage.record(session, {exp_id: Usage(10.0, 2000.0, 1, 10.0)}, now=start + timedelta(minutes=1000 + n))

    _the_second_meets_the_firsts_held_commit(svc, record)
    with svc.ctx.sessions() as session:
        rows, samples = session.execute(select(func.count(), func.sum(RunUsage.samples)).where(RunUsage.experiment_id == exp_id)).one()
    assert samples == run_usage.MAX_POINTS + 2 and rows <= run_usage.MAX_POINTS, (rows, samples)


def test_two_workers_back_after_an_outage_beat_at_once_without_a_deadlock(make_service, pg_url, nomad_runner):
    """Both workers' heartbeats are older than PRUNE_AFTER (the database was out for longer), and both
    beat at once (PostgreSQL). A beat updates its own row, then deletes the long-dead ones: each
    deleted the other's row while holding its own, and waited on it, and PostgreSQL aborted one beat
    (deadlock detected). The prune skips a row another beat holds: that worker is refreshing it. A
    long-dead row nobody holds is still pruned."""
    from datetime import timedelta

    from sqlalchemy import event

    from experiments.background.membership import PRUNE_AFTER
    from experiments.db import database_url

    svc = make_service(database_url(pg_url), nomad_runner)
    a, b = _worker(svc, svc.clock, STEADY), _worker(svc, svc.clock, STEADY)
    gone = _worker(svc, svc.clock, STEADY)  # long dead: its row is pruned all the same
    with svc.ctx.sessions() as session, session.begin():
        session.execute(update(WorkerBeat).values(heartbeat_at=svc.clock() - PRUNE_AFTER - timedelta(minutes=1)))
    svc.clock.advance(seconds=1)
    both = threading.Barrier(2, timeout=60)
    beating = {}

    def prune_together(conn, cursor, statement, parameters, context, executemany) -> None:
        """Each beat reaches its prune with its own row updated; both prune only then."""
        if threading.current_thread().name in beating and statement.lstrip().upper().startswith("DELETE FROM WORKERS"):
            both.wait()

    engine = svc.ctx.sessions().get_bind()
    event.listen(engine, "before_cursor_execute", prune_together)
    errors: list[BaseException] = []

    def beat(ctx) -> None:
        try:
            ctx.membership.beat(ctx.sessions, svc.clock())
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=beat, args=(ctx,), name=f"beat-{i}") for i, ctx in enumerate((a, b))]
    beating.update((thread.name, thread) for thread in threads)
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        event.remove(engine, "before_cursor_execute", prune_together)
    assert not errors, errors
    with svc.ctx.sessions() as session:
        beats = dict(session.execute(select(WorkerBeat.id, WorkerBeat.heartbeat_at)).all())
    assert beats == {a.membership.worker_id: svc.clock(), b.membership.worker_id: svc.clock()}, (beats, gone.membership.worker_id)
