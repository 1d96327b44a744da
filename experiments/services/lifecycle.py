"""The one place an experiment changes state: ``transition`` checks the move against
``states.ALLOWED``, stamps the state's timestamp, writes the event row and moves the run's GPUs
in or out of its tenant's ``pool_usage`` counter, all in the caller's transaction, so the state,
its audit record and the quota count commit (or vanish) together."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from experiments.models import Event, Experiment
from experiments.services import pool_usage
from experiments.states import TERMINAL, State, can_move

_STAMP = {
    State.DISPATCHING: "dispatching_at",
    State.QUEUED: "queued_at",
    State.PROVISIONING: "provisioning_at",
    State.RUNNING: "running_at",
}


class IllegalTransition(Exception):
    pass


def record(session: Session, *, experiment_id: str | None, actor: str, kind: str, message: str, now: datetime,
           from_state: str | None = None, to_state: str | None = None, attempt: int | None = None) -> None:
    """One event row; it carries the experiment's current attempt (issue 25) unless the caller names one."""
    if attempt is None and experiment_id is not None:
        exp = session.get(Experiment, experiment_id)
        attempt = exp.attempt if exp is not None else None
    session.add(Event(experiment_id=experiment_id, at=now, actor=actor, kind=kind, from_state=from_state, to_state=to_state, message=message,
                      attempt=attempt))


def transition(session: Session, exp: Experiment, target: State, *, actor: str, now: datetime, reason: str | None = None) -> None:
    current = State(exp.state)
    if not can_move(current, target):
        raise IllegalTransition(f"{exp.id}: {current} -> {target}")
    pool_usage.note_transition(session, exp, current, target)
    exp.state = target.value
    exp.updated_at = now
    if reason is not None:
        exp.reason = reason
    column = _STAMP.get(target)
    if column and getattr(exp, column) is None:
        setattr(exp, column, now)
    if target in (State.PROVISIONING, State.RUNNING) and exp.deadline_at is None:
        # The deadline counts from the moment the run holds GPUs; queueing is bounded separately.
        exp.deadline_at = now + timedelta(hours=exp.deadline_hours)
    if target in TERMINAL:
        exp.finished_at = now
    record(session, experiment_id=exp.id, actor=actor, kind="state", message=reason or "", now=now, from_state=current.value, to_state=target.value,
           attempt=exp.attempt or 1)
