"""Why a run ended badly, in two classes: ``infrastructure`` (the fleet lost it: a node went down, a
spot VM was reclaimed, a pod was evicted or preempted, Kueue evicted its workload, a GPU fault) or
``user`` (the training command's own non-zero exit, an OOM kill of its container, its deadline).

The control plane retries only the first class (and the exit codes a job lists in ``retries``):
running the same command again after its own exit 1 would fail the same way, and spend GPU-hours
for nothing. Each scheduler's status module (``jobs.nomad.status``, ``jobs.k8s.status``) decides the
class from the fields upstream writes and says which; this module holds the shared words.
"""

from __future__ import annotations

from enum import StrEnum

from vault_policies.layout import EXIT_HARDWARE


class FailureClass(StrEnum):
    INFRASTRUCTURE = "infrastructure"
    USER = "user"


# Short causes, recorded on the run and in its events (the scheduler's own words follow in the reason).
NODE_LOST = "node-lost"
PREEMPTED = "preempted"
RESCHEDULED = "rescheduled"
HARDWARE_EXIT = "hardware-exit"
GPU_HEALTH_GATE = "gpu-health-gate"
REQUEUED = "requeued"


def disruption(reason: str) -> str:
    """A pod's ``DisruptionTarget`` condition reason as a cause (``PreemptionByScheduler`` ...)."""
    return f"disruption-{reason or 'unknown'}"


def kueue_eviction(reason: str) -> str:
    """A Kueue Workload ``Evicted``/``Preempted`` reason as a cause (``Preempted``, ``NodeFailures`` ...)."""
    return f"kueue-{reason or 'unknown'}"


# Kueue's Evicted reason once a Workload's spec.active is false (kubernetes-sigs/kueue
# apis/kueue/v1beta1/workload_types.go WorkloadDeactivated = "Deactivated"): an admin stopped it, or
# Kueue's own requeuing limit did. The fleet did not lose it; a new attempt would undo that stop.
KUEUE_DEACTIVATED = "Deactivated"


def deliberate(cause: str | None) -> bool:
    """A stop someone (or Kueue's policy) chose, which a retry must not undo."""
    return cause is not None and cause.startswith(kueue_eviction(KUEUE_DEACTIVATED))


def hardware_exit(exit_code: int | None) -> bool:
    """The wrapper's hardware/XID exit code (``vault_policies.layout.EXIT_HARDWARE``)."""
    return exit_code == EXIT_HARDWARE
