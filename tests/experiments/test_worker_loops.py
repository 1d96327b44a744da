"""Dispatch has its own loop: a reconcile pass that waits on a stalled scheduler does not delay
a new submission (security round three: one worker thread did dispatch, reconcile and reap, so a
slow pass held every tenant's submissions). Latches, not sleeps: the scheduler double blocks in
the reconciler's poll until the test releases it, and the test waits for the new run's dispatch
while that poll is still blocked."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from experiments.background.context import Timing
from experiments.background.worker import Worker
from experiments.models import Experiment
from tests.experiments.test_dispatch import PARENT

WAIT_SECONDS = 20.0  # a bound for the latch, never reached when the loops are independent


class StallingRunner:
    """The Nomad runner, except that a batch poll (the reconciler's call) blocks until released."""

    scheduler = "nomad"

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.stalled = threading.Event()
        self.release = threading.Event()
        self.submitted: dict[str, threading.Event] = {}

    def poll(self, run_ids: Sequence[str], known: Mapping[str, str]) -> Any:
        self.stalled.set()
        self.release.wait(WAIT_SECONDS * 2)
        return self.inner.poll(run_ids, known)

    def submit(self, job: Any, meta: Mapping[str, str], *, idempotency_key: str | None = None, attempt: int = 1) -> str:
        run_id = self.inner.submit(job, meta, idempotency_key=idempotency_key, attempt=attempt)
        self.submitted.setdefault(str(idempotency_key), threading.Event()).set()
        return run_id

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_stalled_reconcile_does_not_delay_the_dispatch_of_a_new_submission(make_service, sqlite_url, nomad, nomad_runner):
    runner = StallingRunner(nomad_runner)
    svc = make_service(sqlite_url, runner, timing=Timing(poll_seconds=0.05))
    headers = svc.token("finetune")
    first = svc.submit(headers).json()
    worker = Worker(svc.ctx)
    worker.start()
    try:
        # The first run is dispatched, then the follow loop polls it and hangs in the scheduler.
        assert runner.stalled.wait(WAIT_SECONDS), "the reconciler never polled the first run"
        second = svc.submit(headers, meta={"dataset_uri": "hf://datasets/acme/chat@v3", "run_id": "r2"}).json()
        latch = runner.submitted.setdefault(second["id"], threading.Event())
        assert latch.wait(WAIT_SECONDS), "the new submission waited for the stalled reconcile pass"
        assert not runner.release.is_set()  # the reconcile pass is still blocked while it was dispatched
        assert len(nomad.dispatched(PARENT)) == 2
        with svc.ctx.sessions() as session:
            assert session.get(Experiment, first["id"]).run_id  # the run the stalled pass is asking about
    finally:
        runner.release.set()
        worker.stop()


class _OneWait(threading.Event):
    """The loop's stop event: records how long the loop asked to wait, and stops it at its first wait."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        self.set()
        return True


def test_a_failing_dispatch_pass_retries_at_the_poll_interval_not_the_idle_checks():
    """The idle dispatch check runs every 0.1 s; with the database down it raised on every one, and the
    loop logged a traceback ten times a second. A pass with a failing step waits the poll interval
    (fails on the loop that waited 0.1 s whatever the pass did); a quiet idle pass still waits 0.1 s."""
    from types import SimpleNamespace

    timing = Timing()
    worker = Worker(SimpleNamespace(timing=timing))  # the loop reads only the timing

    def database_down(_ctx: object) -> int:
        raise RuntimeError("connection refused")

    worker._stop = _OneWait()
    worker._loop("dispatch", (database_down,))
    assert worker._stop.waits == [timing.poll_seconds]
    worker._stop = _OneWait()
    worker._loop("dispatch", (lambda _ctx: 0,))
    assert worker._stop.waits == [min(timing.poll_seconds, timing.dispatch_poll_seconds)] and timing.dispatch_poll_seconds < timing.poll_seconds


class _HeldSubmits(StallingRunner):
    """The Nomad runner, except that every submit (not the poll) waits for ``release``; ``stalled`` says one began
    and ``submitted`` has the keys of all that did."""

    def poll(self, run_ids: Sequence[str], known: Mapping[str, str]) -> Any:
        return self.inner.poll(run_ids, known)

    def submit(self, job: Any, meta: Mapping[str, str], *, idempotency_key: str | None = None, attempt: int = 1) -> str:
        self.submitted.setdefault(str(idempotency_key), threading.Event())
        self.stalled.set()
        assert self.release.wait(WAIT_SECONDS), "the test never released the submits"
        return self.inner.submit(job, meta, idempotency_key=idempotency_key, attempt=attempt)


def test_a_stopped_worker_claims_no_more_of_a_burst_and_leaves_the_rest_to_the_others(make_service, sqlite_url, nomad_runner, catalog):
    """SIGTERM in the middle of a burst: the dispatch pass finishes the rows it holds and claims nothing more.
    It used to claim on to the end of the burst (fails here with all 12 submitted): against a slow scheduler
    that outlasted the 30 s join, so the process exited with dispatches in flight and its heartbeat row left to
    go stale. Latches: every submit waits until the stop has been asked for."""
    from experiments.models import Outbox
    from tests.experiments.test_scale_out import _roomy, _submit

    runner = _HeldSubmits(nomad_runner)
    svc = make_service(sqlite_url, runner, jobs=_roomy(catalog), timing=Timing(poll_seconds=0.05, dispatch_concurrency=2))
    ids = [_submit(svc.ctx, i).id for i in range(12)]
    worker = Worker(svc.ctx)
    worker.start()
    assert runner.stalled.wait(WAIT_SECONDS), "the worker never dispatched"
    stopping = threading.Thread(target=worker.stop)
    stopping.start()
    assert worker._stop.wait(WAIT_SECONDS)
    runner.release.set()
    stopping.join(WAIT_SECONDS * 2)
    assert not stopping.is_alive()
    # 2 threads and a claim of 1 more waiting for one: 3 rows at most were the pass's when the stop came
    submitted = set(runner.submitted)
    assert 1 <= len(submitted) <= 3, submitted
    with svc.ctx.sessions() as session:
        left = [session.get(Outbox, i) for i in ids if i not in submitted]
        assert len(left) == 12 - len(submitted)
        assert all(row is not None and row.claimed_by is None for row in left)  # free for the live workers at once
        assert {session.get(Experiment, i).state for i in ids if i not in submitted} == {"pending"}


def test_a_stopping_worker_keeps_beating_while_its_dispatches_are_in_flight(make_service, sqlite_url, nomad_runner, catalog):
    """``stop`` lets the dispatch in flight finish (up to the 30 s join), but the heartbeat thread watched the same
    stop event and ended at once: after the TTL the others took the worker for dead and could take over the claim
    whose submit was still in flight (a second submit of its key), and the worker fenced itself mid-dispatch.
    The heartbeat must go on until the loops are done. Latches: the submit is held until a beat is seen after the
    stop was asked for (fails on 4bce025: no beat comes, the latch times out)."""
    from tests.experiments.test_scale_out import _roomy, _submit

    runner = _HeldSubmits(nomad_runner)
    svc = make_service(sqlite_url, runner, jobs=_roomy(catalog), timing=Timing(poll_seconds=0.05, dispatch_concurrency=1))
    _submit(svc.ctx, 0)
    worker = Worker(svc.ctx)
    beat_after_stop = threading.Event()
    membership, beat = svc.ctx.membership, svc.ctx.membership.beat

    def watched_beat(*args: Any, **kwargs: Any) -> Any:
        if worker._stop.is_set():
            beat_after_stop.set()
        return beat(*args, **kwargs)

    membership.beat = watched_beat  # type: ignore[method-assign]
    worker.start()
    assert runner.stalled.wait(WAIT_SECONDS), "the worker never dispatched"
    stopping = threading.Thread(target=worker.stop)
    stopping.start()
    assert worker._stop.wait(WAIT_SECONDS)
    beaten = beat_after_stop.wait(WAIT_SECONDS)
    runner.release.set()
    stopping.join(WAIT_SECONDS * 2)
    assert not stopping.is_alive()
    assert beaten, "the heartbeat stopped while a dispatch was still in flight"
    assert len(runner.submitted) == 1
