"""The experiment state machine: one enum, one table of allowed moves.

pending (accepted, in the outbox) -> dispatching (claimed by a dispatcher) -> queued (the
scheduler has it, no GPU yet) -> provisioning (placed, starting) -> running -> succeeded /
failed; cancelled and expired can end any non-terminal state. The scheduler may skip states
between two reconcile passes (a short run goes queued -> succeeded), so forward jumps are allowed.
``idle`` ends a running run the admin's idle/hang policy stopped (experiments.background.idle).

retrying (issue 25): an attempt on the scheduler ended with a failure the job's ``retries`` allow
again (jobs.failures: infrastructure, or a listed exit code); the experiment waits out its backoff
in the outbox and goes back to dispatching as its next attempt. It stays non-terminal all along,
so the tenant's quota holds its GPUs once, across attempts, and nobody else takes them meanwhile.
"""

from __future__ import annotations

from enum import StrEnum


class State(StrEnum):
    PENDING = "pending"
    DISPATCHING = "dispatching"
    QUEUED = "queued"
    PROVISIONING = "provisioning"
    RUNNING = "running"
    RETRYING = "retrying"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    IDLE = "idle"


TERMINAL = frozenset({State.SUCCEEDED, State.FAILED, State.CANCELLED, State.EXPIRED, State.IDLE})
NON_TERMINAL = frozenset(State) - TERMINAL
# States in which the scheduler holds a run the reconciler must follow.
ON_SCHEDULER = frozenset({State.QUEUED, State.PROVISIONING, State.RUNNING})
_ENDS = frozenset({State.FAILED, State.CANCELLED, State.EXPIRED})

ALLOWED: dict[State, frozenset[State]] = {
    State.PENDING: frozenset({State.DISPATCHING}) | _ENDS,
    State.DISPATCHING: frozenset({State.QUEUED, State.PROVISIONING, State.RUNNING, State.SUCCEEDED}) | _ENDS,
    State.QUEUED: frozenset({State.PROVISIONING, State.RUNNING, State.SUCCEEDED, State.RETRYING}) | _ENDS,
    State.PROVISIONING: frozenset({State.RUNNING, State.SUCCEEDED, State.RETRYING}) | _ENDS,
    State.RUNNING: frozenset({State.SUCCEEDED, State.IDLE, State.RETRYING}) | _ENDS,
    State.RETRYING: frozenset({State.DISPATCHING}) | _ENDS,
    **{state: frozenset() for state in TERMINAL},
}


def can_move(current: State, target: State) -> bool:
    return target in ALLOWED[current]
