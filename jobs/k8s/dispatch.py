"""Kubernetes side of an operator's dispatch (``gpufleet jobs dispatch|status|stop``): the per-rank
mint and the dispatch, and which GKE job file and namespace a run id belongs to.

Each rank gets its own wrapped single-use secret_id, minted only when the client is about to
create the Job (a retried dispatch that finds its Job mints nothing). ``jobs.runner.GkeRunner``
uses the same minter for the control plane.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jobs.k8s.client import DispatchResult, K8sClient
    from jobs.spec import FinetuneSpec


@dataclass(frozen=True)
class Dispatched:
    result: DispatchResult
    wrap_ttl_seconds: int | None  # None: the Job existed already, nothing was minted


class RankMinter:
    """``K8sClient.dispatch``'s ``mint``: one wrapped secret_id per rank; remembers the wrap TTL."""

    def __init__(self, spec: FinetuneSpec, environ: Mapping[str, str], *, queue_seconds: int) -> None:
        self._spec = spec
        self._environ = environ
        self._queue_seconds = queue_seconds
        self.wrap_ttl_seconds: int | None = None

    def __call__(self, ranks: int) -> tuple[str, list[str]]:
        from jobs.vault_mint import mint_wrapped_secret_id

        minted = [mint_wrapped_secret_id(self._spec, self._environ, expected_queue_seconds=self._queue_seconds) for _ in range(ranks)]
        wrapped = [w for w in minted if w is not None]
        if len(wrapped) != ranks:
            raise ValueError(f"job {self._spec.name} has no secrets, so its run gets no Vault Secret; nothing to mint")
        self.wrap_ttl_seconds = wrapped[0].wrap_ttl_seconds
        return wrapped[0].role_id, [w.wrapping_token for w in wrapped]


def client(env: Mapping[str, str] = os.environ) -> K8sClient:
    from jobs.k8s.client import K8sClient, K8sSettings

    return K8sClient(K8sSettings.from_env(env))


def resolve(run_id: str, namespace: str | None) -> tuple[str, str, FinetuneSpec] | None:
    """(namespace, run, spec) when ``run_id`` names a run of a GKE job file, else None.

    The namespace is ``namespace`` if given, else the one in the run id, else the job file's.
    """
    from clusters import repo
    from clusters.schema import SchedulerKind
    from jobs.k8s.render import parse_run_id
    from jobs.loader import load

    parsed = parse_run_id(run_id)
    if parsed is None:
        return None
    in_id, run, job = parsed
    path = repo.jobs_dir() / f"{job}.yaml"
    if not path.exists():
        return None
    spec = load(path)
    if spec.scheduler != SchedulerKind.GKE:
        return None
    return namespace or in_id or spec.namespace, run, spec


def dispatch(spec: FinetuneSpec, meta: Mapping[str, str], *, dispatch_id: str, queue_seconds: int,
             env: Mapping[str, str] = os.environ) -> Dispatched:
    """Create the run's Job (Kueue enforces the tenant's quota: an over-quota run waits in its queue)."""
    mint = RankMinter(spec, env, queue_seconds=queue_seconds)
    result = client(env).dispatch(spec, dict(meta), dispatch_id=dispatch_id, mint=mint)
    return Dispatched(result, mint.wrap_ttl_seconds)
