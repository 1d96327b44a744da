"""What the control plane enforces on a tenant's runs beyond GPU quota: its monthly money budget
and the idle/hung policy (cluster default, tenant override). Pure derivations from a validated
ClusterConfig, read by ``experiments`` (admission, reaper, idle step); nothing here knows cdktf,
and no synthesized resource depends on them."""

from __future__ import annotations

from dataclasses import dataclass

from clusters.schema import ClusterConfig, IdlePolicy


@dataclass(frozen=True)
class BudgetSpec:
    """A tenant's budget on one cluster: USD per calendar month (UTC) and what happens when spend crosses it."""

    cluster: str
    tenant: str
    usd_month: float
    policy: str  # "stop" | "warn"


@dataclass(frozen=True)
class IdleSpec:
    """When a run counts as idle: every GPU below ``util_below_pct`` for ``low_util_minutes``, or no
    new log output for ``no_logs_minutes``; 0 minutes turns a signal off."""

    util_below_pct: float
    low_util_minutes: int
    no_logs_minutes: int

    @property
    def enabled(self) -> bool:
        return self.low_util_minutes > 0 or self.no_logs_minutes > 0


def _idle(policy: IdlePolicy) -> IdleSpec:
    return IdleSpec(policy.gpu_util_below_pct, policy.low_util_minutes, policy.no_logs_minutes)


def derive_budgets(config: ClusterConfig) -> tuple[BudgetSpec, ...]:
    """The tenants of ``config`` that have a budget, in name order."""
    return tuple(BudgetSpec(config.name, t.name, float(t.budget_usd_month), t.budget_policy)
                 for t in sorted(config.tenants, key=lambda t: t.name) if t.budget_usd_month is not None)


def derive_idle_policies(config: ClusterConfig) -> dict[str, IdleSpec]:
    """Per tenant of ``config``: its own ``idle`` block where the admin set one, else the cluster's."""
    default = _idle(config.idle)
    return {t.name: _idle(t.idle) if t.idle is not None else default for t in sorted(config.tenants, key=lambda t: t.name)}
