"""Admission of a submission: the job and meta checks of ``gpufleet check``/``jobs dispatch``
(one code path: ``jobs.loader.load`` and ``jobs.meta.validate_meta``) plus the tenant's GPU
quota on the pool, counted over its non-terminal experiments.

The quota is enforced here because Nomad Community Edition cannot: namespace quotas are an
Enterprise feature. The decision is ``jobs.quota.check_tenant_quota``, the one pure function
``gpufleet jobs dispatch`` calls too; only what counts as in use differs: here the tenant's
non-terminal experiments (pending ones included, so a burst cannot queue past the quota).
"""

from __future__ import annotations

from clusters.errors import UserError
from experiments.errors import ApiError, split_message
from jobs.meta import validate_meta
from jobs.quota import QuotaDecision
from jobs.spec import FinetuneSpec

MAX_META_KEYS = 32


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
