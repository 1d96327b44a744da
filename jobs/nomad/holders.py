"""Nomad allocations that hold GPUs, in two list calls for every namespace at once.

``GET /v1/allocations?namespace=*`` and ``GET /v1/jobs?namespace=*&meta=true``: ``*`` is Nomad's
all-namespaces sentinel (hashicorp/nomad nomad/structs/structs.go:187 ``AllNamespacesSentinel``, honoured
by the allocation and job lists, nomad/alloc_endpoint.go:82 and nomad/job_endpoint.go:1444; an ACL token
sees the namespaces it may list), and ``meta=true`` adds each job's Meta to its JobListStub
(command/agent/job_endpoint.go:45-52, api ``JobListStub.Meta``).

An allocation holds its GPUs until its client says it stopped: ClientStatus ``pending``, ``running`` or
``unknown`` (node disconnected, the task may still run) holds; ``complete``, ``failed`` and ``lost`` do not
(nomad/structs/alloc.go:29-36). A server-side stop (DesiredStatus ``stop``) is not a release: the client
still has to kill the task. gpufleet's renderer gives every task a GPU device, so every allocation of a
gpufleet job holds GPUs while it holds anything.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jobs.holders import Holder
from jobs.spec import EXPERIMENT_META

if TYPE_CHECKING:
    from jobs.nomad.client import NomadClient

ALL_NAMESPACES = "*"
HOLDING = frozenset({"pending", "running", "unknown"})
# Static meta of every job gpufleet renders (jobs.nomad.render): whose cluster it is.
CLUSTER_META = "gpufleet_cluster"


def holders(client: NomadClient, cluster: str) -> list[Holder]:
    """Allocations holding GPUs that belong to a dispatched run of a gpufleet job of ``cluster``."""
    jobs = {(stub.get("Namespace") or "default", stub["ID"]): stub for stub in client.list_jobs_with_meta(ALL_NAMESPACES)}
    out = []
    for alloc in client.list_allocations(ALL_NAMESPACES, task_states=False):
        namespace = alloc.get("Namespace") or "default"
        job = jobs.get((namespace, alloc.get("JobID", "")))
        if alloc.get("ClientStatus") not in HOLDING or not ours(job, cluster):
            continue
        assert job is not None
        meta = job.get("Meta") or {}
        out.append(Holder(run_id=f"{namespace}/{job['ID']}", piece=f"allocation {alloc['ID']}", node=alloc.get("NodeName") or None,
                          experiment=meta.get(EXPERIMENT_META), status=str(alloc.get("ClientStatus"))))
    return sorted(out, key=lambda h: (h.run_id, h.piece))


def ours(job: dict[str, Any] | None, cluster: str) -> bool:
    """A dispatched child (ParentID set) of a job gpufleet rendered for ``cluster`` (its Meta says so)."""
    return job is not None and bool(job.get("ParentID")) and (job.get("Meta") or {}).get(CLUSTER_META) == cluster
