"""Recovery latency: a run's node is lost -> its next attempt is dispatched (issue 25).

Run: ``.venv/bin/python bench/recovery.py [RUNS]`` (default 30 runs; about a minute; loopback only).

A real OpenBao dev server (the tests' bootstrap: the repo's policies and roles), the Nomad API
double (tests/jobs/nomad_double.py) and the control plane on a SQLite file, in this process. For
each run: submit finetune-llama through the API, dispatch it, start its task and see it running;
then the double marks its allocation lost (``lose_node``: ClientStatus "lost", as Nomad writes it)
and the clock starts. Background passes (``worker.run_once``: reconcile, then dispatch) run back
to back until the double receives attempt 2's dispatch (a new wrapped secret_id minted in OpenBao
on the way); the clock stops there. The retry backoff is 0 here: in service the next attempt waits
``--retry-backoff-seconds`` (30 s, doubling) on purpose, and each of the two worker loops sleeps
``--poll-seconds`` (2 s) between its passes, so a served recovery takes the backoff plus at most
two poll intervals plus the figure below. Attempt 2 then succeeds, so the tenant's quota frees.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PARENT = "finetune-llama"
META = {"dataset_uri": "hf://datasets/acme/chat@v3", "run_id": "recovery-1"}


def main(runs: int) -> None:
    from fastapi.testclient import TestClient

    from experiments.app import ServiceSettings, create_app
    from experiments.auth import create_token
    from experiments.background.context import Timing
    from experiments.background.worker import run_once
    from experiments.services.catalog import Catalog
    from jobs.nomad.client import NomadClient, NomadSettings
    from jobs.runner import NomadRunner
    from tests.conftest import load_fleet
    from tests.jobs.conftest import a100_nodes
    from tests.jobs.nomad_double import NomadDouble
    from tests.openbao_fixture import _bootstrap, local_definitions
    from vault_policies.devserver import new_root_token, start_dev_server

    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} cores)")
    work = Path(tempfile.mkdtemp(prefix="gpufleet-recovery-"))
    server = start_dev_server(work / "bao.log", root_token=new_root_token())
    double = NomadDouble(a100_nodes(count=2 * runs + 2)).start()
    try:
        _, orchestrator = _bootstrap(server, local_definitions())
        client = NomadClient(NomadSettings(address=double.address, token=None, timeout_seconds=5.0, retries=2, backoff_seconds=0.01))
        runner = NomadRunner(client, {"VAULT_ADDR": server.addr, "VAULT_TOKEN": orchestrator})
        settings = ServiceSettings(db_url=f"sqlite:///{work / 'experiments.db'}", worker=False, timing=Timing(retry_backoff_seconds=0))
        app = create_app(settings, runner=runner, catalog=Catalog(configs=load_fleet()))
        with TestClient(app) as api:
            ctx = app.state.ctx
            with ctx.sessions() as session, session.begin():
                _, token = create_token(session, tenant="finetune", admin=False, name="bench", now=ctx.clock())
            headers = {"Authorization": f"Bearer {token}"}
            seconds, passes = [], []
            for _ in range(runs):
                exp = api.post("/api/v1/experiments", json={"job": PARENT, "meta": META}, headers=headers).json()
                run_once(ctx)
                first = api.get(f"/api/v1/experiments/{exp['id']}", headers=headers).json()["run_id"].split("/", 1)[1]
                double.start_task(first)
                run_once(ctx)
                dispatched = len(double.calls("POST", "dispatch"))
                double.lose_node(first)
                started, count = time.perf_counter(), 0
                while len(double.calls("POST", "dispatch")) == dispatched:
                    run_once(ctx)
                    count += 1
                    if count > 20:
                        raise SystemExit(f"experiment {exp['id']} got no second attempt within 20 passes")
                seconds.append(time.perf_counter() - started)
                passes.append(count)
                second = api.get(f"/api/v1/experiments/{exp['id']}", headers=headers).json()["run_id"].split("/", 1)[1]
                double.start_task(second)
                double.finish(second, client_status="complete", events=[{"Type": "Terminated", "Time": 2, "ExitCode": 0, "Details": {"exit_code": "0"}}])
                run_once(ctx)
        ordered = sorted(seconds)
        p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
        print(f"recovery latency over {runs} lost nodes (failure visible on the double -> attempt 2 dispatched, backoff 0):"
              f" median {statistics.median(seconds) * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, max {ordered[-1] * 1000:.0f} ms;"
              f" background passes per recovery: {statistics.median(passes):g} (median)")
        print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    finally:
        double.stop()
        server.stop()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 30)
