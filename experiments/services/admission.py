"""Admission checks of a submission: the job and meta checks of ``gpufleet check``/``jobs dispatch``
(one code path: ``jobs.loader.load`` and ``jobs.meta.validate_meta``), the deadline, the
scheduler that runs it, and the answer (409) when the tenant's GPU quota refuses it.

The quota itself is counted and decided in ``services.experiments.submit``, inside the
transaction that inserts the experiment and under its per-(tenant, pool) lock: counting here,
outside that lock, would let racing clients admit past the quota. The control plane enforces
it because Nomad Community Edition cannot (namespace quotas are an Enterprise feature). The
decision is ``jobs.quota.check_tenant_quota``, the one pure function ``gpufleet jobs dispatch``
calls too; only what counts as in use differs: there, the tenant's non-terminal experiments
(pending ones included, so a burst cannot queue past the quota).
"""

from __future__ import annotations

from collections.abc import Mapping

from clusters.errors import UserError
from clusters.secrets import detect
from clusters.schema import SchedulerKind
from experiments.errors import ApiError, split_message
from jobs.meta import validate_meta
from jobs.quota import QuotaDecision
from jobs.spec import FinetuneSpec

MAX_META_KEYS = 32


def refuse_credential(field: str, value: str | None) -> None:
    """A body field that names something (the job, the Idempotency-Key) is echoed by later errors and
    stored: one that looks like a credential is refused first, without showing it."""
    hit = detect(value) if value else None
    if hit:
        raise ApiError(422, f"{field} looks like a credential (not shown; detected: {hit.kind}, {hit.masked})", field=field,
                       fix="rotate it; send a job name (or an idempotency key of your own choosing), never a key")


def checked_meta(spec: FinetuneSpec, meta: dict[str, str]) -> dict[str, str]:
    if len(meta) > MAX_META_KEYS:
        raise ApiError(422, f"{len(meta)} meta keys", field="meta", fix=f"send at most {MAX_META_KEYS}; job {spec.name} declares {len(spec.meta_required) + len(spec.meta_optional)}")
    try:
        return validate_meta(spec, meta)
    except UserError as exc:
        message = str(exc)
        field = "meta"
        if message.startswith("--meta "):
            key = message.removeprefix("--meta ").split(" ", 1)[0]
            if key in meta:
                field = f"meta.{key}"
        elif message.startswith("dataset_uri ") or message.startswith("run_id "):
            field = f"meta.{message.split(' ', 1)[0]}"
        error, fix = split_message(message.replace("--meta ", "meta "))
        raise ApiError(422, error, field=field, fix=fix) from None


def checked_deadline(spec: FinetuneSpec, deadline_hours: float | None) -> float:
    max_hours = spec.max_run_ns / 3_600_000_000_000
    if deadline_hours is None:
        return max_hours
    if not 0 < deadline_hours <= max_hours:
        raise ApiError(422, f"deadline_hours {deadline_hours:g} is out of range", field="deadline_hours",
                       fix=f"allowed: more than 0 and at most the job's max_run_hours ({max_hours:g}); omit it to use {max_hours:g}")
    return deadline_hours


def quota_or_409(decision: QuotaDecision) -> None:
    if not decision.allowed:
        error, fix = split_message(decision.reason)
        raise ApiError(409, f"over the GPU quota: {error}", field="job", fix=fix)


def gpus_of(spec: FinetuneSpec) -> int:
    """The GPUs a run holds: per node x nodes (a GKE Indexed Job is admitted all ranks or none),
    the number both schedulers' quotas count."""
    return spec.total_gpus


def gpus_text(spec: FinetuneSpec) -> str:
    return f"{spec.gpu.count} GPU" if spec.nodes == 1 else f"{spec.nodes} nodes x {spec.gpu.count} GPU"


def scheduler_for(spec: FinetuneSpec, runner_scheduler: str, clusters: Mapping[str, str] | None = None) -> str:
    """The scheduler that runs ``spec``: its cluster's (Nomad or GKE) when the service routes by
    cluster ("any", bound to the clusters in ``clusters``); a service built for one scheduler
    refuses the other's job files."""
    wanted = spec.scheduler.value
    if runner_scheduler == "any" and clusters is not None:
        if clusters.get(spec.cluster) == wanted:
            return wanted
        bound = ", ".join(f"{name} ({kind})" for name, kind in sorted(clusters.items())) or "none"
        option = "--gke-cluster" if spec.scheduler == SchedulerKind.GKE else "--nomad-cluster"
        raise ApiError(422, f"job {spec.name} runs on {wanted} cluster {spec.cluster}, which this service does not dispatch to (bound: {bound})",
                       field="job", fix=f"submit it to the service started with {option} {spec.cluster}, or submit a job of a bound cluster")
    if runner_scheduler in ("any", wanted):
        return wanted
    if runner_scheduler.split(":", 1)[0] == "local" and spec.scheduler == SchedulerKind.NOMAD:
        return runner_scheduler  # local:<instance>, the service that runs it (experiments.scheduler.run_scheduler)
    raise ApiError(422, f"job {spec.name} runs on {wanted} cluster {spec.cluster}, but this service dispatches to {runner_scheduler.split(':', 1)[0]} only",
                   field="job", fix="submit a job of a Nomad cluster here, or run gpufleet serve without --scheduler local so it routes each job to its cluster's scheduler")
