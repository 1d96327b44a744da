"""Attempts of one experiment (issue 25): when a failed run is tried again, and how the next
attempt begins.

A failure is retried when the job's ``retries`` allow it: an infrastructure failure
(``jobs.failures``), or an exit code the job lists in ``retries.on_exit_codes``, while fewer than
``retries.max_attempts`` retries were made. The next attempt waits a bounded exponential backoff
(``Timing.retry_backoff_seconds`` doubled per attempt, at most ``retry_backoff_max_seconds``),
counted on the service's clock, so a zone that lost its nodes is not hammered.

``begin_next`` runs in the reconciler's transaction: it keeps the ended attempt as a
``RunAttempt`` row (run id, class, cause, GPU time), moves the experiment to ``retrying`` with
the next attempt number and the attempt's timestamps cleared (not its deadline: experiments.deadline), and writes its outbox row with
``next_attempt_at`` after the backoff. The dispatcher then takes it like any outbox row: it
first stops whatever is left of the previous attempt on the scheduler (a multi-node run restarts
as a whole gang, never a partial one), then submits with the attempt's own idempotency key
(``attempt_key``), which mints new single-use secret_ids for every rank and makes a new scheduler
job (Nomad: a new dispatched child; GKE: a new Job, named from the key), so the old attempt's
remnants are never taken for the new one. A crash anywhere in between repeats the stop (a no-op
on a stopped run) and the submit (the same key: the scheduler answers with the run it has).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from experiments.models import Experiment, Outbox, RunAttempt
from experiments.services import cost
from experiments.services.lifecycle import transition
from experiments.states import State
from jobs import failures
from jobs.failures import FailureClass
from jobs.schema import Retries


@dataclass(frozen=True)
class Verdict:
    """Whether a failed attempt is tried again, and why (the words go into the reason)."""

    retry: bool
    why: str
    backoff_seconds: float = 0.0


def attempt_key(experiment_id: str, attempt: int) -> str:
    """The scheduler idempotency key of an attempt: the experiment id for the first (what every run
    dispatched before retries used), ``<id>.attempt-<n>`` after, so each attempt is its own run."""
    return experiment_id if attempt <= 1 else f"{experiment_id}.attempt-{attempt}"


def experiment_of(key: str) -> str:
    """The experiment id an ``attempt_key`` belongs to (the local runner's checkpoint directory)."""
    return key.split(".attempt-", 1)[0]


def backoff_seconds(attempt: int, *, base: float, cap: float) -> float:
    """Wait before attempt ``attempt + 1``: base, 2 x base, 4 x base ... at most ``cap``."""
    return min(cap, base * 2 ** max(0, attempt - 1))


def decide(retries: Retries | None, *, attempt: int, failure_class: FailureClass, exit_code: int | None,
           base: float, cap: float, cause: str | None = None) -> Verdict:
    """Pure: does the failure of attempt ``attempt`` get another attempt? ``retries`` None: the job's
    admitted spec can no longer be read (its cluster or Vault role went away), so no retry."""
    if retries is None:
        return Verdict(False, "not retried: the job as admitted no longer passes the checks")
    if failures.deliberate(cause):
        return Verdict(False, "not retried: its Kueue Workload was deactivated (spec.active: false) on purpose")
    listed = exit_code is not None and exit_code in retries.on_exit_codes
    if failure_class != FailureClass.INFRASTRUCTURE and not listed:
        return Verdict(False, "not retried: the training command's own failure (list its exit code in retries.on_exit_codes to retry it)")
    if retries.max_attempts == 0:
        return Verdict(False, "not retried: the job sets retries.max_attempts: 0")
    if attempt > retries.max_attempts:
        return Verdict(False, f"not retried: all {retries.max_attempts} retries (retries.max_attempts) are spent")
    wait = backoff_seconds(attempt, base=base, cap=cap)
    return Verdict(True, f"attempt {attempt + 1} of at most {retries.max_attempts + 1} in {wait:g}s", wait)


def begin_next(session: Session, exp: Experiment, *, actor: str, now: datetime, reason: str, failure_class: str, cause: str | None,
               exit_code: int | None, backoff: float, placed_at: datetime | None = None, ended_at: datetime | None = None) -> None:
    """End the current attempt and queue the next one, inside the caller's transaction (see the module doc)."""
    placed = exp.provisioning_at or exp.running_at or placed_at
    finished = min(max(ended_at or now, placed or now), now)
    hours = cost.gpu_hours(gpus=exp.gpus, placed_at=placed, finished_at=finished, now=now)
    session.add(RunAttempt(experiment_id=exp.id, attempt=exp.attempt, run_id=exp.run_id, state=State.FAILED.value, failure_class=failure_class,
                           cause=cause, reason=reason, exit_code=exit_code, dispatched_at=exp.dispatching_at, placed_at=placed,
                           finished_at=finished, gpu_hours=hours))
    exp.failure_class = failure_class
    exp.exit_code = exit_code
    transition(session, exp, State.RETRYING, actor=actor, now=now, reason=reason)
    exp.prior_gpu_hours = (exp.prior_gpu_hours or 0.0) + hours
    exp.attempt += 1
    # deadline_at stays: one deadline for the whole experiment, so the next attempt gets what is left of it
    # (experiments.deadline), never a fresh full one, and all attempts together stay within what admission priced.
    exp.dispatching_at = exp.queued_at = exp.provisioning_at = exp.running_at = exp.finished_at = None
    # A cancel already requested (it came while this failure was being read): due at once, so the
    # dispatcher ends it cancelled now instead of after the backoff.
    due = now if exp.cancel_requested_at is not None else now + timedelta(seconds=backoff)
    # created_at = due: the dispatcher's stuck bound (dispatch_stuck_seconds) counts from when the attempt
    # may be dispatched, so a long backoff never shortens it.
    outbox = session.get(Outbox, exp.id)
    if outbox is None:
        session.add(Outbox(experiment_id=exp.id, created_at=due, attempts=0, next_attempt_at=due))
    else:  # never expected (a dispatched run's row is gone), but one row per experiment is the rule
        outbox.created_at, outbox.attempts, outbox.next_attempt_at, outbox.lease_until, outbox.last_error = due, 0, due, None, None
