"""Tenant GPU quotas, enforced by gpufleet because Nomad Community Edition cannot.

Nomad quotas (``quota`` specs on a namespace) and node-pool restrictions per namespace are
Enterprise features: on CE, ``Job.Register`` checks only ``submit-job`` on the namespace and
that the node pool exists, so nothing in Nomad stops a tenant from filling any pool. gpufleet
therefore (1) gives tenant ACL tokens no ``submit-job``/``dispatch-job`` (only the dispatcher's
token has them, see ``constructs_lib.nomad_tenancy``) and (2) refuses, before it mints a
secret_id, every dispatch that would take a tenant over its per-pool GPU quota or onto a pool
it has no quota on.

``check_tenant_quota`` is the one pure decision both ``gpufleet jobs dispatch`` and the
control plane (issue 15) call; ``gpus_held`` turns Nomad's answers (the tenant's jobs with
their allocation summaries) into the ``in_use_gpus`` it needs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from clusters.derive.tenants import TenantSpec

# Allocation states that hold (or will hold, once placed) a GPU: Queued covers blocked
# evaluations, Unknown a disconnected client whose allocation may come back.
HOLDING_STATES = ("Queued", "Starting", "Running", "Unknown")


@dataclass(frozen=True)
class QuotaDecision:
    allowed: bool
    tenant: str
    pool: str
    quota: int
    in_use: int
    requested: int
    reason: str

    @property
    def free(self) -> int:
        return max(0, self.quota - self.in_use)


def check_tenant_quota(tenant: TenantSpec, *, pool: str, requested_gpus: int, in_use_gpus: int) -> QuotaDecision:
    """Allow a run of ``requested_gpus`` on ``pool`` only within the tenant's quota there.

    A pool missing from the tenant's ``gpu_quota`` has quota 0: a tenant only uses pools the
    cluster file grants it. ``in_use_gpus`` counts queued as well as running allocations, so
    a burst of dispatches cannot queue past the quota and land later.
    """
    quotas = dict(tenant.gpu_quota)
    quota = quotas.get(pool, 0)
    decision = QuotaDecision(allowed=True, tenant=tenant.name, pool=pool, quota=quota, in_use=in_use_gpus, requested=requested_gpus, reason="")
    if requested_gpus < 1:
        return replace(decision, allowed=False, reason=f"a run must request at least 1 GPU, not {requested_gpus}")
    if pool not in quotas or quota == 0:
        granted = ", ".join(f"{p}={q}" for p, q in sorted(quotas.items()) if q) or "none"
        return replace(decision, allowed=False, reason=(
            f"tenant {tenant.name} has no GPU quota on pool {pool} (its quotas: {granted}); pick a pool it has quota on"
            f" or add {pool} to tenants[{tenant.name}].gpu_quota in the cluster file"))
    if in_use_gpus + requested_gpus > quota:
        return replace(decision, allowed=False, reason=(
            f"tenant {tenant.name} holds {in_use_gpus} of its {quota} GPUs on pool {pool} (queued or running);"
            f" {requested_gpus} more would exceed the quota; wait for a run to finish, stop one, or raise the quota"))
    return decision


def requested_gpus(job: Mapping[str, Any]) -> dict[str, int]:
    """GPUs one allocation of each task group asks for (``*/gpu`` or ``gpu`` device requests)."""
    counts: dict[str, int] = {}
    for group in job.get("TaskGroups") or []:
        total = 0
        for task in group.get("Tasks") or []:
            for device in (task.get("Resources") or {}).get("Devices") or []:
                name = str(device.get("Name", ""))
                if name == "gpu" or name.endswith("/gpu") or "/gpu/" in name:
                    total += int(device.get("Count") or 1)
        counts[str(group.get("Name"))] = total
    return counts


def gpus_held(jobs: Iterable[tuple[Mapping[str, Any], Mapping[str, Any]]], *, pool: str) -> int:
    """GPUs the given jobs hold or wait for on ``pool``: (full job, its JobSummary) pairs.

    Parameterized parents hold nothing (they are templates); stopped jobs hold nothing once
    their allocations stop, which the summary already says.
    """
    held = 0
    for job, summary in jobs:
        if job.get("ParameterizedJob") or job.get("NodePool", "default") != pool:
            continue
        per_alloc = requested_gpus(job)
        for group, counts in ((summary or {}).get("Summary") or {}).items():
            held += per_alloc.get(group, 0) * sum(int(counts.get(state) or 0) for state in HOLDING_STATES)
    return held
