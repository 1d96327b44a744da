"""Kueue objects of a GKE cluster: a ResourceFlavor per GPU pool, a ClusterQueue and a LocalQueue per tenant.

The per-pool tenant quotas of the cluster file are enforced here, and only here: a
ResourceQuota cannot tell GPU models apart. Each tenant's ClusterQueue holds its own quota per
flavor, and all of them share a cohort named after the cluster, so a pool marked ``overcommit``
lends idle GPUs across tenants while every other pool stays a hard per-tenant limit.

Pure builders (``resource_flavor``, ``cluster_queue``, ``local_queue``) return the manifests, so
tests check them without cdktf; ``KueueQueues`` declares them as ``kubernetes_manifest``.
Kueue itself (its CRDs and controller) must be installed on the cluster before this applies.
"""

from __future__ import annotations

from constructs import Construct

from clusters.derive import TENANT_LABEL, GpuPoolSpec, TenantSpec
from constructs_lib.naming import pin
from constructs_lib.providers import kubernetes

API_VERSION = "kueue.x-k8s.io/v1beta1"
ACCELERATOR_LABEL = "cloud.google.com/gke-accelerator"
GPU_RESOURCE = "nvidia.com/gpu"
LOCAL_QUEUE = "gpu"
# Kueue only admits workloads whose every requested resource the queue covers; GPUs are the
# governed resource, so CPU and memory get a ceiling no GPU pool of this fleet reaches.
UNGOVERNED = {"cpu": "100000", "memory": "1000000Gi"}
TAINT_EFFECTS = {"NO_SCHEDULE": "NoSchedule", "PREFER_NO_SCHEDULE": "PreferNoSchedule", "NO_EXECUTE": "NoExecute"}


def resource_flavor(spec: GpuPoolSpec) -> dict:
    """Pods admitted on this flavor land on the pool's nodes and tolerate its taints."""
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceFlavor",
        "metadata": {"name": spec.name},
        "spec": {
            "nodeLabels": {ACCELERATOR_LABEL: spec.accelerator, **{k: v for k, v in spec.labels if k.startswith("gpufleet.dev/")}},
            "tolerations": [{"key": t.key, "operator": "Equal", "value": t.value, "effect": TAINT_EFFECTS[t.effect]} for t in spec.taints],
        },
    }


def _gpu_quota(pool: GpuPoolSpec, quota: int) -> dict:
    """An overcommitted pool may borrow its cohort's idle GPUs (no borrowingLimit); any other pool may not."""
    resource: dict[str, object] = {"name": GPU_RESOURCE, "nominalQuota": quota}
    if not pool.overcommit:
        resource["borrowingLimit"] = 0
    return resource


def cluster_queue(tenant: TenantSpec, cohort: str, pools: tuple[GpuPoolSpec, ...]) -> dict:
    """The tenant's GPU quota per flavor as in the cluster file; 0 on pools it has no quota on.

    Only the tenant's own namespace may submit here. A lender reclaims borrowed GPUs by
    preempting the borrower, so a quota stays a guarantee even on an overcommitted pool.
    """
    quotas = dict(tenant.gpu_quota)
    return {
        "apiVersion": API_VERSION,
        "kind": "ClusterQueue",
        "metadata": {"name": tenant.name},
        "spec": {
            "cohort": cohort,
            "namespaceSelector": {"matchLabels": {TENANT_LABEL: tenant.name}},
            "queueingStrategy": "BestEffortFIFO",
            "preemption": {"withinClusterQueue": "LowerPriority", "reclaimWithinCohort": "Any"},
            "resourceGroups": [{
                "coveredResources": [GPU_RESOURCE, *UNGOVERNED],
                "flavors": [{
                    "name": p.name,
                    "resources": [_gpu_quota(p, quotas.get(p.name, 0)),
                                  *({"name": r, "nominalQuota": q} for r, q in UNGOVERNED.items())],
                } for p in pools],
            }],
        },
    }


def local_queue(tenant: TenantSpec, cluster_queue_name: str) -> dict:
    return {
        "apiVersion": API_VERSION,
        "kind": "LocalQueue",
        "metadata": {"name": LOCAL_QUEUE, "namespace": tenant.namespace},
        "spec": {"clusterQueue": cluster_queue_name},
    }


class KueueQueues(Construct):
    """``depends_on`` orders creation: flavors before the queues, a tenant's namespace and queue before its LocalQueue."""

    def __init__(self, scope: Construct, id_: str, *, cluster: str, pools: tuple[GpuPoolSpec, ...], tenants: tuple[TenantSpec, ...],
                 namespaces: dict[str, object]) -> None:
        super().__init__(scope, id_)
        manifest = kubernetes.manifest.Manifest
        self.flavors = {p.name: pin(manifest(self, f"flavor_{p.name}", manifest=resource_flavor(p)), f"kueue_flavor_{p.name}")
                        for p in pools}
        self.cohort = cluster
        self.cluster_queues = {
            t.name: pin(manifest(self, f"cluster_queue_{t.name}", manifest=cluster_queue(t, cluster, pools),
                                 depends_on=list(self.flavors.values())), f"kueue_cluster_queue_{t.name}")
            for t in tenants
        }
        self.local_queues = {
            t.name: pin(manifest(self, f"local_queue_{t.name}", manifest=local_queue(t, t.name),
                                 depends_on=[self.cluster_queues[t.name], namespaces[t.name]]), f"kueue_local_queue_{t.name}")
            for t in tenants
        }
