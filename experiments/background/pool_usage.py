"""check_pool_usage: the quota counters against the sum over live runs, every few minutes.

Every path that ends a run goes through ``lifecycle.transition``, which gives the GPUs back in
the same transaction (``services.pool_usage``), so the counters should never drift. This pass
is the check that they did not (a row edited by hand, a restore from a backup taken between
two writes): it reads the counters and the sums without a lock, and corrects each key that
differs under that key's lock, logging it and counting ``gpufleet_pool_usage_repairs``.
"""

from __future__ import annotations

from experiments.background.context import Context, log
from experiments.services import pool_usage


def check_pool_usage(ctx: Context) -> int:
    """Returns how many keys were corrected (0 when not due this pass)."""
    now = ctx.clock()
    if ctx.usage_checked and (now - ctx.usage_checked[0]).total_seconds() < ctx.timing.pool_usage_check_seconds:
        return 0
    ctx.usage_checked[:] = [now]
    with ctx.sessions() as session:
        drifted = pool_usage.drift(session)
    repaired = 0
    for key in sorted(drifted):
        with ctx.sessions() as session, session.begin():
            fixed = pool_usage.repair(session, key, now=now)
        if fixed is not None:
            repaired += 1
            ctx.metrics.pool_usage_repairs.inc()
            log.warning("pool_usage %s/%s/%s held %d GPUs, its live runs hold %d: corrected", *key, *fixed)
    return repaired
