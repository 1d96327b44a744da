"""The background worker: dispatch, reconcile, reap, in a loop (a thread of ``gpufleet serve``
by default, or its own process with ``gpufleet serve --worker-only``)."""

from __future__ import annotations

import threading
import time

from experiments.background.context import Context, log
from experiments.background.dispatch import process_outbox
from experiments.background.reap import process_overdue
from experiments.background.reconcile import process_scheduled


def run_once(ctx: Context) -> None:
    """One pass of every step; a failing step is logged and the others still run."""
    for step in (process_outbox, _timed_reconcile, process_overdue):
        try:
            step(ctx)
        except Exception:  # noqa: BLE001 - the loop must survive a bad pass; the next pass retries
            log.exception("background step %s failed", step.__name__)


def _timed_reconcile(ctx: Context) -> int:
    started = time.monotonic()
    try:
        return process_scheduled(ctx)
    finally:
        ctx.metrics.reconcile_seconds.observe(time.monotonic() - started)


class Worker:
    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpufleet-worker", daemon=True)
        self.heartbeat: float | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        while not self._stop.is_set():
            run_once(self._ctx)
            self.heartbeat = time.monotonic()
            self._stop.wait(self._ctx.timing.poll_seconds)
