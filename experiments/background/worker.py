"""The background worker: dispatch in one loop, follow (reconcile, then reap) in another (threads
of ``gpufleet serve`` by default, or their own process with ``gpufleet serve --worker-only``).

Two loops, not one: a reconcile pass waits on the schedulers' answers (a slow API server, a
namespace full of objects, a scheduler that stalls until its timeout), and while one thread did
every step, every submission waited behind that pass. The dispatch loop touches only the outbox
and ``runner.submit``/``find``/``stop`` for its own rows, so a slow pass never delays a
submission; the follow loop cannot be starved by a burst of dispatches either. Both share the
runner (its clients are thread-safe connection pools) and claim rows with conditional UPDATEs,
so they never act on one row twice.

A third thread writes this worker's heartbeat (``background.membership``): several workers on
one database split dispatch (row claims), reconcile and reap (buckets of runs) among the
live ones, and take over a dead one's share once its heartbeat is older than the TTL. The
heartbeat has its own thread so a long reconcile pass never makes a live worker look dead.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from experiments.background.context import Context, log
from experiments.binding import confirm
from experiments.background.dispatch import process_outbox
from experiments.background.budget import process_budgets
from experiments.background.idle import process_idle
from experiments.background.pool_usage import check_pool_usage
from experiments.background.orphans import process_holders
from experiments.background.reap import process_overdue
from experiments.background.reconcile import process_scheduled

Step = Callable[[Context], int]


def _timed_reconcile(ctx: Context) -> int:
    started = time.monotonic()
    try:
        return process_scheduled(ctx)
    finally:
        ctx.metrics.reconcile_seconds.observe(time.monotonic() - started)


def refresh_bindings(ctx: Context) -> int:
    """Which scheduler answers for each bound cluster, when that check is due (``experiments.binding``)."""
    confirm(ctx.runner, ctx.sessions, ctx.clock())
    return 0


# The dispatch loop runs process_outbox alone (``Worker.process_outbox``). Identities are checked in the follow
# loop only: asking a scheduler that does not answer takes its client's timeouts, which must never hold up
# dispatch to the other clusters.
# Budgets and the idle policy act after the reconcile pass has refreshed states, usage and log tails;
# process_holders after the reconcile: it proves the release of the runs that pass saw end, and lists orphans.
FOLLOW_STEPS: tuple[Step, ...] = (refresh_bindings, _timed_reconcile, process_overdue, process_holders, process_budgets, process_idle,
                                  check_pool_usage)


def _run(ctx: Context, steps: tuple[Step, ...]) -> tuple[int, bool]:
    """The steps in order; returns the work they reported (a failing step counts 0) and whether one failed."""
    done, failed = 0, False
    for step in steps:
        try:
            done += step(ctx)
        except Exception:  # noqa: BLE001 - the loop must survive a bad pass; the next pass retries
            log.exception("background step %s failed", step.__name__)
            failed = True
    return done, failed


def run_once(ctx: Context) -> None:
    """One pass of every step in order (tests and tools that step the service by hand); a
    failing step is logged and the others still run."""
    _run(ctx, (refresh_bindings, process_outbox, *FOLLOW_STEPS[1:]))


class Worker:
    """The two loops. ``heartbeat`` is the older of their last passes, so /healthz reports a
    stuck loop even while the other one keeps going."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self._stop = threading.Event()
        self._loops_done = threading.Event()  # the heartbeat beats until the loops are done (or the stop's join gives up)
        self._beats: dict[str, float | None] = {"dispatch": None, "follow": None}
        self._loops = [threading.Thread(target=self._loop, args=(name, steps), name=f"gpufleet-{name}", daemon=True)
                       for name, steps in (("dispatch", (self.process_outbox,)), ("follow", FOLLOW_STEPS))]
        self._beating = threading.Thread(target=self._heartbeat, name="gpufleet-heartbeat", daemon=True)

    @property
    def heartbeat(self) -> float | None:
        beats = list(self._beats.values())
        return None if None in beats else min(b for b in beats if b is not None)

    def start(self) -> None:
        """Register (the first heartbeat, so the loops start with their share), then run."""
        self._ctx.membership.beat(self._ctx.sessions, self._ctx.clock())
        for thread in (*self._loops, self._beating):
            thread.start()

    def stop(self) -> None:
        """Stop the loops; once they are done, leave the membership (the others re-split at once).
        A loop still busy after 30 s keeps the row, which then goes stale: its claims pass on after the TTL."""
        self._stop.set()
        # The loops first, the heartbeat beating meanwhile: a dispatch still in flight belongs to a live worker (a
        # silent one is taken for dead after the TTL and its claim taken over while the submit is in flight).
        for thread in self._loops:
            if thread.ident is not None:  # a stop during start: threads not started yet have nothing to join
                thread.join(timeout=30)
        self._loops_done.set()
        if self._beating.ident is not None:
            self._beating.join(timeout=30)
        if not any(thread.is_alive() for thread in (*self._loops, self._beating)):
            try:
                self._ctx.membership.leave(self._ctx.sessions)
            except Exception:  # noqa: BLE001 - the row then goes stale instead, with the same effect after the TTL
                log.exception("could not remove this worker's heartbeat row")

    def _heartbeat(self) -> None:
        """Beat every ``heartbeat_seconds`` from the previous beat's start, not from its end: the worker fences
        itself once its last successful beat started more than ``worker_lost_seconds`` less one period ago (1 s),
        and a pause counted from each beat's end let two commits of a quarter second in a row fence a live worker
        that no other could take over. This way only one beat slower than a whole period fences it."""
        period = self._ctx.timing.heartbeat_seconds
        started = time.monotonic()
        while not self._loops_done.wait(max(0.0, started + period - time.monotonic())):
            started = time.monotonic()
            try:
                self._ctx.membership.beat(self._ctx.sessions, self._ctx.clock())
            except Exception:  # noqa: BLE001 - a missed beat fences this worker after the TTL; the next one may succeed
                log.exception("heartbeat failed")

    def process_outbox(self, ctx: Context) -> int:
        """The dispatch loop's one step: a pass that stops claiming once ``stop`` is called."""
        return process_outbox(ctx, stopping=self._stop.is_set)

    def wait(self) -> None:
        """Block until ``stop`` (``gpufleet serve --worker-only``)."""
        while not self._stop.wait(1.0):
            pass

    def _loop(self, name: str, steps: tuple[Step, ...]) -> None:
        while not self._stop.is_set():
            dispatched, failed = _run(self._ctx, steps)
            self._beats[name] = time.monotonic()
            if name == "dispatch" and dispatched and not failed:
                continue  # a burst is drained pass after pass, not one batch per poll interval
            timing = self._ctx.timing
            # A failing pass (the database down, say) retries at the poll interval: the idle dispatch check's
            # 0.1 s would log its traceback ten times a second for as long as the outage lasts.
            quick = name == "dispatch" and not failed
            self._stop.wait(min(timing.poll_seconds, timing.dispatch_poll_seconds) if quick else timing.poll_seconds)
