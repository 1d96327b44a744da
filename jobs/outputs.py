"""Where a checked job renders to: Nomad API JSON or Kubernetes YAML, by the cluster's scheduler."""

from __future__ import annotations

from pathlib import Path

from clusters.schema import SchedulerKind
from jobs.spec import FinetuneSpec


def write_rendered(spec: FinetuneSpec, out_dir: Path | None = None) -> Path:
    """``<out_dir>/<job>.json`` for a Nomad cluster, ``<out_dir>/<job>.yaml`` for a GKE one
    (default: the repository's ``jobs/out``)."""
    if spec.scheduler == SchedulerKind.GKE:
        from jobs.k8s.render import write_manifests

        return write_manifests(spec, out_dir)
    from jobs.nomad.render import write_job

    return write_job(spec, out_dir)
