"""What still holds GPUs on a scheduler, as gpufleet made it: the proof a run released them, and orphans.

A ``Holder`` is one piece of a run that has GPUs now: a Nomad allocation whose client status is not
terminal, or a Kubernetes pod that has not finished. Each scheduler's ``holders`` module
(``jobs.nomad.holders``, ``jobs.k8s.holders``) lists them in list calls and keeps only what carries
gpufleet's own marks (Nomad: a dispatched child of a job whose meta names this cluster; Kubernetes:
a pod with gpufleet's run label controlled by the Job of that name), so nothing another tool
started is ever reported, let alone stopped.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Holder:
    run_id: str  # the runner's run id (Nomad ``<namespace>/<job>``, GKE ``gke:<namespace>/<run>``)
    piece: str  # Nomad: ``allocation <id>``; GKE: ``pod <name>``
    node: str | None
    experiment: str | None  # dispatch meta gpufleet_experiment (jobs.spec.EXPERIMENT_META), when the run carries it
    status: str  # the scheduler's own word: the allocation's ClientStatus, the pod's phase

    def describe(self) -> str:
        return f"{self.piece} ({self.status}{f' on {self.node}' if self.node else ''})"
