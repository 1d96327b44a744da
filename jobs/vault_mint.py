"""The dispatcher's Vault step: one wrapped single-use secret_id for the job's role.

Shared by ``dispatch`` (the token rides in Nomad dispatch meta) and ``run-local`` (it goes
straight into the child's environment). The caller's VAULT_TOKEN needs the orchestrator
policy; only the wrapping token leaves this function, never a plain secret_id.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING

from clusters.derive.pools import GpuPoolSpec
from clusters.errors import UserError
from jobs.spec import FinetuneSpec

if TYPE_CHECKING:
    import hvac

    from vault_policies.orchestrator import WrappedSecretId


# How long a dispatched run may wait for a GPU when the operator does not say: a pool that
# scales from zero must boot a node and install drivers first; a warm pool only queues.
SCALE_FROM_ZERO_QUEUE_SECONDS = 20 * 60
WARM_POOL_QUEUE_SECONDS = 5 * 60
# Each thread's Vault client and the settings it was made with (``_client``).
_clients = threading.local()


def default_queue_seconds(pool: GpuPoolSpec) -> int:
    """The expected queue wait a dispatch sizes its wrap TTL for, from the target pool.

    Too short a wrap TTL makes a run that waited for a fresh node find its wrapping token
    expired and exit 78 with a compromise alarm; too long only widens the window in which an
    intercepted token could be used, which the task would then report.

    A reserved pool keeps its nodes warm (clusters.derive.pools.min_nodes_of) because it is sized
    to its reservation, which its runs then fill: they wait for another run's GPUs in Kueue, not for
    a node, so they keep the longer bound they had when the pool scaled from zero.
    """
    return SCALE_FROM_ZERO_QUEUE_SECONDS if pool.min_nodes == 0 or pool.reservation else WARM_POOL_QUEUE_SECONDS


def queue_seconds(pool: GpuPoolSpec, expected_queue_minutes: int | None) -> int:
    """The queue wait a dispatch sizes its wrap TTL for: the operator's minutes, else the pool's default."""
    return expected_queue_minutes * 60 if expected_queue_minutes is not None else default_queue_seconds(pool)


def mint_wrapped_secret_id(spec: FinetuneSpec, environ: Mapping[str, str], *, expected_queue_seconds: int) -> WrappedSecretId | None:
    """One wrapped single-use secret_id for the job's role; None for a job without ``secrets:``,
    which has no role: nothing is minted and Vault is not contacted (no VAULT_TOKEN needed)."""
    if spec.vault_role is None:
        return None
    from vault_policies.client import VaultClientError
    from vault_policies.orchestrator import issue_wrapped_secret_id, wrap_ttl_for_queue

    addr, token = environ.get("VAULT_ADDR"), environ.get("VAULT_TOKEN")
    if not addr or not token:
        missing = " and ".join(n for n, v in (("VAULT_ADDR", addr), ("VAULT_TOKEN", token)) if not v)
        raise UserError(f"{missing} not set; the dispatcher needs a Vault token with the orchestrator policy (locally: gpufleet dev up; eval \"$(gpufleet dev env)\")")
    client = _client(addr, token, environ.get("VAULT_CACERT") or None, environ.get("VAULT_NAMESPACE") or None)
    import requests

    try:
        return issue_wrapped_secret_id(client, spec.vault_role, wrap_ttl_seconds=wrap_ttl_for_queue(expected_queue_seconds))
    except requests.exceptions.ConnectionError:
        raise UserError(f"cannot reach Vault at {addr}; check VAULT_ADDR (locally: gpufleet dev up)") from None
    except VaultClientError as exc:
        raise UserError(str(exc)) from None


def _client(addr: str, token: str, cacert: str | None, namespace: str | None) -> hvac.Client:
    """This thread's client for these settings, made once: a dispatcher minting for every run opened a new
    HTTP session and connection (a TLS handshake, with a real Vault) per secret_id. One per thread, because a
    requests session is not documented as safe to share between threads; the dispatcher's threads are few
    and long-lived. The token lives here as long as it does in the environment it came from."""
    from vault_policies.client import make_client

    key = (addr, token, cacert, namespace)
    kept = getattr(_clients, "last", None)
    if kept is not None and kept[0] == key:
        return kept[1]
    client = make_client(addr, token=token, cacert=cacert, namespace=namespace)
    _clients.last = (key, client)  # one a thread: a new token (or address) replaces it
    return client


def platform_meta(wrapped: WrappedSecretId | None) -> dict[str, str]:
    """The dispatch meta the platform adds: role_id and wrapping token, or nothing for a job without secrets."""
    from vault_policies.layout import META_ROLE_ID, META_WRAPPED_SECRET_ID

    return {} if wrapped is None else {META_ROLE_ID: wrapped.role_id, META_WRAPPED_SECRET_ID: wrapped.wrapping_token}
