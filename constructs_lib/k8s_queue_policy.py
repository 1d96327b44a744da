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

A third policy keeps the one exception GPUDirect needs from becoming a way onto the cluster: a
tenant namespace that can run on a GPUDirect pool is enforced at the ``privileged`` Pod Security
level (the RxDM sidecar adds NET_ADMIN and mounts host paths), and its members hold ``edit``.
So in tenant namespaces a pod may go beyond the ``baseline`` standard only as Google's RxDM
sidecar does, and only in a Kueue-admitted GPU pod (``PRIVILEGE_RULE``): no privileged
container, no host network/PID/IPC or host ports; hostPath volumes only at the paths Google's
NCCL tests mount; capabilities beyond baseline and an unconfined seccomp profile only on a
container that is exactly a vendored RxDM daemon (image, command and args as
``clusters/gpudirect_upstream``), and then the pod must request GPUs and be controlled by a Job,
so it lands only on a GPU node of the tenant's own admitted run, never on the system pool.
Residual, stated: a training container of such a run may mount those host paths itself.

Pure builders return the manifests (the CEL is tested by evaluating it); ``TenantQueuePolicy``
declares them as ``kubernetes_manifest``.
"""

from __future__ import annotations

import json

from constructs import Construct

from clusters.derive.tenants import TENANT_LABEL
from constructs_lib.naming import pin
from constructs_lib.providers import kubernetes

API_VERSION = "admissionregistration.k8s.io/v1"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOB_POLICY = "gpufleet-gpu-jobs-name-a-queue"
POD_POLICY = "gpufleet-gpu-pods-belong-to-a-job"
PRIVILEGE_POLICY = "gpufleet-beyond-baseline-only-as-gpudirect"
# Pod Security Standards, baseline profile, "Capabilities": what may be added without leaving it.
BASELINE_CAPABILITIES = ("AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
                         "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT")


def requests_gpu(pod_spec: str) -> str:
    """CEL: some container or init container of ``pod_spec`` requests or limits nvidia.com/gpu."""
    containers = f"({pod_spec}.containers + (has({pod_spec}.initContainers) ? {pod_spec}.initContainers : []))"
    return (f"{containers}.exists(c, has(c.resources) && ("
            "(has(c.resources.limits) && 'nvidia.com/gpu' in c.resources.limits) || "
            "(has(c.resources.requests) && 'nvidia.com/gpu' in c.resources.requests)))")


JOB_RULE = (f"!({requests_gpu('object.spec.template.spec')}) || "
            f"(has(object.metadata.labels) && '{QUEUE_LABEL}' in object.metadata.labels && object.metadata.labels['{QUEUE_LABEL}'] != '')")
JOB_OWNED = ("(has(object.metadata.ownerReferences) && object.metadata.ownerReferences.exists(r, "
             "r.apiVersion == 'batch/v1' && r.kind == 'Job' && has(r.controller) && r.controller))")
POD_RULE = f"!({requests_gpu('object.spec')}) || {JOB_OWNED}"


def _literal(value: object) -> str:
    """A CEL literal (CEL string escapes are JSON's)."""
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    return json.dumps(value)


def _field(obj: str, *path: str) -> str:
    """CEL: every step of ``obj.path`` is present."""
    return " && ".join(f"has({obj}.{'.'.join(path[:i + 1])})" for i in range(len(path)))


def _elevated(c: str) -> str:
    adds = f"{c}.securityContext.capabilities.add"
    return (f"(({_field(c, 'securityContext', 'capabilities', 'add')} && {adds}.exists(x, !(x in {_literal(BASELINE_CAPABILITIES)}))) || "
            f"({_field(c, 'securityContext', 'seccompProfile')} && {c}.securityContext.seccompProfile.type == 'Unconfined'))")


def _is_rxdm(c: str) -> str:
    from clusters.gpudirect_upstream import rxdm_sidecars

    options = []
    for daemon in rxdm_sidecars():
        caps = (daemon.get("securityContext") or {}).get("capabilities", {}).get("add", [])
        options.append(
            f"({c}.image == {_literal(daemon['image'])} && has({c}.command) && {c}.command == {_literal(daemon.get('command', []))}"
            f" && (has({c}.args) ? {c}.args : []) == {_literal(daemon.get('args', []))}"
            f" && (!{_field(c, 'securityContext', 'capabilities', 'add')} || {c}.securityContext.capabilities.add.all(x, x in {_literal([*caps, *BASELINE_CAPABILITIES])})))")
    return "(" + " || ".join(options) + ")"


def _plain(c: str) -> str:
    """CEL: container ``c`` is not privileged and binds no host port."""
    return (f"!({_field(c, 'securityContext', 'privileged')} && {c}.securityContext.privileged)"
            f" && (!has({c}.ports) || {c}.ports.all(p, !has(p.hostPort) || p.hostPort == 0))")


def privilege_rule() -> str:
    from clusters.gpudirect_upstream import host_paths

    spec = "object.spec"
    containers = f"({spec}.containers + (has({spec}.initContainers) ? {spec}.initContainers : []))"
    host_path = f"(has({spec}.volumes) && {spec}.volumes.exists(v, has(v.hostPath)))"
    return " && ".join([
        *(f"!(has({spec}.{flag}) && {spec}.{flag})" for flag in ("hostNetwork", "hostPID", "hostIPC")),
        f"!({_field(spec, 'securityContext', 'seccompProfile')} && {spec}.securityContext.seccompProfile.type == 'Unconfined')",
        f"(!has({spec}.volumes) || {spec}.volumes.all(v, !has(v.hostPath) || v.hostPath.path in {_literal(host_paths())}))",
        f"{containers}.all(c, {_plain('c')} && (!{_elevated('c')} || {_is_rxdm('c')}))",
        f"(!has({spec}.ephemeralContainers) || {spec}.ephemeralContainers.all(c, {_plain('c')} && !{_elevated('c')}))",
        f"(!({host_path} || {containers}.exists(c, {_elevated('c')})) || ({requests_gpu(spec)} && {JOB_OWNED}))",
    ])


def policy(name: str, group: str, resource: str | list[str], operations: list[str], rule: str, message: str) -> dict:
    return {
        "apiVersion": API_VERSION, "kind": "ValidatingAdmissionPolicy", "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": [group], "apiVersions": ["v1"], "operations": operations,
                                                    "resources": [resource] if isinstance(resource, str) else resource}]},
            "validations": [{"expression": rule, "message": message}],
        },
    }


def binding(policy_name: str) -> dict:
    return {
        "apiVersion": API_VERSION, "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": policy_name},
        "spec": {"policyName": policy_name, "validationActions": ["Deny"],
                 "matchResources": {"namespaceSelector": {"matchExpressions": [{"key": TENANT_LABEL, "operator": "Exists"}]}}},
    }


def policies() -> tuple[dict, dict, dict]:
    job = policy(JOB_POLICY, "batch", "jobs", ["CREATE", "UPDATE"], JOB_RULE,
                 f"a Job that requests nvidia.com/gpu must set the label {QUEUE_LABEL} to one of the namespace's LocalQueues"
                 " (gpu-<pool>), so Kueue admits it within the tenant's quota on that pool")
    pod = policy(POD_POLICY, "", "pods", ["CREATE"], POD_RULE,
                 "GPU pods in tenant namespaces come only from Kueue-admitted Jobs; submit a batch/v1 Job with a queue-name label")
    privilege = policy(PRIVILEGE_POLICY, "", ["pods", "pods/ephemeralcontainers"], ["CREATE", "UPDATE"], privilege_rule(),
                       "in tenant namespaces a pod may exceed the baseline Pod Security Standard only as Google's GPUDirect RxDM"
                       " sidecar does (its exact image, command and args), in a Kueue-admitted GPU pod of a Job; no privileged"
                       " containers, host network/PID/IPC, host ports, or hostPath outside the NCCL paths")
    return job, pod, privilege


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
