"""Kueue objects of a GKE cluster: a ResourceFlavor per GPU pool, a ClusterQueue and a LocalQueue per (tenant, pool).

Placement is exactly what a job asks for: each (tenant, pool) ClusterQueue holds one flavor,
so a job submitted to LocalQueue ``kueue_local_queue_name(pool)`` can only be admitted on that
pool's nodes (one ClusterQueue with several flavors would give an unpinned job the first flavor
that fits, e.g. an 8xH100 node for a 1-GPU sweep: review B4). The per-pool tenant quota of the
cluster file is that ClusterQueue's nominal quota; all queues share a cohort named after the
cluster, so a pool marked ``overcommit`` lends idle GPUs across tenants while every other pool
stays a hard per-tenant limit. Jobs that skip Kueue are refused by ``TenantQueuePolicy``.

DWS (queued provisioning) pools only get nodes through a ProvisioningRequest, so their queues
carry Kueue's provisioning AdmissionCheck (``ProvisioningRequestConfig`` with GKE's
``queued-provisioning.gke.io`` class), as in the toolkit's dws-queues template.

API: ``kueue.x-k8s.io/v1beta2`` (v1beta1 is deprecated since Kueue v0.16 and v1beta2 is the
storage version; served from v0.15). Checked against Kueue v0.19.2's CRDs by
``tests/constructs_lib/test_kueue_crds.py``. Kueue itself must be installed before this applies.

Topology-aware scheduling (on by default since Kueue v0.14: pkg/features/kube_features.go:683-686
at v0.19.2): a cluster whose pools include a multi-node capable pool of a block-placed family
gets one ``Topology`` (``kueue.x-k8s.io/v1beta2``, the storage version at v0.19.2:
config/components/crd/bases/kueue.x-k8s.io_topologies.yaml lines 86-150) with GKE's levels, and
those pools' flavors name it in ``topologyName``, as the toolkit's A3 Mega configuration does
(examples/gke-a3-megagpu/kueue-configuration.yaml.tftpl). Adding ``topologyName`` to an existing
flavor is an in-place update (the flavor CRD's CEL rules only freeze it once set); from then on the
flavor's nodeLabels and tolerations are immutable too (resourceflavor_types.go:49-51 at v0.19.2).
``kubernetes_manifest`` replaces only on a new apiVersion, kind, name or namespace
(preview/forcenew/kubernetes.json), so a later change of such a pool's taints or labels is an update
the API server refuses: it takes a new pool (docs/large-runs.md, "Changing a topology-aware pool").

Pure builders return the manifests so tests check them without cdktf; ``KueueQueues`` declares
them as ``kubernetes_manifest``.
"""

from __future__ import annotations

from constructs import Construct

from clusters.derive.pools import QUEUED_LABEL, GpuPoolSpec, kueue_local_queue_name, kueue_queue_key
from clusters.derive.tenants import TENANT_LABEL, TenantSpec, tenant_gpu_pools
from clusters.families import TOPOLOGY_LEVELS
from constructs_lib.naming import pin
from constructs_lib.providers import kubernetes

API_VERSION = "kueue.x-k8s.io/v1beta2"
ACCELERATOR_LABEL = "cloud.google.com/gke-accelerator"
GPU_RESOURCE = "nvidia.com/gpu"
# Kueue only admits workloads whose every requested resource the queue covers
# (flavorassigner: "resource ... unavailable in ClusterQueue"); GPUs are the governed resource, so
# CPU, memory and ephemeral storage (GKE jobs request it: jobs/k8s/render.py) get a ceiling no
# GPU pool of this fleet reaches. Written in Kubernetes' canonical quantity form ("100k", not
# "100000"): Kueue's defaulting webhook re-encodes the object, so a non-canonical value comes back
# changed and kubernetes_manifest fails the apply ("inconsistent result";
# hashicorp/terraform-provider-kubernetes#1572).
UNGOVERNED = {"cpu": "100k", "memory": "1000000Gi", "ephemeral-storage": "1000000Gi"}
TAINT_EFFECTS = {"NO_SCHEDULE": "NoSchedule", "PREFER_NO_SCHEDULE": "PreferNoSchedule", "NO_EXECUTE": "NoExecute"}
DWS_CHECK = "dws-prov"
DWS_CONFIG = "dws-config"
PROVISIONING_CONTROLLER = "kueue.x-k8s.io/provisioning-request"
QUEUED_PROVISIONING_CLASS = "queued-provisioning.gke.io"


def topology_name(cluster: str) -> str:
    """One Topology per GKE cluster, named after it (a DNS subdomain: the flavor's topologyName pattern)."""
    return f"{cluster}-gce"


def topology(cluster: str) -> dict:
    """GKE's block > sub-block > host > node hierarchy (clusters.families.TOPOLOGY_LEVELS)."""
    return {"apiVersion": API_VERSION, "kind": "Topology", "metadata": {"name": topology_name(cluster)},
            "spec": {"levels": [{"nodeLabel": label} for label in TOPOLOGY_LEVELS]}}


def resource_flavor(spec: GpuPoolSpec, cluster: str | None = None) -> dict:
    """Pods admitted on this flavor land on the pool's nodes and tolerate its taints (and GKE's DWS taint).

    A topology-aware pool's flavor names the cluster's Topology (``cluster`` is then required).
    """
    tolerations = [{"key": t.key, "operator": "Equal", "value": t.value, "effect": TAINT_EFFECTS[t.effect]} for t in spec.taints]
    if spec.queued_provisioning:
        tolerations.append({"key": QUEUED_LABEL, "operator": "Exists", "effect": "NoSchedule"})
    flavor: dict[str, object] = {
        "nodeLabels": {ACCELERATOR_LABEL: spec.accelerator, **{k: v for k, v in spec.labels if k.startswith("gpufleet.dev/")}},
        "tolerations": tolerations,
    }
    if spec.topology_aware:
        if cluster is None:
            raise ValueError(f"pool {spec.name} is topology-aware: pass the cluster whose Topology its flavor names")
        flavor["topologyName"] = topology_name(cluster)
    return {"apiVersion": API_VERSION, "kind": "ResourceFlavor", "metadata": {"name": spec.name}, "spec": flavor}


def cluster_queue_name(tenant: str, pool: str) -> str:
    """``<tenant>.<pool>``: the dot cannot occur in either name, so no two pairs share a queue."""
    return f"{tenant}.{pool}"


def cluster_queue(tenant: TenantSpec, pool: GpuPoolSpec, cohort: str) -> dict:
    """The tenant's GPU quota on one pool, as in the cluster file.

    Only the tenant's own namespace may submit here. An overcommitted pool may borrow its
    cohort's idle GPUs (no borrowingLimit); any other pool may not. A lender reclaims borrowed
    GPUs by preempting the borrower, so a quota stays a guarantee even on an overcommitted pool.
    """
    gpu: dict[str, object] = {"name": GPU_RESOURCE, "nominalQuota": dict(tenant.gpu_quota).get(pool.name, 0)}
    if not pool.overcommit:
        gpu["borrowingLimit"] = 0
    spec: dict[str, object] = {
        "cohortName": cohort,
        "namespaceSelector": {"matchLabels": {TENANT_LABEL: tenant.name}},
        "queueingStrategy": "BestEffortFIFO",
        "preemption": {"withinClusterQueue": "LowerPriority", "reclaimWithinCohort": "Any"},
        "resourceGroups": [{
            "coveredResources": [GPU_RESOURCE, *UNGOVERNED],
            "flavors": [{"name": pool.name, "resources": [gpu, *({"name": r, "nominalQuota": q} for r, q in UNGOVERNED.items())]}],
        }],
    }
    if pool.queued_provisioning:
        spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": DWS_CHECK, "onFlavors": [pool.name]}]}
    return {"apiVersion": API_VERSION, "kind": "ClusterQueue", "metadata": {"name": cluster_queue_name(tenant.name, pool.name)}, "spec": spec}


def local_queue(tenant: TenantSpec, pool: GpuPoolSpec) -> dict:
    return {
        "apiVersion": API_VERSION,
        "kind": "LocalQueue",
        "metadata": {"name": kueue_local_queue_name(pool.name), "namespace": tenant.namespace},
        "spec": {"clusterQueue": cluster_queue_name(tenant.name, pool.name)},
    }


def dws_objects() -> tuple[dict, dict]:
    """The AdmissionCheck that makes Kueue create a ProvisioningRequest per workload, and its parameters."""
    check = {
        "apiVersion": API_VERSION, "kind": "AdmissionCheck", "metadata": {"name": DWS_CHECK},
        "spec": {"controllerName": PROVISIONING_CONTROLLER,
                 "parameters": {"apiGroup": "kueue.x-k8s.io", "kind": "ProvisioningRequestConfig", "name": DWS_CONFIG}},
    }
    config = {
        "apiVersion": API_VERSION, "kind": "ProvisioningRequestConfig", "metadata": {"name": DWS_CONFIG},
        "spec": {"provisioningClassName": QUEUED_PROVISIONING_CLASS, "managedResources": [GPU_RESOURCE]},
    }
    return check, config


class KueueQueues(Construct):
    """``depends_on`` orders creation: flavors (and the DWS check) before the queues, a tenant's namespace and queue before its LocalQueue."""

    def __init__(self, scope: Construct, id_: str, *, cluster: str, pools: tuple[GpuPoolSpec, ...], tenants: tuple[TenantSpec, ...],
                 namespaces: dict[str, object]) -> None:
        super().__init__(scope, id_)
        manifest = kubernetes.manifest.Manifest
        self.topology = None
        if any(p.topology_aware for p in pools):
            self.topology = pin(manifest(self, "topology", manifest=topology(cluster)), "kueue_topology")
        self.flavors = {p.name: pin(manifest(self, f"flavor_{p.name}", manifest=resource_flavor(p, cluster),
                                             depends_on=[self.topology] if p.topology_aware else None), f"kueue_flavor_{p.name}")
                        for p in pools}
        self.cohort = cluster
        prerequisites: list[object] = list(self.flavors.values())
        self.dws: tuple[object, ...] = ()
        if any(p.queued_provisioning for p in pools):
            check, config = dws_objects()
            dws_config = pin(manifest(self, "dws_config", manifest=config), "kueue_provisioning_config_dws")
            dws_check = pin(manifest(self, "dws_check", manifest=check, depends_on=[dws_config]), "kueue_admission_check_dws")
            self.dws = (dws_config, dws_check)
            prerequisites.append(dws_check)
        self.cluster_queues: dict[tuple[str, str], object] = {}
        self.local_queues: dict[tuple[str, str], object] = {}
        for t in tenants:
            for p in tenant_gpu_pools(t, pools):
                key = kueue_queue_key(t.name, p.name)
                cq = pin(manifest(self, f"cluster_queue_{key}", manifest=cluster_queue(t, p, cluster), depends_on=prerequisites),
                         f"kueue_cluster_queue_{key}")
                self.cluster_queues[(t.name, p.name)] = cq
                self.local_queues[(t.name, p.name)] = pin(
                    manifest(self, f"local_queue_{key}", manifest=local_queue(t, p), depends_on=[cq, namespaces[t.name]]),
                    f"kueue_local_queue_{key}")
