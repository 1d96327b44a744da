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
from typing import Any

from sqlalchemy import DateTime, case, func, literal, or_, select, text
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


class _Sql:
    """Hours between two timestamps, and the larger/smaller of two values, on each dialect: SQLite has
    julianday() and scalar max()/min(); PostgreSQL has EXTRACT(EPOCH FROM interval) and GREATEST/LEAST."""

    def __init__(self, dialect: str) -> None:
        self.pg = dialect == "postgresql"

    def hours(self, start: Any, end: Any) -> Any:
        if self.pg:
            return func.extract("epoch", end - start) / 3600.0
        return (func.julianday(end) - func.julianday(start)) * 24.0

    def larger(self, a: Any, b: Any) -> Any:
        return func.greatest(a, b) if self.pg else func.max(a, b)

    def smaller(self, a: Any, b: Any) -> Any:
        return func.least(a, b) if self.pg else func.min(a, b)


def standing(session: Session, budget: BudgetSpec, *, now: datetime) -> Standing:
    """Spent and committed of ``budget``'s tenant this month, summed by the database in one query
    (admission runs it under the tenant's lock: its cost must not grow with the month's runs in Python)."""
    start = month_start(now)
    sql = _Sql(session.get_bind().dialect.name)
    at_now, at_start = literal(now, DateTime), literal(start, DateTime)
    placed = func.coalesce(Experiment.provisioning_at, Experiment.running_at)
    rate = Experiment.gpus * Experiment.price_per_gpu_hour
    held = sql.larger(0.0, sql.hours(sql.larger(placed, at_start), sql.smaller(func.coalesce(Experiment.finished_at, at_now), at_now)))
    live = Experiment.state.in_(_LIVE)
    left = case((or_(placed.is_(None), Experiment.deadline_at.is_(None)), Experiment.deadline_hours),
                else_=sql.larger(0.0, sql.hours(at_now, Experiment.deadline_at)))
    row = session.connection().execute(
        # Earlier attempts' GPU-hours (experiments.attempts) count as spent too: a retried run pays for every attempt.
        select(func.coalesce(func.sum(case((placed.is_not(None), held * rate), else_=0.0)
                                      + func.coalesce(Experiment.prior_gpu_hours, 0.0) * Experiment.price_per_gpu_hour), 0.0),
               func.coalesce(func.sum(case((live, left * rate), else_=0.0)), 0.0),
               func.coalesce(func.sum(case((live, 1), else_=0)), 0))
        .where(Experiment.cluster == budget.cluster, Experiment.tenant == budget.tenant, or_(live, Experiment.finished_at >= start))).one()
    return Standing(budget, f"{start:%Y-%m}", float(row[0]), float(row[1]), int(row[2]))


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

