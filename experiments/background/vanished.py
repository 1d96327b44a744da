"""Many runs of one cluster unknown to its scheduler at once: not believed in one pass.

A run its scheduler no longer knows is failed as gone (garbage-collected before gpufleet saw it
end) and its quota freed. That is rare for one run and implausible for most of a cluster's runs
in the same pass: far likelier, the scheduler that answered is not the cluster's (an address or
context pointing elsewhere that still passed the identity check, ``experiments.binding``). So
when at least ``MIN_VANISHED`` of the runs of one cluster polled in a pass, and more than half
of them, are gone at once, the cluster counts as unobserved for that pass: none of its answers
are applied, nothing is failed, quota stays held, and those runs' reason says why. Every pass
decides anew; an operator who knows the runs are really lost stops them by hand.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy.engine import Row

from experiments.background.context import Context, log
from experiments.row_locks import update_unlocked
from experiments.models import Experiment
from experiments.states import ON_SCHEDULER
from jobs.runner import Polled

MIN_VANISHED = 3


def hold_mass_vanishing(ctx: Context, tracked: Sequence[Row[Any]], results: Mapping[str, Polled]) -> dict[str, Polled]:
    """``results`` without the answers of clusters most of whose polled runs vanished at once."""
    answered: dict[str, list[Row[Any]]] = defaultdict(list)
    for row in tracked:
        if row.run_id in results:
            answered[row.cluster].append(row)
    held: dict[str, list[str]] = {}
    for cluster, rows in answered.items():
        gone = [row.id for row in rows if results[row.run_id].gone]
        if len(gone) >= MIN_VANISHED and 2 * len(gone) > len(rows):
            held[cluster] = gone
            reason = (f"unobserved: {len(gone)} of the {len(rows)} runs of {cluster} polled in one pass are unknown to the scheduler that "
                      f"answered, more likely another scheduler than all of them lost; none is failed as gone: check which scheduler this "
                      f"service reaches as {cluster}")
            log.error("cluster %s: %s", cluster, reason)
            with ctx.sessions() as session, session.begin():
                update_unlocked(session, Experiment.id.in_(gone) & Experiment.state.in_([s.value for s in ON_SCHEDULER]), reason=reason)
    if not held:
        return dict(results)
    skip = {row.run_id for cluster in held for row in answered[cluster]}
    return {run_id: polled for run_id, polled in results.items() if run_id not in skip}
