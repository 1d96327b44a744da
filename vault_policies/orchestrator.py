"""Dispatcher side: mint a response-wrapped, single-use secret_id for one task.

Stable API used by ``jobs`` (Nomad dispatch and run-local)::

    from vault_policies.orchestrator import issue_wrapped_secret_id, wrap_ttl_for_queue
    wrapped = issue_wrapped_secret_id(client, "finetune", wrap_ttl_seconds=wrap_ttl_for_queue(900))
    # task env: GPUFLEET_VAULT_ROLE_ID=wrapped.role_id,
    #           GPUFLEET_VAULT_WRAPPED_SECRET_ID=wrapped.wrapping_token

``client`` is an ``hvac.Client`` holding a token with the ``orchestrator`` policy. The
plain secret_id never leaves Vault's cubbyhole: only the task that unwraps it sees it, and
a second unwrap (someone intercepted the token) fails loudly in the task. The wrap TTL is
the longest the task may wait in the queue before it unwraps; Vault enforces the same
bounds through the policy's min/max_wrapping_ttl. Each secret_id is single-use and carries
the role's CIDR bindings (GPU node ranges), so neither a reader of the dispatch meta nor the
orchestrator itself can log in with it from elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from clusters.errors import UserError
from vault_policies.layout import APPROLE_MOUNT, MAX_WRAP_TTL_SECONDS, MIN_WRAP_TTL_SECONDS
from vault_policies.operator import cidr_string

if TYPE_CHECKING:
    import hvac

QUEUE_MARGIN_SECONDS = 60


@dataclass(frozen=True)
class WrappedSecretId:
    """What a task needs to log in; ``wrapping_token`` is kept out of repr so it never lands in logs."""

    role: str
    role_id: str
    wrapping_token: str = field(repr=False)
    wrap_ttl_seconds: int


def wrap_ttl_for_queue(expected_queue_seconds: int) -> int:
    """A wrap TTL covering the expected queue wait plus a margin, within the policy bounds.

    A wait longer than the maximum is refused rather than clamped: a token that expires
    in the queue would only fail later, inside the task, with a less useful message.
    """
    if expected_queue_seconds < 0:
        raise UserError(f"expected queue time {expected_queue_seconds}s is negative; pass seconds >= 0")
    wanted = max(MIN_WRAP_TTL_SECONDS, expected_queue_seconds + max(QUEUE_MARGIN_SECONDS, expected_queue_seconds // 4))
    if expected_queue_seconds > MAX_WRAP_TTL_SECONDS:
        raise UserError(f"expected queue time {expected_queue_seconds}s exceeds the maximum wrap TTL {MAX_WRAP_TTL_SECONDS}s; dispatch closer to when capacity frees up, or raise MAX_WRAP_TTL_SECONDS together with orchestrator.hcl")
    return min(wanted, MAX_WRAP_TTL_SECONDS)


def issue_wrapped_secret_id(client: hvac.Client, role: str, *, wrap_ttl_seconds: int) -> WrappedSecretId:
    """Read the role's role_id and mint one wrapped single-use secret_id for it."""
    import hvac.exceptions

    if not MIN_WRAP_TTL_SECONDS <= wrap_ttl_seconds <= MAX_WRAP_TTL_SECONDS:
        raise UserError(f"wrap_ttl_seconds {wrap_ttl_seconds} is outside {MIN_WRAP_TTL_SECONDS}..{MAX_WRAP_TTL_SECONDS}; size it with wrap_ttl_for_queue(expected_queue_seconds)")
    base = f"auth/{APPROLE_MOUNT}/role/{role}"
    try:
        role_id = client.auth.approle.read_role_id(role, mount_point=APPROLE_MOUNT)["data"]["role_id"]
        bound = {key: cidr_string(client.read(f"{base}/{key.replace('_', '-')}")["data"].get(key) or []) for key in ("secret_id_bound_cidrs", "token_bound_cidrs")}
        # Each secret_id repeats the role's bindings and is single-use whatever the role says;
        # the orchestrator policy requires exactly these values.
        params = {"cidr_list": bound["secret_id_bound_cidrs"], "token_bound_cidrs": bound["token_bound_cidrs"], "num_uses": "1"}
        response = client.write_data(f"{base}/secret-id", data=params, wrap_ttl=f"{wrap_ttl_seconds}s")
    except hvac.exceptions.Forbidden:
        raise UserError(f"the Vault token may not mint secret_ids for role {role!r}; use a token with the orchestrator policy and run `gpufleet vault apply` first") from None
    except (hvac.exceptions.InvalidPath, hvac.exceptions.InvalidRequest):
        raise UserError(f"AppRole role {role!r} does not exist in Vault; add it to vault_policies/roles.yaml and run `gpufleet vault apply`") from None
    wrap = response.get("wrap_info") if isinstance(response, dict) else None
    if not wrap:
        raise UserError(f"Vault returned an unwrapped secret_id for role {role!r}; the token's policy does not force wrapping; use the orchestrator policy")
    return WrappedSecretId(role=role, role_id=role_id, wrapping_token=wrap["token"], wrap_ttl_seconds=int(wrap["ttl"]))
