"""A worker process for the scale-out tests: what ``gpufleet serve --worker-only`` runs (the
``Worker`` of ``experiments.background.worker`` with its heartbeat), built on the suite's fleet,
the Nomad API double and the real OpenBao of the test that starts it.

``python -m tests.experiments.worker_process <db url> <nomad address> [--hang-after N --marker PATH] [--ttl S]``
with VAULT_ADDR, VAULT_TOKEN and NOMAD_TOKEN in the environment (never on the command line).
With ``--hang-after N`` every submit after the worker's N-th reaches Nomad, then the process
appends its key to ``PATH`` and that dispatch thread hangs before it can record the run: the test
kills the process there with SIGKILL, the moment its dispatches are most in flight (Nomad has the
runs, the database does not know them). ``--ttl`` replaces the heartbeat TTL.
"""

from __future__ import annotations

import argparse
import os
import threading
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from experiments import db
from experiments.app import utcnow
from experiments.background.context import Context, Timing
from experiments.background.worker import Worker
from experiments.metrics import Metrics
from experiments.services.catalog import Catalog
from jobs.nomad.client import NomadClient, NomadSettings
from jobs.runner import NomadRunner
from tests.conftest import load_fleet

# Short heartbeat, TTL and lost bound (what the tests prove: takeover after them), a lease far longer than the tests.
TIMING = Timing(poll_seconds=0.05, heartbeat_seconds=0.2, worker_ttl_seconds=1.5, worker_lost_seconds=0.8, dispatch_lease_seconds=600, usage_seconds=0)


class HangsAfter:
    """The real runner; every submit after the n-th returns nowhere: its key is appended to the marker
    and its thread blocks."""

    def __init__(self, inner: NomadRunner, n: int, marker: Path) -> None:
        self.inner, self.n, self.marker, self.scheduler = inner, n, marker, inner.scheduler
        self.count = 0
        self._lock = threading.Lock()

    def submit(self, job: Any, meta: Mapping[str, str], *, idempotency_key: str | None = None, attempt: int = 1) -> str:
        run_id = self.inner.submit(job, meta, idempotency_key=idempotency_key, attempt=attempt)
        with self._lock:
            self.count += 1
            hang = self.count > self.n
            if hang:
                with self.marker.open("a") as marker:
                    marker.write(f"{idempotency_key}\n")
        if hang:
            threading.Event().wait()
        return run_id

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("db_url")
    parser.add_argument("nomad_address")
    parser.add_argument("--hang-after", type=int)
    parser.add_argument("--marker", type=Path)
    parser.add_argument("--ttl", type=float)
    args = parser.parse_args()
    engine = db.make_engine(args.db_url)
    sessions = db.session_factory(engine)
    client = NomadClient(NomadSettings(address=args.nomad_address, token=os.environ["NOMAD_TOKEN"], timeout_seconds=5.0, retries=2, backoff_seconds=0.01))
    runner: Any = NomadRunner(client, {"VAULT_ADDR": os.environ["VAULT_ADDR"], "VAULT_TOKEN": os.environ["VAULT_TOKEN"]})
    if args.hang_after is not None:
        runner = HangsAfter(runner, args.hang_after, args.marker)
    ctx = Context(sessions=sessions, runner=runner, catalog=Catalog(configs=load_fleet()), clock=utcnow, metrics=Metrics(sessions, utcnow),
                  timing=TIMING if args.ttl is None else replace(TIMING, worker_ttl_seconds=args.ttl))
    worker = Worker(ctx)
    worker.start()
    print(f"worker {ctx.membership.worker_id} started", flush=True)
    worker.wait()


if __name__ == "__main__":
    main()
