"""The GPU health checker DaemonSet (scheduler stack): a node whose GPUs fail is tainted so no run lands on it.

What upstream does at the pinned versions, and why it is not enough: GKE's NVIDIA device plugin
(container-engine-accelerators 992db812 pkg/gpu/nvidia/health_check/health_checker.go) marks a GPU
Unhealthy on a critical XID, which lowers the node's allocatable ``nvidia.com/gpu`` (an 8-GPU rank no
longer fits), and sets the node condition ``XidCriticalError``, which the scheduler ignores; on start the
plugin removes that condition only when the node's boot ID differs from the one recorded with it (a
repaired or rebooted node), and keeps it across a plain plugin restart (resetXIDCondition,
health_checker.go:126-143); the cluster-toolkit (1047080375afbb44) checks GPU count and uncorrected
ECC only in an init container before its workload (examples/gke-consumption-options/dws-flex-start/
nccl-jobset-example.yaml, ``gpu-healthcheck``); Kueue v0.19.2 has no node health notion. Nothing there
taints a node. gpufleet runs the toolkit's two checks plus the plugin's XID condition on every GPU node
all the time and turns three consecutive failures into a taint that holds until the node reboots and
passes (``constructs_lib/gpu_health_check.py``, shipped in a ConfigMap), so one bad node is kept out of every later run instead of failing each run's pre-flight in turn.

Like upstream's check it runs privileged with the host's NVIDIA directory mounted (it must see every
GPU of the node without requesting any) in ``kube-system``; it tolerates its pools' taints and its own,
so it keeps watching a node it tainted. Its service account may only get and patch Nodes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from constructs import Construct

from clusters.derive.gpu_health import GpuHealthSpec
from clusters.derive.pools import POOL_LABEL, QUEUED_LABEL
from constructs_lib import gpu_health_check
from constructs_lib.kueue import TAINT_EFFECTS
from constructs_lib.naming import pin
from constructs_lib.providers import kubernetes

NAME = "gpufleet-gpu-health"
NAMESPACE = "kube-system"
# A pinned plain Python (the checker is standard library only).
IMAGE = "python:3.12.8-slim"
SCRIPT = "gpu_health_check.py"
# The host's NVIDIA directory as cluster-toolkit's gpu-healthcheck mounts it (nvidia-smi in its bin/).
HOST_NVIDIA = "/home/kubernetes/bin/nvidia"
RBAC_GROUP = "rbac.authorization.k8s.io"


def checker_source() -> str:
    return Path(gpu_health_check.__file__).read_text()


def daemonset(spec: GpuHealthSpec) -> dict[str, Any]:
    """The DaemonSet: one checker per node of the watched pools."""
    tolerations = [{"key": t.key, "operator": "Equal", "value": t.value, "effect": TAINT_EFFECTS[t.effect]} for t in spec.taints]
    tolerations.append({"key": gpu_health_check.TAINT_KEY, "operator": "Exists", "effect": gpu_health_check.TAINT_EFFECT})
    if spec.queued_provisioning:
        tolerations.append({"key": QUEUED_LABEL, "operator": "Exists", "effect": "NoSchedule"})
    labels = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/managed-by": "gpufleet"}
    return {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": NAME}},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": NAME,
                    "automountServiceAccountToken": True,
                    "priorityClassName": "system-node-critical",
                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                        {"matchExpressions": [{"key": POOL_LABEL, "operator": "In", "values": [name for name, _ in spec.pools]}]}]}}},
                    "tolerations": tolerations,
                    "containers": [{
                        "name": "checker",
                        "image": IMAGE,
                        "imagePullPolicy": "IfNotPresent",
                        "command": ["python3", f"/opt/gpufleet/{SCRIPT}"],
                        "env": [
                            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                            {"name": "GPUFLEET_EXPECTED_GPUS", "value": json.dumps(dict(spec.pools), sort_keys=True)},
                            {"name": "NVIDIA_SMI", "value": "/usr/local/nvidia/bin/nvidia-smi"},
                            {"name": "LD_LIBRARY_PATH", "value": "/usr/local/nvidia/lib64"},
                        ],
                        "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}},
                        "securityContext": {"privileged": True},
                        "volumeMounts": [{"name": "nvidia", "mountPath": "/usr/local/nvidia", "readOnly": True},
                                         {"name": "script", "mountPath": "/opt/gpufleet", "readOnly": True}],
                    }],
                    "volumes": [{"name": "nvidia", "hostPath": {"path": HOST_NVIDIA, "type": "Directory"}},
                                {"name": "script", "configMap": {"name": NAME, "defaultMode": 0o444}}],
                },
            },
        },
    }


class GpuHealth(Construct):
    """ServiceAccount, a ClusterRole on Nodes (get, patch) bound to it, the script's ConfigMap and the DaemonSet."""

    def __init__(self, scope: Construct, id_: str, *, spec: GpuHealthSpec) -> None:
        super().__init__(scope, id_)
        meta = {"name": NAME, "labels": {"app.kubernetes.io/managed-by": "gpufleet"}}
        self.service_account = pin(kubernetes.service_account_v1.ServiceAccountV1(
            self, "service_account", metadata={**meta, "namespace": NAMESPACE}), "ksa_gpu_health")
        cr = kubernetes.cluster_role_v1
        self.role = pin(cr.ClusterRoleV1(self, "role", metadata=meta, rule=[
            cr.ClusterRoleV1Rule(api_groups=[""], resources=["nodes"], verbs=["get", "patch"])]), "cluster_role_gpu_health")
        # ClusterRoleBinding and ConfigMap as manifests: the preview's ForceNew tables cover kubernetes_manifest
        # (preview/forcenew/kubernetes.json) and not the typed resources of these two kinds.
        manifest = kubernetes.manifest.Manifest
        self.binding = pin(manifest(self, "binding", manifest={
            "apiVersion": f"{RBAC_GROUP}/v1", "kind": "ClusterRoleBinding", "metadata": meta,
            "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": NAME},
            "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]}, depends_on=[self.role, self.service_account]),
            "crb_gpu_health")
        self.script = pin(manifest(self, "script", manifest={
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {**meta, "namespace": NAMESPACE}, "data": {SCRIPT: checker_source()}}),
            "cm_gpu_health")
        self.daemonset = pin(manifest(
            self, "daemonset", manifest=daemonset(spec), depends_on=[self.script, self.binding]), "ds_gpu_health")
