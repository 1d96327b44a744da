"""One tenant on a GKE cluster: namespace, RBAC, service accounts, GPU ResourceQuota and LimitRange."""

from __future__ import annotations

from constructs import Construct

from clusters.derive.pools import GpuPoolSpec
from clusters.derive.tenants import CONTROLLER_KSA, TENANT_LABEL, WORKLOAD_KSA, TenantSpec, tenant_gpu_pools
from clusters.families import GpuDirect
from constructs_lib.naming import pin
from constructs_lib.providers import kubernetes

GPU_RESOURCE = "nvidia.com/gpu"
RBAC_GROUP = "rbac.authorization.k8s.io"
# Pods that forget requests still get a sane share of a GPU node, not best-effort eviction bait.
DEFAULT_REQUESTS = {"cpu": "1", "memory": "4Gi"}
WI_ANNOTATION = "iam.gke.io/gcp-service-account"
PSA = "pod-security.kubernetes.io/"


def pod_security(tenant: TenantSpec, pools: tuple[GpuPoolSpec, ...]) -> dict[str, str]:
    """``baseline`` everywhere, except where the tenant can run on a GPUDirect pool.

    The TCPX/TCPXO receive-datapath sidecar mounts ``/sys``, ``/proc/sys`` and the driver
    directory as hostPath and adds ``NET_ADMIN`` (toolkit
    gpu-direct-workload/scripts/enable-tcpx{,o}-in-workload.py); baseline forbids both, so such a
    namespace is enforced at ``privileged`` and still warned and audited at ``baseline``. Other
    namespaces keep enforcing baseline. What ``privileged`` would allow beyond that sidecar is
    refused by the scheduler stack's admission policy (``k8s_queue_policy.privilege_rule``).
    """
    gpudirect = any(p.gpudirect != GpuDirect.NONE for p in tenant_gpu_pools(tenant, pools))
    if gpudirect:
        return {f"{PSA}enforce": "privileged", f"{PSA}warn": "baseline", f"{PSA}audit": "baseline"}
    return {f"{PSA}enforce": "baseline"}


def rbac_subject(member: str) -> tuple[str, str]:
    """IAM member -> (RBAC kind, name). GKE authenticates Google groups and accounts by email."""
    kind, _, email = member.partition(":")
    return ("Group" if kind == "group" else "User", email)


def tenant_key(name: str) -> str:
    return name.replace("-", "_")


class K8sTenant(Construct):
    """Tenant groups get the built-in ``edit`` role in their namespace only, never cluster-wide.

    The GPU quota is the sum of the tenant's per-pool quotas: a ResourceQuota cannot tell GPU
    models apart, the tenant's Kueue ClusterQueue enforces each per-pool quota. No container may ask for more
    GPUs than the largest node holds, since such a pod could never schedule.
    """

    def __init__(self, scope: Construct, id_: str, *, tenant: TenantSpec, pools: tuple[GpuPoolSpec, ...],
                 controller_role: str, gcp_service_account: str | None) -> None:
        super().__init__(scope, id_)
        key = tenant_key(tenant.name)
        self.namespace = pin(kubernetes.namespace_v1.NamespaceV1(self, "ns", metadata={
            "name": tenant.namespace,
            "labels": {TENANT_LABEL: tenant.name, "app.kubernetes.io/managed-by": "gpufleet", **pod_security(tenant, pools)},
        }), f"ns_{key}")
        ns = self.namespace.metadata.name
        rb = kubernetes.role_binding_v1
        self.edit_binding = None
        if tenant.groups:
            self.edit_binding = pin(rb.RoleBindingV1(
                self, "edit", metadata={"name": f"{tenant.name}-edit", "namespace": ns},
                role_ref={"api_group": RBAC_GROUP, "kind": "ClusterRole", "name": "edit"},
                subject=[rb.RoleBindingV1Subject(kind=kind, name=name, api_group=RBAC_GROUP)
                         for kind, name in (rbac_subject(m) for m in tenant.groups)],
            ), f"rb_{key}_edit")
        sa = kubernetes.service_account_v1
        # Review C6: no pod gets this Job-writing token by naming the account. gpufleet's control
        # plane reaches the API with its own kubeconfig; run in-cluster, its pod opts in with
        # automountServiceAccountToken: true (the pod-level setting wins over this one).
        self.controller = pin(sa.ServiceAccountV1(self, "controller", metadata={"name": CONTROLLER_KSA, "namespace": ns},
                                                  automount_service_account_token=False), f"ksa_{key}_controller")
        self.controller_binding = pin(rb.RoleBindingV1(
            self, "controller_binding", metadata={"name": CONTROLLER_KSA, "namespace": ns},
            role_ref={"api_group": RBAC_GROUP, "kind": "ClusterRole", "name": controller_role},
            subject=[rb.RoleBindingV1Subject(kind="ServiceAccount", name=CONTROLLER_KSA, namespace=tenant.namespace)],
        ), f"rb_{key}_controller")
        annotations = {WI_ANNOTATION: gcp_service_account} if gcp_service_account else {}
        self.workload = pin(sa.ServiceAccountV1(self, "training", metadata={"name": WORKLOAD_KSA, "namespace": ns, "annotations": annotations},
                                                automount_service_account_token=False), f"ksa_{key}_training")
        self.quota = pin(kubernetes.resource_quota_v1.ResourceQuotaV1(
            self, "quota", metadata={"name": "gpu-quota", "namespace": ns},
            spec={"hard": {f"requests.{GPU_RESOURCE}": str(tenant.total_gpus)}},
        ), f"quota_{key}")
        np = kubernetes.network_policy_v1
        # Default deny for ingress from outside the namespace (Dataplane V2 enforces it); pods of
        # one tenant still reach each other, which multi-node training needs.
        self.network_policy = pin(np.NetworkPolicyV1(
            self, "netpol", metadata={"name": "gpufleet-deny-other-namespaces", "namespace": ns},
            spec=np.NetworkPolicyV1Spec(pod_selector=np.NetworkPolicyV1SpecPodSelector(), policy_types=["Ingress"],
                                        ingress=[np.NetworkPolicyV1SpecIngress(from_=[np.NetworkPolicyV1SpecIngressFrom(
                                            pod_selector=np.NetworkPolicyV1SpecIngressFromPodSelector())])]),
        ), f"netpol_{key}")
        lr = kubernetes.limit_range_v1
        self.limits = pin(lr.LimitRangeV1(
            self, "limits", metadata={"name": "defaults", "namespace": ns},
            spec={"limit": [lr.LimitRangeV1SpecLimit(type="Container", default_request=dict(DEFAULT_REQUESTS))]},
        ), f"limits_{key}")
