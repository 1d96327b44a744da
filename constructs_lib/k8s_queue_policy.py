"""Admission policies that make every GPU workload in a tenant namespace go through Kueue.

Tenants hold ``edit`` in their namespace and Kueue ignores Jobs without a queue-name label
(unless its install-time ``manageJobsWithoutQueueName`` says otherwise), so without these a
tenant could run GPU pods on any pool, capped only by the namespace-wide ResourceQuota, and the
file's per-pool quota would not hold (review B9). Two ValidatingAdmissionPolicies
(``admissionregistration.k8s.io/v1``, GA since Kubernetes 1.30), bound to every namespace
labelled ``gpufleet.dev/tenant``:

- a ``batch/v1`` Job whose pod template asks for ``nvidia.com/gpu`` must name a LocalQueue
  (``kueue.x-k8s.io/queue-name``): tenants cannot create LocalQueues (``edit`` only aggregates
  Kueue's viewer role), so every such queue is one of gpufleet's per-pool queues;
- a Pod that asks for ``nvidia.com/gpu`` must be controlled by a Job (``ownerReferences`` with
  ``controller: true``): bare GPU pods, Deployments and other controllers never reach a GPU.

Residual risk, stated: a tenant can hand-write a Pod whose controller reference names one of its
own Jobs; that pod still counts against the namespace ResourceQuota (the sum of the tenant's
per-pool quotas), it only escapes the per-pool split. Other job frameworks (JobSet, RayJob,
...) are refused for GPU workloads until they are added here.

Pure builders return the manifests (the CEL is tested by evaluating it); ``TenantQueuePolicy``
declares them as ``kubernetes_manifest``.
"""

from __future__ import annotations

from constructs import Construct

from clusters.derive import TENANT_LABEL
from constructs_lib.naming import pin
from constructs_lib.providers import kubernetes

API_VERSION = "admissionregistration.k8s.io/v1"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOB_POLICY = "gpufleet-gpu-jobs-name-a-queue"
POD_POLICY = "gpufleet-gpu-pods-belong-to-a-job"


def requests_gpu(pod_spec: str) -> str:
    """CEL: some container or init container of ``pod_spec`` requests or limits nvidia.com/gpu."""
    containers = f"({pod_spec}.containers + (has({pod_spec}.initContainers) ? {pod_spec}.initContainers : []))"
    return (f"{containers}.exists(c, has(c.resources) && ("
            "(has(c.resources.limits) && 'nvidia.com/gpu' in c.resources.limits) || "
            "(has(c.resources.requests) && 'nvidia.com/gpu' in c.resources.requests)))")


JOB_RULE = (f"!({requests_gpu('object.spec.template.spec')}) || "
            f"(has(object.metadata.labels) && '{QUEUE_LABEL}' in object.metadata.labels && object.metadata.labels['{QUEUE_LABEL}'] != '')")
POD_RULE = (f"!({requests_gpu('object.spec')}) || "
            "(has(object.metadata.ownerReferences) && object.metadata.ownerReferences.exists(r, "
            "r.apiVersion == 'batch/v1' && r.kind == 'Job' && has(r.controller) && r.controller))")


def policy(name: str, group: str, resource: str, operations: list[str], rule: str, message: str) -> dict:
    return {
        "apiVersion": API_VERSION, "kind": "ValidatingAdmissionPolicy", "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": [group], "apiVersions": ["v1"], "operations": operations,
                                                    "resources": [resource]}]},
            "validations": [{"expression": rule, "message": message}],
        },
    }


def binding(policy_name: str) -> dict:
    return {
        "apiVersion": API_VERSION, "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": policy_name},
        "spec": {"policyName": policy_name, "validationActions": ["Deny"],
                 "matchResources": {"namespaceSelector": {"matchExpressions": [{"key": TENANT_LABEL, "operator": "Exists"}]}}},
    }


def policies() -> tuple[dict, dict]:
    job = policy(JOB_POLICY, "batch", "jobs", ["CREATE", "UPDATE"], JOB_RULE,
                 f"a Job that requests nvidia.com/gpu must set the label {QUEUE_LABEL} to one of the namespace's LocalQueues"
                 " (gpu-<pool>), so Kueue admits it within the tenant's quota on that pool")
    pod = policy(POD_POLICY, "", "pods", ["CREATE"], POD_RULE,
                 "GPU pods in tenant namespaces come only from Kueue-admitted Jobs; submit a batch/v1 Job with a queue-name label")
    return job, pod


class TenantQueuePolicy(Construct):
    """The two policies and their bindings; a binding depends on its policy."""

    def __init__(self, scope: Construct, id_: str) -> None:
        super().__init__(scope, id_)
        manifest = kubernetes.manifest.Manifest
        self.policies = {}
        self.bindings = {}
        for p in policies():
            key = p["metadata"]["name"].removeprefix("gpufleet-").replace("-", "_")
            self.policies[key] = pin(manifest(self, f"policy_{key}", manifest=p), f"vap_{key}")
            self.bindings[key] = pin(manifest(self, f"binding_{key}", manifest=binding(p["metadata"]["name"]),
                                              depends_on=[self.policies[key]]), f"vap_binding_{key}")
