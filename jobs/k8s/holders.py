"""Kubernetes pods that hold GPUs: one label-selected pod list per tenant namespace.

The service's Kubernetes identity may list pods only in the tenant namespaces (README: its RBAC is
per namespace), so this is one ``GET /api/v1/namespaces/<ns>/pods?labelSelector=gpufleet.dev/run`` per
namespace rather than one cluster-wide list. A pod holds the GPUs it requests until it has finished:
phase ``Pending`` (scheduled or waiting to be), ``Running`` or ``Unknown`` holds; ``Succeeded`` and
``Failed`` do not (the kubelet frees a terminated pod's devices; core/v1 PodPhase). A pod being deleted
(foreground stop) still holds them until it is gone.

Ours: the pod carries gpufleet's run label and is controlled by the Job of that name (ownerReferences,
``controller: true``), and before anything is stopped ``owned_job`` reads that Job and checks gpufleet's
dispatch annotation and cluster label on it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jobs.holders import Holder
from jobs.k8s.render import DISPATCH_ANNOTATION, EXPERIMENT_LABEL, GPU_RESOURCE, RUN_LABEL

if TYPE_CHECKING:
    from jobs.k8s.client import K8sClient

FINISHED = frozenset({"Succeeded", "Failed"})
CLUSTER_LABEL = "gpufleet.dev/cluster"


def holders(client: K8sClient, namespaces: list[str], prefix: str) -> list[Holder]:
    """Unfinished pods of gpufleet's runs that request GPUs, in ``namespaces``; run ids start with ``prefix``."""
    out = []
    for namespace in sorted(namespaces):
        for pod in client.list_pods(namespace, RUN_LABEL):
            meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
            labels = meta.get("labels") or {}
            run = labels.get(RUN_LABEL)
            phase = (pod.get("status") or {}).get("phase") or "Pending"
            if not run or phase in FINISHED or not _controlled_by_job(meta, run) or not _requests_gpus(spec):
                continue
            out.append(Holder(run_id=f"{prefix}{namespace}/{run}", piece=f"pod {meta.get('name')}", node=spec.get("nodeName") or None,
                              experiment=labels.get(EXPERIMENT_LABEL), status=phase))
    return sorted(out, key=lambda h: (h.run_id, h.piece))


def _controlled_by_job(meta: dict[str, Any], run: str) -> bool:
    return any(ref.get("kind") == "Job" and ref.get("name") == run and ref.get("controller") for ref in meta.get("ownerReferences") or [])


def _requests_gpus(spec: dict[str, Any]) -> bool:
    containers = [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]
    return any(GPU_RESOURCE in ((c.get("resources") or {}).get(kind) or {}) for c in containers for kind in ("limits", "requests"))


def owned_job(client: K8sClient, namespace: str, run: str, cluster: str) -> bool:
    """The Job ``run`` exists and gpufleet dispatched it for ``cluster`` (dispatch annotation, cluster label)."""
    job = client.get_job(namespace, run)
    meta = (job or {}).get("metadata") or {}
    return job is not None and bool((meta.get("annotations") or {}).get(DISPATCH_ANNOTATION)) and (meta.get("labels") or {}).get(CLUSTER_LABEL) == cluster
