"""Issue 28 review: properties of several workers that the first round of tests did not pin down
(real SQLite and PostgreSQL, the Nomad API double, the session's OpenBao)."""

from __future__ import annotations

import threading
import types

import pytest

from sqlalchemy import event, select
from sqlalchemy.orm import Session

from experiments.background import membership as membership_module
from experiments.background import reconcile
from experiments.background.dispatch import _claim, _dispatch_claimed, process_outbox
from experiments.models import Experiment
from experiments.states import State
from tests.experiments.test_dispatch import PARENT
from tests.experiments.test_scale_out import TIMING, _submit, _worker

pytestmark = pytest.mark.usefixtures("still_fence")  # workers beaten by hand (_worker) age only when a test says so


def test_a_worker_others_see_dead_has_fenced_itself_even_when_its_heartbeat_commit_was_slow(make_service, db_url, nomad_runner, monkeypatch):
    """The others judge a worker by the ``heartbeat_at`` it wrote, the time taken before its beat's
    transaction; the worker judges itself by its own monotonic clock. Both must count from the same
    moment: a beat whose commit waited (a busy database, a pool checkout) must not make the worker
    believe itself fresher than the others see it. Here the beat's commit takes longer than the TTL;
    once B may take A's claim over, A must be fenced (claim and submit nothing)."""
    svc = make_service(db_url, nomad_runner)
    _submit(svc.ctx, 1)
    ticks = [1000.0]
    monkeypatch.setattr(membership_module, "time", types.SimpleNamespace(monotonic=lambda: ticks[0]))
    a, b = _worker(svc, svc.clock), _worker(svc, svc.clock)
    assert _claim(a, None)
    slow = TIMING.worker_ttl_seconds + 0.5

    def commit_waits(session: Session) -> None:
        ticks[0] += slow
        svc.clock.advance(seconds=slow)

    event.listen(Session, "before_commit", commit_waits)
    try:
        a.membership.beat(a.sessions, svc.clock())  # written with the time before the wait
    finally:
        event.remove(Session, "before_commit", commit_waits)
    b.membership.beat(b.sessions, svc.clock())
    assert _claim(b, None)  # A's row in the database is older than the TTL: its claim passed on
    assert a.fenced()


def _provisioning(svc, nomad):
    """One experiment dispatched and placed by the service's own (unregistered) context."""
    exp = _submit(svc.ctx, 1)
    assert process_outbox(svc.ctx) == 1
    reconcile.process_scheduled(svc.ctx)
    with svc.ctx.sessions() as session:
        assert session.get(Experiment, exp.id).state == "provisioning"
    [job] = nomad.dispatched(PARENT)
    return exp, job


def test_a_worker_frozen_in_the_middle_of_a_reconcile_pass_writes_nothing_when_it_wakes(make_service, db_url, nomad, nomad_runner, monkeypatch):
    """Worker A reads the scheduler's lists, then freezes (SIGSTOP) for longer than the TTL. B takes
    A's runs over and records what the scheduler says now (running). A wakes with answers older than
    B's: it is fenced, so it writes nothing (no state, reason, refs or stamp over B's)."""
    svc = make_service(db_url, nomad_runner)
    exp, job = _provisioning(svc, nomad)
    ticks = [1000.0]
    monkeypatch.setattr(membership_module, "time", types.SimpleNamespace(monotonic=lambda: ticks[0]))
    a = _worker(svc, svc.clock)
    real_poll = reconcile.poll
    by_b: list[tuple] = []

    def poll_then_freeze(runner, run_ids, known):
        answers = real_poll(runner, run_ids, known)
        if runner is a.runner and not getattr(poll_then_freeze, "frozen", False):
            poll_then_freeze.frozen = True
            ticks[0] += TIMING.worker_ttl_seconds + 1  # A is stopped; the others see its heartbeat go stale
            svc.clock.advance(seconds=TIMING.worker_ttl_seconds + 1)
            nomad.finish(job, client_status="running")
            b = _worker(svc, svc.clock)
            assert reconcile.process_scheduled(b) == 1  # B alone among the live: it follows every run now
            with svc.ctx.sessions() as session:
                seen = session.get(Experiment, exp.id)
                assert seen.state == "running"
                by_b.append((seen.reason, seen.reconciled_at, seen.scheduler_refs))
            svc.clock.advance(seconds=1)
        return answers

    monkeypatch.setattr(reconcile, "poll", poll_then_freeze)
    with svc.ctx.sessions() as session:
        assert a.share(session, Experiment.id) is None  # A alone: it follows the run
    reconcile.process_scheduled(a)
    assert by_b and a.fenced()
    with svc.ctx.sessions() as session:
        after = session.get(Experiment, exp.id)
        assert (after.state, after.reason, after.reconciled_at, after.scheduler_refs) == ("running", *by_b[0])


def test_a_stale_answer_never_overwrites_a_newer_states_reason(make_service, db_url, nomad, nomad_runner):
    """Two workers may follow one run for a pass while the membership changes (docs/control-plane.md).
    An answer read before the run started (provisioning) applied after a newer one (running) moves
    nothing, and must not put its older reason on the running experiment either."""
    svc = make_service(db_url, nomad_runner)
    exp, job = _provisioning(svc, nomad)
    with svc.ctx.sessions() as session:
        run_id = session.get(Experiment, exp.id).run_id
    nomad.finish(job, client_status="running")
    reconcile.process_scheduled(svc.ctx)
    with svc.ctx.sessions() as session:
        running = session.get(Experiment, exp.id)
        assert running.state == "running"
        reason = running.reason
    reconcile._move(svc.ctx, reconcile.Move(exp.id, State.PROVISIONING, "placed, pulling the image", run_id=run_id))
    with svc.ctx.sessions() as session:
        after = session.get(Experiment, exp.id)
        assert (after.state, after.reason) == ("running", reason)


class _DiesAfterSubmit:
    """The real runner, but the process "dies" (kill -9) once its submit reached the scheduler: nothing after it runs."""

    def __init__(self, inner) -> None:
        self.inner, self.scheduler = inner, inner.scheduler

    def submit(self, *args, **kwargs):
        self.inner.submit(*args, **kwargs)
        raise _Killed

    def __getattr__(self, name):
        return getattr(self.inner, name)


class _Killed(BaseException):
    pass


def test_a_taken_over_dispatch_mints_no_second_secret_id(make_service, db_url, nomad, nomad_runner, vault):
    """Worker A's submit reaches Nomad (one wrapped secret_id minted for the run's one rank), then A is
    killed before it records the run. B takes the claim over: the run exists, so B records it without a
    second submit: OpenBao holds one secret_id for the attempt, not one per claim (the second would be a
    live credential nobody can ever use)."""
    from dataclasses import replace as with_runner

    from tests.jobs.test_no_secrets import _secret_ids

    svc = make_service(db_url, nomad_runner)
    exp = _submit(svc.ctx, 1)
    before = _secret_ids(vault)
    a, b = _worker(svc, svc.clock), _worker(svc, svc.clock)
    a = with_runner(a, runner=_DiesAfterSubmit(a.runner))
    [claim_a] = _claim(a, None)
    with pytest.raises(_Killed):
        _dispatch_claimed(a, claim_a)
    assert _secret_ids(vault) == before + 1
    svc.clock.advance(seconds=TIMING.worker_ttl_seconds + 1)
    b.membership.beat(b.sessions, svc.clock())
    [claim_b] = _claim(b, None)
    assert _dispatch_claimed(b, claim_b)
    with svc.ctx.sessions() as session:
        done = session.get(Experiment, exp.id)
    assert done.state == "queued" and done.run_id == f"finetune/{nomad.dispatched(PARENT)[0]}"
    assert len(nomad.calls("POST", "dispatch")) == 1 and _secret_ids(vault) == before + 1


def test_a_failed_chunk_of_a_reconcile_pass_loses_nothing_the_other_chunks_committed(make_service, db_url, nomad, nomad_runner, catalog, monkeypatch):
    """The chunks of a pass commit on their own threads. One failing (a lost connection, say) must not
    drop what the others committed: their ended runs' logs are still kept (next pass they are terminal
    and never read again), and the failed chunk's runs are read and applied again next pass (their
    answers were not remembered as seen)."""
    from tests.experiments.test_scale_out import _roomy

    monkeypatch.setattr(reconcile, "COMMIT_BATCH", 1)
    svc = make_service(db_url, nomad_runner, jobs=_roomy(catalog))
    ids = [_submit(svc.ctx, i).id for i in range(3)]
    assert process_outbox(svc.ctx) == 3
    for job in nomad.dispatched(PARENT):
        nomad.finish(job, client_status="complete", events=[{"Type": "Terminated", "Time": 2, "ExitCode": 0}])
    broken = sorted(ids)[0]  # the first chunk: the others finish after it fails
    real_apply, kept = reconcile._apply, []

    def apply_or_fail(session, exp, move, now):
        if exp.id == broken:
            raise ConnectionError("server closed the connection unexpectedly")
        return real_apply(session, exp, move, now)

    monkeypatch.setattr(reconcile, "_apply", apply_or_fail)
    monkeypatch.setattr(reconcile.run_logs, "keep", lambda sessions, runner, exp_ids, **kw: kept.extend(exp_ids))
    reconcile.process_scheduled(svc.ctx)
    with svc.ctx.sessions() as session:
        states = {i: session.get(Experiment, i).state for i in ids}
    assert states[broken] != "succeeded" and all(states[i] == "succeeded" for i in ids if i != broken)
    assert sorted(kept) == sorted(i for i in ids if i != broken)
    monkeypatch.setattr(reconcile, "_apply", real_apply)
    reconcile.process_scheduled(svc.ctx)
    with svc.ctx.sessions() as session:
        assert session.get(Experiment, broken).state == "succeeded"
    assert sorted(kept) == sorted(ids)


def test_a_worker_woken_after_its_claim_was_taken_over_submits_nothing_even_once_it_beats_again(make_service, db_url, nomad, nomad_runner, monkeypatch):
    """SIGSTOP of worker A between its claim and its submit for longer than the TTL, then SIGCONT. B took
    the claim over meanwhile. On waking, A's heartbeat thread may beat before its dispatch thread
    looks at the fence, so A is not fenced any more: it must still submit nothing (its claim is B's
    now; two submits of one key may both make a Nomad child, and A's would mint a secret_id for nothing)."""
    svc = make_service(db_url, nomad_runner)
    exp = _submit(svc.ctx, 1)
    ticks = [1000.0]
    monkeypatch.setattr(membership_module, "time", types.SimpleNamespace(monotonic=lambda: ticks[0]))
    a, b = _worker(svc, svc.clock), _worker(svc, svc.clock)
    [claim_a] = _claim(a, None)
    ticks[0] += TIMING.worker_ttl_seconds + 1  # A is stopped
    svc.clock.advance(seconds=TIMING.worker_ttl_seconds + 1)
    b.membership.beat(b.sessions, svc.clock())
    [claim_b] = _claim(b, None)
    a.membership.beat(a.sessions, svc.clock())  # SIGCONT: A's heartbeat thread runs first
    assert not a.fenced()
    assert not _dispatch_claimed(a, claim_a)
    assert not nomad.calls("POST", "dispatch")
    assert _dispatch_claimed(b, claim_b)
    with svc.ctx.sessions() as session:
        assert session.get(Experiment, exp.id).state == "queued"
    assert len(nomad.calls("POST", "dispatch")) == 1


def test_the_short_fence_applies_only_where_the_others_can_take_over_early(make_service, db_url, nomad, nomad_runner, monkeypatch):
    """The 2 s takeover needs PostgreSQL's pg_locks; on SQLite only the TTL passes a worker's work
    on. A worker there whose heartbeat waited a few seconds for the write lock (a single-process
    service under load) must keep dispatching, not fence itself and give its claims back as if the
    others could already have taken them over."""
    svc = make_service(db_url, nomad_runner)
    _submit(svc.ctx, 1)
    ticks = [1000.0]
    monkeypatch.setattr(membership_module, "time", types.SimpleNamespace(monotonic=lambda: ticks[0]))
    a = _worker(svc, svc.clock)
    ticks[0] += TIMING.worker_lost_seconds + 0.1
    postgresql = db_url.startswith("postgresql")
    assert a.fenced() == postgresql
    assert process_outbox(a) == (0 if postgresql else 1)


def test_a_failed_claim_leaves_the_dispatches_in_flight_to_finish_and_report(make_service, sqlite_url, nomad, nomad_runner, catalog, monkeypatch, caplog):
    """A pass claims more rows as its threads free up. When such a claim fails (the database drops the
    connection), the dispatches already in flight still finish, and each one's error is logged: the
    pass must not unwind past them, dropping their results unseen."""
    from dataclasses import replace as with_timing

    from experiments.background import dispatch
    from tests.experiments.test_scale_out import _roomy

    svc = make_service(sqlite_url, nomad_runner, jobs=_roomy(catalog))
    for i in range(4):
        _submit(svc.ctx, i)
    # Two threads: the first claim takes three rows (two on the threads, one waiting for a thread), the second fails.
    ctx = with_timing(svc.ctx, timing=with_timing(svc.ctx.timing, dispatch_concurrency=2))
    real_claim, real_dispatch, calls, broken = dispatch._claim, dispatch._dispatch_claimed, [], []

    def claim_once(*args, **kwargs):
        calls.append(1)
        if len(calls) > 1:
            raise ConnectionError("server closed the connection unexpectedly")
        return real_claim(*args, **kwargs)

    first = threading.Lock()

    def dispatch_or_break(ctx, claim):
        with first:
            breaks = not broken or broken == [claim.experiment_id]  # the first row claimed
            broken[:] = broken or [claim.experiment_id]
        if breaks:
            raise RuntimeError("a bug in one dispatch")
        return real_dispatch(ctx, claim)

    monkeypatch.setattr(dispatch, "_claim", claim_once)
    monkeypatch.setattr(dispatch, "_dispatch_claimed", dispatch_or_break)
    assert dispatch.process_outbox(ctx) == 2
    assert "a bug in one dispatch" in caplog.text and "server closed the connection" in caplog.text


def test_a_pass_claims_ahead_of_its_threads_in_batches(make_service, db_url, nomad, nomad_runner, catalog, monkeypatch):
    """Claiming one or two rows per freed thread spent about a third of a dispatch's CPU on claim
    transactions. A pass claims while at least half its width is free (or nothing is in flight), up to
    half its width again beyond its threads, until a claim finds nothing (a short claim may only mean
    another worker held rows for a moment); every experiment is still dispatched exactly once."""
    from experiments.background import dispatch
    from tests.experiments.test_scale_out import _roomy

    svc = make_service(db_url, nomad_runner, jobs=_roomy(catalog))
    burst = {_submit(svc.ctx, i).id for i in range(30)}
    width = svc.ctx.timing.dispatch_concurrency
    real_claim, taken = dispatch._claim, []

    def counted(*args, **kwargs):
        claims = real_claim(*args, **kwargs)
        taken.append((kwargs["limit"], len(claims)))
        return claims

    monkeypatch.setattr(dispatch, "_claim", counted)
    assert process_outbox(svc.ctx) == len(burst)
    assert taken[0] == (width + width // 2, width + width // 2)
    assert all(limit >= width // 2 for limit, _ in taken), taken
    assert len(taken) <= 2 + -(-(len(burst) - taken[0][1]) // (width // 2)), taken  # and one last claim that finds nothing
    tokens = [call.query["idempotency_token"][0] for call in nomad.calls("POST", "dispatch")]
    assert sorted(tokens) == sorted(burst)


def test_the_idle_check_does_not_count_a_live_workers_claim_as_due_but_counts_a_silent_ones(make_service, db_url, nomad, nomad_runner, monkeypatch):
    """The idle dispatch loop asks ``_anything_due`` every 0.1 s and runs a claim pass (a transaction,
    the dead-worker subquery over ``pg_locks``, a thread pool) when it answers yes. Counting a row a live
    worker holds as due made a worker idle at ten claim passes a second, each finding nothing, for as long
    as another worker had a dispatch in flight (up to the 120 s lease of a stuck call): five times the
    passes of the old 0.5 s loop. A row whose holder's heartbeat is older than the shorter bound may be
    claimable (``membership.dead_workers``), so it still counts: the check never hides a row a claim takes."""
    from experiments.background import dispatch

    svc = make_service(db_url, nomad_runner)
    _submit(svc.ctx, 1)
    a, b = _worker(svc, svc.clock), _worker(svc, svc.clock)
    assert _claim(a, None)
    real_claim, claims = dispatch._claim, []
    monkeypatch.setattr(dispatch, "_claim", lambda *args, **kwargs: claims.append(1) or real_claim(*args, **kwargs))
    assert process_outbox(b) == 0 and claims == []  # A is alive and holds the only due row
    svc.clock.advance(seconds=TIMING.worker_lost_seconds + 0.5)  # A silent past the shorter bound
    b.membership.beat(b.sessions, svc.clock())
    process_outbox(b)
    assert claims, "a row whose holder may be dead was hidden from the claim"


@pytest.mark.parametrize("commit_seconds", [0.3, 0.45])
def test_a_worker_whose_heartbeat_commits_take_a_few_hundred_ms_never_fences_itself(make_service, pg_url, nomad_runner, monkeypatch, commit_seconds):
    """With the production timing (0.5 s beats, the others' short bound 1.5 s, so the self-fence at 1 s),
    a beat that waited 0.5 s after the previous one *completed* started every 0.5 s plus its commit: two
    commits of 0.3 s in a row left the last successful beat's start more than 1 s old before the next
    one completed, so a live worker nobody could take over (its heartbeat never 1.5 s old) fenced itself
    and gave its claims back, again and again, under a busy database. Beats start every
    ``heartbeat_seconds`` from the previous start: only a single beat slower than one period fences."""
    from experiments.background.context import Timing
    from experiments.background.worker import Worker
    from experiments.background import worker as worker_module

    ticks = [1000.0]
    fake_time = types.SimpleNamespace(monotonic=lambda: ticks[0])
    monkeypatch.setattr(membership_module, "time", fake_time)
    monkeypatch.setattr(worker_module, "time", fake_time)
    timing = Timing()
    svc = make_service(pg_url, nomad_runner, timing=timing)
    ctx = _worker(svc, svc.clock, timing)
    fenced_at_commit: list[bool] = []

    def commit_waits(session: Session) -> None:
        ticks[0] += commit_seconds
        svc.clock.advance(seconds=commit_seconds)
        fenced_at_commit.append(ctx.fenced())  # the worst moment: the last successful beat is still the previous one

    class Stop:
        """``Worker._loops_done`` (what the heartbeat waits on) on the fake clock: a wait passes its time at once; the loop ends after 8 beats."""
        waits = 0

        def wait(self, seconds: float) -> bool:
            ticks[0] += max(0.0, seconds)
            svc.clock.advance(seconds=max(0.0, seconds))
            Stop.waits += 1
            return Stop.waits > 8

        def is_set(self) -> bool:
            return Stop.waits > 8

    worker = Worker(ctx)
    worker._loops_done = Stop()  # type: ignore[assignment]
    event.listen(Session, "before_commit", commit_waits)
    try:
        worker._heartbeat()
    finally:
        event.remove(Session, "before_commit", commit_waits)
    assert len(fenced_at_commit) >= 8 and not any(fenced_at_commit), fenced_at_commit


def test_a_worker_frozen_with_claims_held_ahead_of_its_threads_submits_none_of_them_after_a_takeover(make_service, db_url, nomad, nomad_runner, catalog, monkeypatch):
    """A pass holds up to one and a half widths of claims: eight on its threads and four waiting for one.
    Frozen past the TTL with all twelve not yet submitted, its claims pass to B; woken, it beats again (so
    it is not fenced) and each of its threads, running or queued, reads its claim back, finds it B's, and
    submits nothing. B dispatches every one once."""
    from experiments.background import dispatch
    from tests.experiments.test_scale_out import _roomy

    ticks = [1000.0]
    monkeypatch.setattr(membership_module, "time", types.SimpleNamespace(monotonic=lambda: ticks[0]))
    svc = make_service(db_url, nomad_runner, jobs=_roomy(catalog))
    burst = {_submit(svc.ctx, i).id for i in range(12)}
    a = _worker(svc, svc.clock)
    width = a.timing.dispatch_concurrency
    assert width + width // 2 == len(burst)
    real, wake, entered = dispatch._dispatch_claimed, threading.Event(), []

    def frozen(ctx, claim):
        entered.append(claim.experiment_id)
        assert wake.wait(30)
        return real(ctx, claim)

    monkeypatch.setattr(dispatch, "_dispatch_claimed", frozen)
    results: list[int] = []
    pass_a = threading.Thread(target=lambda: results.append(process_outbox(a)))
    pass_a.start()
    for _ in range(600):
        if len(entered) == width:
            break
        threading.Event().wait(0.05)
    with svc.ctx.sessions() as session:
        held = set(session.scalars(select(dispatch.Outbox.experiment_id).where(dispatch.Outbox.claimed_by == a.membership.worker_id)))
    assert held == burst  # eight on threads, four queued behind them

    svc.clock.advance(seconds=TIMING.worker_ttl_seconds + 1)  # A frozen past the TTL
    ticks[0] += TIMING.worker_ttl_seconds + 1
    b = _worker(svc, svc.clock)
    taken = _claim(b, None, limit=len(burst))
    assert {c.experiment_id for c in taken} == burst
    a.membership.beat(a.sessions, svc.clock())  # A wakes and beats again: not fenced any more
    assert not a.fenced()
    wake.set()
    pass_a.join(timeout=60)
    assert results == [0] and not nomad.calls("POST", "dispatch")
    for claim in taken:
        assert real(b, claim)
    tokens = [call.query["idempotency_token"][0] for call in nomad.calls("POST", "dispatch")]
    assert sorted(tokens) == sorted(burst)
