"""Nomad side of an operator's submit and dispatch (``gpufleet jobs register|dispatch|status|cancel``):
the register rule (plan first, refuse what cannot be placed unless allowed), what must hold
before a single-use secret_id is minted, the tenant-quota rule, the mint and the dispatch, and
which namespace a run id lives in.

The control plane's path is ``jobs.runner.NomadRunner``; this module is the operator's, which
checks more before minting because a person is waiting for the answer.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from clusters.errors import UserError

if TYPE_CHECKING:
    from jobs.nomad.client import DispatchResult, NomadClient, PlanResult
    from jobs.spec import FinetuneSpec


@dataclass(frozen=True)
class Dispatched:
    result: DispatchResult
    wrap_ttl_seconds: int | None  # None: a job without secrets, nothing was minted


@dataclass(frozen=True)
class Submitted:
    """The job modify index of the registration, and the plan it was registered on (an
    unplaceable one only when the caller allowed it: its reason is worth a warning)."""

    index: int
    plan: PlanResult


def client(env: Mapping[str, str] = os.environ) -> NomadClient:
    from jobs.nomad.client import NomadClient, NomadSettings

    return NomadClient(NomadSettings.from_env(env))


def resolve(job_id: str, namespace: str | None, env: Mapping[str, str] = os.environ) -> tuple[str, FinetuneSpec | None]:
    """Namespace and spec of a (dispatched) job id: its parent's job file if there is one.

    The namespace is ``namespace`` if given, else the job file's, else NOMAD_NAMESPACE, else
    ``default`` (the Nomad CLI's fallback).
    """
    from clusters import repo
    from jobs.loader import load

    parent = job_id.split("/", 1)[0]
    found = repo.root_or_none()
    path = found / "jobs" / f"{parent}.yaml" if found else None
    spec = load(path) if path is not None and path.exists() else None
    chosen = namespace or (spec.namespace if spec else None) or env.get("NOMAD_NAMESPACE") or "default"
    return chosen, spec


def submit(spec: FinetuneSpec, *, allow_unplaceable: bool, env: Mapping[str, str] = os.environ) -> Submitted:
    """Plan, then register: a job no client can place now is refused unless ``allow_unplaceable``
    (the pool will scale up), so a job no client can run is not registered by accident."""
    nomad = client(env)
    plan = nomad.plan(spec)
    if not plan.placeable and not allow_unplaceable:
        raise UserError(f"not registering {spec.name}: {plan.reason}; pass --allow-unplaceable if the pool will scale up")
    return Submitted(nomad.register(spec), plan)


def preflight(spec: FinetuneSpec, env: Mapping[str, str] = os.environ) -> NomadClient:
    """Everything checkable before a single-use secret_id is minted: NOMAD_ADDR set, Nomad reachable, the job registered."""
    from jobs.nomad.client import NomadError

    if not env.get("NOMAD_ADDR"):
        raise UserError("NOMAD_ADDR is not set; nothing was minted; set NOMAD_ADDR (and NOMAD_TOKEN) to your Nomad servers, e.g. https://nomad.example.com:4646")
    nomad = client(env)
    try:
        nomad.status(spec.name, spec.namespace, spec, on_404="")
    except NomadError as exc:
        raise UserError(f"not dispatching, nothing was minted: {exc}; if the job is not registered yet: gpufleet jobs register {spec.name}") from None
    return nomad


def dispatch(spec: FinetuneSpec, meta: Mapping[str, str], *, idempotency_token: str, queue_seconds: int,
             env: Mapping[str, str] = os.environ) -> Dispatched:
    """Preflight, the tenant's quota, then mint one wrapped secret_id and dispatch one run."""
    from jobs.quota import check_tenant_quota
    from jobs.vault_mint import mint_wrapped_secret_id

    nomad = preflight(spec, env)
    # Nomad CE has no quotas: refuse here, before a secret_id is minted for a run that must not start.
    decision = check_tenant_quota(spec.tenant, pool=spec.pool.name, requested_gpus=spec.total_gpus,
                                  in_use_gpus=nomad.tenant_gpus_in_use(spec.namespace, spec.pool.name))
    if not decision.allowed:
        raise UserError(f"not dispatching {spec.name}: {decision.reason}")
    wrapped = mint_wrapped_secret_id(spec, env, expected_queue_seconds=queue_seconds)
    result = nomad.dispatch(spec, meta, role_id=wrapped.role_id if wrapped else None,
                            wrapping_token=wrapped.wrapping_token if wrapped else None, idempotency_token=idempotency_token)
    return Dispatched(result, wrapped.wrap_ttl_seconds if wrapped else None)
