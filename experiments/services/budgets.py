"""Money budgets: a tenant's USD per calendar month (UTC) on a cluster, enforced like its GPU quota.

What counts against a budget this month:
- **spent**: every run's GPU-hours inside the month so far (from placement to its end, or now)
  x GPUs x the price it was admitted at (``experiments.services.cost``);
- **committed**: what the live runs may still spend at worst: a run not yet placed its whole
  deadline, a placed one until its deadline (GPUs x hours left x price).

Admission refuses a run whose own worst case (GPUs x deadline x price per GPU-hour of its pool's
kind in its cluster's region) does not fit in budget - spent - committed. That check runs inside
the submit transaction, after ``lock``: SQLite's BEGIN IMMEDIATE already serializes writers; on
PostgreSQL a transaction-scoped advisory lock per (cluster, tenant) is taken *before* the quota's
per-pool lock, in that order everywhere, so racing submissions of one tenant on different pools
cannot both spend the last dollars and no two locks are ever taken in the opposite order.

A run that lives across a month boundary counts its committed hours in the month it is admitted
(conservative: it can only refuse earlier, never overspend).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import or_, select, text
from sqlalchemy.orm import Session

from clusters.derive.runpolicy import BudgetSpec, derive_budgets
from clusters.schema import ClusterConfig
from experiments.errors import ApiError
from experiments.models import Experiment
from experiments.states import NON_TERMINAL

_LIVE = [s.value for s in NON_TERMINAL]


def budgets_of(configs: tuple[ClusterConfig, ...]) -> dict[tuple[str, str], BudgetSpec]:
    """Every budget of the fleet by (cluster, tenant)."""
    return {(b.cluster, b.tenant): b for config in configs for b in derive_budgets(config)}


def month_start(now: datetime) -> datetime:
    return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


@dataclass(frozen=True)
class Standing:
    """Where a tenant stands against its budget at ``now``: USD, rounded to cents where shown."""

    budget: BudgetSpec
    month: str  # YYYY-MM
    spent: float
    committed: float
    live_runs: int

    @property
    def left(self) -> float:
        return self.budget.usd_month - self.spent - self.committed

    @property
    def crossed(self) -> bool:
        return self.spent >= self.budget.usd_month

    def view(self) -> dict[str, object]:
        return {"cluster": self.budget.cluster, "tenant": self.budget.tenant, "month": self.month, "budget_usd_month": self.budget.usd_month,
                "policy": self.budget.policy, "spent_usd": round(self.spent, 2), "committed_usd": round(self.committed, 2),
                "left_usd": round(self.left, 2), "live_runs": self.live_runs}


def lock(session: Session, cluster: str, tenant: str) -> None:
    """Serialize budget decisions of one (cluster, tenant) on PostgreSQL (SQLite: BEGIN IMMEDIATE does)."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": zlib.crc32(f"budget:{cluster}/{tenant}".encode())})


def _hours(start: datetime | None, end: datetime) -> float:
    return max(0.0, (end - start).total_seconds()) / 3600 if start is not None else 0.0


def standing(session: Session, budget: BudgetSpec, *, now: datetime) -> Standing:
    """Spent and committed of ``budget``'s tenant this month, from the runs' own rows (one query)."""
    start = month_start(now)
    rows = session.connection().execute(  # Core rows: a tenant may have thousands of runs this month
        select(Experiment.state, Experiment.gpus, Experiment.price_per_gpu_hour, Experiment.deadline_hours, Experiment.deadline_at,
               Experiment.provisioning_at, Experiment.running_at, Experiment.finished_at)
        .where(Experiment.cluster == budget.cluster, Experiment.tenant == budget.tenant,
               or_(Experiment.state.in_(_LIVE), Experiment.finished_at >= start))).all()
    spent = committed = 0.0
    live = 0
    for row in rows:
        placed = row.provisioning_at or row.running_at
        if placed is not None:
            spent += _hours(max(placed, start), min(row.finished_at or now, now)) * row.gpus * row.price_per_gpu_hour
        if row.state in _LIVE:
            live += 1
            left = row.deadline_hours if placed is None or row.deadline_at is None else _hours(now, row.deadline_at)
            committed += left * row.gpus * row.price_per_gpu_hour
    return Standing(budget, f"{start:%Y-%m}", spent, committed, live)


def worst_case(*, gpus: int, deadline_hours: float, price_per_gpu_hour: float) -> float:
    return gpus * deadline_hours * price_per_gpu_hour


def check_or_409(session: Session, budget: BudgetSpec | None, *, gpus: int, deadline_hours: float, price_per_gpu_hour: float,
                 now: datetime) -> None:
    """Refuse (409, with the numbers and the fix) a run whose worst case does not fit in what is left.
    Call inside the submit transaction, after ``lock``."""
    if budget is None:
        return
    now_standing = standing(session, budget, now=now)
    worst = worst_case(gpus=gpus, deadline_hours=deadline_hours, price_per_gpu_hour=price_per_gpu_hour)
    if worst <= now_standing.left + 1e-9:
        return
    left = max(0.0, now_standing.left)
    fits_hours = left / (gpus * price_per_gpu_hour) if gpus and price_per_gpu_hour else 0.0
    shorter = f"submit with deadline_hours at most {fits_hours:.2f} (fits what is left), " if fits_hours >= 0.01 else ""
    raise ApiError(409, (f"over the monthly budget: tenant {budget.tenant} on cluster {budget.cluster} has ${budget.usd_month:,.2f} for {now_standing.month};"
                         f" spent ${now_standing.spent:,.2f}, committed ${now_standing.committed:,.2f} by {now_standing.live_runs} live runs (their worst case),"
                         f" left ${left:,.2f}; this run's worst case is {gpus} GPU x {deadline_hours:g} h x ${price_per_gpu_hour:g}/GPU-hour = ${worst:,.2f}"),
                   field="job", fix=(f"{shorter}wait for live runs to finish or cancel one, or ask the platform team to raise"
                                     f" tenants[{budget.tenant}].budget_usd_month in the cluster file of {budget.cluster}"))

