"""Tenants: Kubernetes service accounts, labels, default container sizes, which pools they may use.

Pure derivations from a validated ClusterConfig; tests call them directly, constructs only read the
specs. Nothing here knows cdktf.
"""

from __future__ import annotations

from dataclasses import dataclass

from clusters.derive.pools import GpuPoolSpec
from clusters.schema import ClusterConfig

# Kubernetes service accounts every tenant namespace gets; the infra stack binds the tenant's
# GCP service account to WORKLOAD_KSA by name, so both stacks must agree on it.
WORKLOAD_KSA = "training"


CONTROLLER_KSA = "gpufleet-controller"


TENANT_LABEL = "gpufleet.dev/tenant"


# The tenant namespace's LimitRange default request for a container that states none (Kueue and
# the scheduler count it): e.g. the GPUDirect RxDM sidecar, which upstream ships without requests.
DEFAULT_CONTAINER_CPU_MILLICORES = 1000


DEFAULT_CONTAINER_MEMORY_MIB = 4096


@dataclass(frozen=True)
class TenantSpec:
    """A tenant as both schedulers see it: namespace, members, per-pool GPU quota, GCP identity."""

    name: str
    namespace: str
    groups: tuple[str, ...]
    gpu_quota: tuple[tuple[str, int], ...]
    gcp_account_id: str | None
    gcp_roles: tuple[str, ...]

    @property
    def total_gpus(self) -> int:
        return sum(q for _, q in self.gpu_quota)


def tenant_gpu_pools(tenant: TenantSpec, pools: tuple[GpuPoolSpec, ...]) -> tuple[GpuPoolSpec, ...]:
    """Pools the tenant can ever be admitted on: those it has quota on, and overcommitted pools it may borrow on."""
    quotas = dict(tenant.gpu_quota)
    return tuple(p for p in pools if quotas.get(p.name, 0) > 0 or p.overcommit)


def tenant_account_id(cluster: str, tenant: str) -> str:
    """GCP service account ids are project-wide and 6-30 characters; the cluster prefix avoids clashes."""
    return f"{cluster}-{tenant}"


def derive_tenants(config: ClusterConfig) -> tuple[TenantSpec, ...]:
    """Tenants in name order, so namespaces, bindings and queues synthesize in a stable order."""
    return tuple(
        TenantSpec(
            name=t.name,
            namespace=t.name,
            groups=tuple(sorted(t.groups)),
            gpu_quota=tuple(sorted(t.gpu_quota.items())),
            gcp_account_id=tenant_account_id(config.name, t.name) if t.service_account is not None else None,
            gcp_roles=tuple(sorted(set(t.service_account.roles))) if t.service_account is not None else (),
        )
        for t in sorted(config.tenants, key=lambda t: t.name)
    )
