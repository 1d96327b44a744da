"""Issue 28 review: properties of several workers that the first round of tests did not pin down
(real SQLite and PostgreSQL, the Nomad API double, the session's OpenBao)."""

from __future__ import annotations

import types

from sqlalchemy import event, select
from sqlalchemy.orm import Session

from experiments.background import membership as membership_module
from experiments.background import reconcile
from experiments.background.dispatch import _claim, process_outbox
from experiments.models import Experiment
from experiments.states import State
from tests.experiments.test_dispatch import PARENT
from tests.experiments.test_scale_out import TIMING, _submit, _worker


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
