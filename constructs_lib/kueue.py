"""Kueue objects of a GKE cluster: a ResourceFlavor per GPU pool, one ClusterQueue, a LocalQueue per tenant.

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


def cluster_queue(name: str, pools: tuple[GpuPoolSpec, ...]) -> dict:
    """Each flavor's GPU quota is its pool's full capacity (max nodes x GPUs per node)."""
    return {
        "apiVersion": API_VERSION,
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {"matchExpressions": [{"key": TENANT_LABEL, "operator": "Exists"}]},
            "queueingStrategy": "BestEffortFIFO",
            "preemption": {"withinClusterQueue": "LowerPriority"},
            "resourceGroups": [{
                "coveredResources": [GPU_RESOURCE, *UNGOVERNED],
                "flavors": [{
                    "name": p.name,
                    "resources": [{"name": GPU_RESOURCE, "nominalQuota": p.capacity_gpus},
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
    """``depends_on`` orders creation: flavors before the queue, tenant namespaces before LocalQueues."""

    def __init__(self, scope: Construct, id_: str, *, cluster: str, pools: tuple[GpuPoolSpec, ...], tenants: tuple[TenantSpec, ...],
                 namespaces: dict[str, object]) -> None:
        super().__init__(scope, id_)
        manifest = kubernetes.manifest.Manifest
        self.flavors = {p.name: pin(manifest(self, f"flavor_{p.name}", manifest=resource_flavor(p)), f"kueue_flavor_{p.name}")
                        for p in pools}
        self.cluster_queue_name = cluster
        self.cluster_queue = pin(manifest(self, "cluster_queue", manifest=cluster_queue(cluster, pools),
                                          depends_on=list(self.flavors.values())), "kueue_cluster_queue")
        self.local_queues = {
            t.name: pin(manifest(self, f"local_queue_{t.name}", manifest=local_queue(t, cluster),
                                 depends_on=[self.cluster_queue, namespaces[t.name]]), f"kueue_local_queue_{t.name}")
            for t in tenants
        }
