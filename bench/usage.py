"""GPU utilization sampling's cost in the reconcile pass: 5,000 tracked running Nomad runs, each
pass with sampling off (``Timing(usage_seconds=0)``) and on (the default: at most 25 allocation
stats GETs a pass, least recently sampled first), interleaved so load drift hits both the same.

Run: ``.venv/bin/python bench/usage.py [--passes 9]`` (about a minute; SQLite in a temp dir and the
Nomad API double, which answers each stats GET from its in-memory allocations; no Vault needed:
a pass never mints). Prints the median pass of each and their ratio (the issue's goal: <= 1.2x).

``--idle`` compares instead today's follow pass (reconcile with sampling) with the same pass plus
the steps issue 25 adds after it: the budget check (a budget on the tenant, not crossed) and the
idle policy (the example files' defaults), over 5,000 running runs that each have an hour of kept
utilization samples and log tails, as a service that has followed them for a while has (goal:
<= 1.3x). Both steps run on every pass here (``policy_seconds=0``; the service runs them once a
minute), the worst case; the line after it gives the average at the default. No run is idle in it
(they all work and print), so each pass does the full evaluation and stops nothing.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TRACKED = 5000
META = {"dataset_uri": "hf://datasets/acme/chat@v3"}


class _Unrecorded(list):
    """The double keeps no request log here (its scans of it would grow with the run)."""

    def append(self, item: Any) -> None:
        return


def _seed(ctx: Any, double: Any) -> None:
    from experiments.models import Experiment

    namespace, now = "finetune", ctx.clock()
    with ctx.sessions() as session, session.begin():
        for i in range(TRACKED):
            job_id = f"finetune-llama/dispatch-bench-{i:05d}"
            alloc = f"alloc-bench-{i:05d}"
            double.state.jobs[(namespace, job_id)] = {"ID": job_id, "ParentID": "finetune-llama", "Status": "running", "Namespace": namespace}
            double.state.allocations[job_id] = [{"ID": alloc, "JobID": job_id, "Namespace": namespace, "TaskGroup": "train", "ClientStatus": "running",
                                                 "DesiredStatus": "run", "NodeName": "a100-0", "CreateIndex": 1, "ModifyIndex": 1,
                                                 "TaskStates": {"train": {"State": "running", "Events": []}}}]
            double.gpu_stats[alloc] = [(i % 100, 20_000), ((i * 7) % 100, 30_000)]
            session.add(Experiment(id=str(uuid.uuid4()), tenant=namespace, job="finetune-llama", cluster="prod-nomad", pool="a100", gpus=2, meta=META,
                                   state="running", scheduler="nomad", run_id=f"{namespace}/{job_id}", submitted_by="bench", request_hash="-",
                                   deadline_hours=12, price_per_gpu_hour=2.93, price_kind="list", created_at=now, updated_at=now, running_at=now,
                                   queued_at=now, reconciled_at=now, scheduler_refs={"allocation": alloc}))


def _seed_history(ctx: Any) -> None:
    """An hour of samples (every 2 min, all busy) and fresh log tails per run, as after a while of following."""
    from datetime import timedelta

    from sqlalchemy import select

    from experiments.models import Experiment, RunLog, RunUsage

    now = ctx.clock()
    with ctx.sessions() as session, session.begin():
        ids = list(session.scalars(select(Experiment.id)))
        session.query(Experiment).update({Experiment.running_at: now - timedelta(hours=1)})
        for experiment_id in ids:
            session.add_all(RunUsage(experiment_id=experiment_id, at=now - timedelta(minutes=2 * k), samples=1, util_mean_pct=60.0,
                                     util_peak_pct=60.0, memory_peak_mib=20_000, util_max_pct=70.0) for k in range(1, 31))
            session.add_all(RunLog(experiment_id=experiment_id, rank=0, stream=stream, text=f"step {k}\n", captured_at=now, changed_at=now)
                            for k, stream in enumerate(("stdout", "stderr")))


def _policies(catalog: Any, *, idle: bool) -> Any:
    """The example fleet with the idle policy off everywhere (``idle=False``), or as the files say and
    a budget on every tenant that the bench's spend does not reach."""
    from clusters.schema import IdlePolicy
    from experiments.services.catalog import Catalog

    off = IdlePolicy(low_util_minutes=0, no_logs_minutes=0)
    configs = tuple(c.model_copy(update={"idle": c.idle if idle else off, "tenants": tuple(
        t.model_copy(update={"idle": t.idle if idle else None, "budget_usd_month": 10_000_000.0 if idle else None}) for t in c.tenants)})
        for c in catalog.configs)
    return Catalog(catalog.jobs_dir, configs=configs, vault=catalog.vault)


def main(passes: int, idle: bool = False) -> None:
    from experiments import db
    from experiments.app import utcnow
    from experiments.background.context import Context, Timing
    from sqlalchemy import text

    from experiments.background.budget import process_budgets
    from experiments.background.idle import process_idle
    from experiments.background.reconcile import process_scheduled
    from experiments.metrics import Metrics
    from experiments.services.catalog import Catalog
    from jobs.nomad.client import NomadClient, NomadSettings
    from jobs.runner import NomadRunner
    from tests.jobs.nomad_double import FakeNode, NomadDouble

    workdir = Path(tempfile.mkdtemp(prefix="gpufleet-bench-usage-"))
    double = NomadDouble([FakeNode("a100-0", "a100", "a100", "A100-SXM4-40GB", 40960, 10_000)]).start()
    double.requests = _Unrecorded()
    client = NomadClient(NomadSettings(address=double.address, timeout_seconds=10, retries=2, backoff_seconds=0.01))
    runner = NomadRunner(client, {})
    engine = db.make_engine(f"sqlite:///{workdir / 'usage.db'}")
    db.upgrade(engine)
    sessions = db.session_factory(engine)
    catalog = Catalog()
    batch = Timing().reconcile_batch * 3  # one pass covers all 5,000
    if idle:
        contexts = {name: Context(sessions=sessions, runner=runner, catalog=_policies(catalog, idle=name == "on"), clock=utcnow,
                                  metrics=Metrics(sessions, utcnow), timing=Timing(reconcile_batch=batch, policy_seconds=0))
                    for name in ("off", "on")}
        steps = {"off": (process_scheduled,), "on": (process_scheduled, process_budgets, process_idle)}
    else:
        contexts = {name: Context(sessions=sessions, runner=runner, catalog=catalog, clock=utcnow, metrics=Metrics(sessions, utcnow),
                                  timing=Timing(usage_seconds=seconds, reconcile_batch=batch)) for name, seconds in (("off", 0.0), ("on", 60.0))}
        steps = {"off": (process_scheduled,), "on": (process_scheduled,)}
    try:
        _seed(contexts["off"], double)
        if idle:
            _seed_history(contexts["off"])
        for ctx in contexts.values():  # warm: the service has been following them (fingerprints known)
            process_scheduled(ctx)
        times: dict[str, list[float]] = {"off": [], "on": []}
        for _ in range(passes):
            for name, ctx in contexts.items():
                started = time.perf_counter()
                for step in steps[name]:
                    step(ctx)
                times[name].append(time.perf_counter() - started)
        off, on = statistics.median(times["off"]), statistics.median(times["on"])
        what = ("idle policy and budget off", "on") if idle else ("sampling off", "on")
        print(f"follow pass, {TRACKED} running Nomad runs, {passes} passes each (medians): "
              f"{what[0]} {off * 1000:.0f} ms | {what[1]} {on * 1000:.0f} ms | ratio x{on / off:.2f}", flush=True)
        if idle:
            every = Timing().policy_seconds
            print(f"(every pass evaluates both policies here; the service does so every {every:g} s, so its passes average"
                  f" x{(off + (on - off) * off / every) / off:.3f} of today's)", flush=True)
            with sessions() as session:
                states = dict(session.execute(text("SELECT state, count(*) FROM experiments GROUP BY state")).all())
            print(f"states after the passes: {states} (the idle policy stopped nothing: every run works)", flush=True)
    finally:
        engine.dispose()
        client.close()
        double.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=9)
    parser.add_argument("--idle", action="store_true", help="compare the follow pass with and without the idle policy and budgets (issue 25)")
    arguments = parser.parse_args()
    main(arguments.passes, arguments.idle)
