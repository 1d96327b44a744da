"""Budgets and the idle policy in cluster files: bad values are one line with file, line, field and
the allowed values; a tenant's ``idle`` overrides the cluster's; a job file cannot set either."""

from __future__ import annotations

import pytest

from clusters import repo
from clusters.derive.runpolicy import BudgetSpec, IdleSpec, derive_budgets, derive_idle_policies
from clusters.errors import ConfigError
from jobs.loader import load
from tests.clusters.conftest import assert_rejected


def tenant(data, i=0):
    return data["tenants"][i]


CASES = [
    ("budget-negative", lambda d: tenant(d).update(budget_usd_month=-5), "tenants[0].budget_usd_month", "allowed: > 0"),
    ("budget-not-a-number", lambda d: tenant(d).update(budget_usd_month="lots"), "tenants[0].budget_usd_month", "number"),
    ("budget-policy-unknown", lambda d: tenant(d).update(budget_policy="kill"), "tenants[0].budget_policy", "'stop' or 'warn'"),
    ("idle-percent-above-100", lambda d: d.update(idle={"gpu_util_below_pct": 150}), "idle.gpu_util_below_pct", "<= 100"),
    ("idle-negative-minutes", lambda d: tenant(d).update(idle={"no_logs_minutes": -1}), "tenants[0].idle.no_logs_minutes", ">= 0"),
    ("idle-unknown-field", lambda d: d.update(idle={"gpu_util_below": 5}), "idle.gpu_util_below", "did you mean 'gpu_util_below_pct'"),
]


@pytest.mark.parametrize(("mutate", "field", "fix"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_fails_when_a_budget_or_idle_policy_is_wrong(write_cluster, mutate, field, fix):
    assert_rejected(write_cluster("prod-nomad", mutate), field, fix)


def test_budgets_and_idle_policies_derive_with_the_tenant_override(example_configs):
    nomad = next(c for c in example_configs if c.name == "prod-nomad")
    assert derive_budgets(nomad) == (BudgetSpec("prod-nomad", "eval", 20000.0, "warn"), BudgetSpec("prod-nomad", "finetune", 50000.0, "stop"))
    assert derive_idle_policies(nomad) == {"eval": IdleSpec(5.0, 60, 120), "finetune": IdleSpec(5.0, 30, 60)}
    gke = next(c for c in example_configs if c.name == "prod-gke")
    assert derive_budgets(gke) == () and set(derive_idle_policies(gke).values()) == {IdleSpec(5.0, 30, 60)}  # the default, unwritten


def test_fails_when_a_job_file_tries_to_set_the_idle_policy(tmp_path, example_configs):
    """Users cannot turn the policy off: the job schema has no such field, so the loader refuses it."""
    source = tmp_path / "finetune-llama.yaml"
    source.write_text((repo.root() / "jobs" / "finetune-llama.yaml").read_text() + "idle: {low_util_minutes: 0, no_logs_minutes: 0}\n")
    with pytest.raises(ConfigError) as err:
        load(source, cluster_configs=example_configs)
    assert any(p.field == "idle" for p in err.value.problems), [str(p) for p in err.value.problems]
