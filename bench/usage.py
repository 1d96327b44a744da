"""GPU utilization sampling's cost in the reconcile pass: 5,000 tracked running Nomad runs, each
pass with sampling off (``Timing(usage_seconds=0)``) and on (the default: at most 25 allocation
stats GETs a pass, least recently sampled first), interleaved so load drift hits both the same.

Run: ``.venv/bin/python bench/usage.py [--passes 9]`` (about a minute; SQLite in a temp dir and the
Nomad API double, which answers each stats GET from its in-memory allocations; no Vault needed:
a pass never mints). Prints the median pass of each and their ratio (the issue's goal: <= 1.2x).
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


def main(passes: int) -> None:
    from experiments import db
    from experiments.app import utcnow
    from experiments.background.context import Context, Timing
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
    contexts = {name: Context(sessions=sessions, runner=runner, catalog=catalog, clock=utcnow, metrics=Metrics(sessions, utcnow),
                              timing=Timing(usage_seconds=seconds, reconcile_batch=batch)) for name, seconds in (("off", 0.0), ("on", 60.0))}
    try:
        _seed(contexts["off"], double)
        for ctx in contexts.values():  # warm: the service has been following them (fingerprints known)
            process_scheduled(ctx)
        times: dict[str, list[float]] = {"off": [], "on": []}
        for _ in range(passes):
            for name, ctx in contexts.items():
                started = time.perf_counter()
                process_scheduled(ctx)
                times[name].append(time.perf_counter() - started)
        off, on = statistics.median(times["off"]), statistics.median(times["on"])
        print(f"reconcile pass, {TRACKED} running Nomad runs, {passes} passes each (medians): "
              f"sampling off {off * 1000:.0f} ms | on {on * 1000:.0f} ms | ratio x{on / off:.2f}", flush=True)
    finally:
        engine.dispose()
        client.close()
        double.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=9)
    main(parser.parse_args().passes)
