"""How long the scheduler may let a run hold its GPUs: what is left of the experiment's ONE deadline.

Admission prices a run's worst case as GPUs x ``deadline_hours`` x price (experiments.services.budgets),
so the scheduler itself must stop the run by then, not only gpufleet's reaper (which cannot while the
service is down or a stop keeps failing). At each dispatch the control plane passes the seconds left
(jobs.spec.RUN_DEADLINE_META); Nomad's gpufleet-exec and the GKE Job's activeDeadlineSeconds enforce the
smaller of it and the job's max_run_hours.

The deadline counts from the first placement (``deadline_at``, experiments.services.lifecycle) and is
kept across attempts (experiments.attempts), so every retry gets only what is left, never a fresh full
one. Before any attempt was seen placed, earlier attempts' GPU time still counts (``prior_gpu_hours``:
the scheduler's own placement and end times when the reconciler missed a state), so the GPU-hours of all
attempts together stay within GPUs x ``deadline_hours``.
"""

from __future__ import annotations

import math
from datetime import datetime

from experiments.models import Experiment


def run_seconds_left(exp: Experiment, now: datetime) -> int:
    """Whole seconds the next run may hold its GPUs (<= 0: the deadline is spent, dispatch nothing).
    Rounded down: a bound, never a second more than admission priced."""
    unspent = exp.deadline_hours * 3600.0 - (exp.prior_gpu_hours or 0.0) / max(1, exp.gpus) * 3600.0
    if exp.deadline_at is not None:
        unspent = min(unspent, (exp.deadline_at - now).total_seconds())
    return math.floor(unspent)
