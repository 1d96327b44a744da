"""A worker process for the scale-out tests: what ``gpufleet serve --worker-only`` runs (the
``Worker`` of ``experiments.background.worker`` with its heartbeat), built on the suite's fleet,
the Nomad API double and the real OpenBao of the test that starts it.

``python -m tests.experiments.worker_process <db url> <nomad address> [--hang-after N --marker PATH]``
with VAULT_ADDR, VAULT_TOKEN and NOMAD_TOKEN in the environment (never on the command line).
With ``--hang-after N`` the worker's (N+1)-th submit reaches Nomad, then the process writes
``PATH`` and hangs before it can record the run: the test kills it there with SIGKILL, the
moment a dispatch is most in flight (Nomad has the run, the database does not know it).
"""

from __future__ import annotations

import argparse
import os
import threading
from collections.abc import Mapping
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

# Short heartbeat and TTL (what the test proves: takeover after the TTL), a lease far longer than the test.
TIMING = Timing(poll_seconds=0.05, heartbeat_seconds=0.2, worker_ttl_seconds=1.5, dispatch_lease_seconds=600, usage_seconds=0)


class HangsAfter:
    """The real runner; its (n+1)-th submit returns nowhere: the marker is written and the thread blocks."""

    def __init__(self, inner: NomadRunner, n: int, marker: Path) -> None:
        self.inner, self.n, self.marker, self.scheduler = inner, n, marker, inner.scheduler
        self.count = 0

    def submit(self, job: Any, meta: Mapping[str, str], *, idempotency_key: str | None = None, attempt: int = 1) -> str:
        run_id = self.inner.submit(job, meta, idempotency_key=idempotency_key, attempt=attempt)
        self.count += 1
        if self.count > self.n:
            self.marker.write_text(str(idempotency_key))
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
    args = parser.parse_args()
    engine = db.make_engine(args.db_url)
    sessions = db.session_factory(engine)
    client = NomadClient(NomadSettings(address=args.nomad_address, token=os.environ["NOMAD_TOKEN"], timeout_seconds=5.0, retries=2, backoff_seconds=0.01))
    runner: Any = NomadRunner(client, {"VAULT_ADDR": os.environ["VAULT_ADDR"], "VAULT_TOKEN": os.environ["VAULT_TOKEN"]})
    if args.hang_after is not None:
        runner = HangsAfter(runner, args.hang_after, args.marker)
    ctx = Context(sessions=sessions, runner=runner, catalog=Catalog(configs=load_fleet()), clock=utcnow, metrics=Metrics(sessions, utcnow), timing=TIMING)
    worker = Worker(ctx)
    worker.start()
    print(f"worker {ctx.membership.worker_id} started", flush=True)
    worker.wait()


if __name__ == "__main__":
    main()
