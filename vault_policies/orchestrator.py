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

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from clusters.errors import UserError
from vault_policies.layout import APPROLE_MOUNT, MAX_WRAP_TTL_SECONDS, MIN_WRAP_TTL_SECONDS
from vault_policies.operator import cidr_string

if TYPE_CHECKING:
    import hvac

QUEUE_MARGIN_SECONDS = 60
# A role's CIDR bindings, read to repeat them on each secret_id, are kept this long per Vault
# address, namespace and role (``_bindings``), so a dispatch costs Vault two calls instead of four.
BINDINGS_KEPT_SECONDS = 60.0
_kept: dict[tuple[str, str, str], tuple[float, dict[str, str]]] = {}
_kept_lock = threading.Lock()


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
    """Read the role's role_id and mint one wrapped single-use secret_id for it.

    The role_id is read every time (a role made again has a new one); the role's CIDR bindings are
    kept for ``BINDINGS_KEPT_SECONDS``. Kept values cannot widen what a secret_id allows: the
    orchestrator policy accepts exactly the repo's values on every mint (``required_parameters`` +
    ``allowed_parameters``, vault_policies/operator.py), and Vault refuses a ``cidr_list`` or
    ``token_bound_cidrs`` that is not within the role's own bindings (AppRole API, "Generate new
    secret ID": cidr_list "should be a subset of the CIDR blocks listed on the role", token_bound_cidrs
    likewise). A mint refused with kept values (403 from the policy, an error from the role) is tried
    once more with values read again, so a change applied with ``gpufleet vault apply`` takes effect at the
    next mint, not a minute later."""
    import hvac.exceptions

    if not MIN_WRAP_TTL_SECONDS <= wrap_ttl_seconds <= MAX_WRAP_TTL_SECONDS:
        raise UserError(f"wrap_ttl_seconds {wrap_ttl_seconds} is outside {MIN_WRAP_TTL_SECONDS}..{MAX_WRAP_TTL_SECONDS}; size it with wrap_ttl_for_queue(expected_queue_seconds)")
    base = f"auth/{APPROLE_MOUNT}/role/{role}"
    try:
        role_id = client.auth.approle.read_role_id(role, mount_point=APPROLE_MOUNT)["data"]["role_id"]
        bound, kept = _bindings(client, role, base)
        try:
            response = _mint(client, base, bound, wrap_ttl_seconds)
        except (hvac.exceptions.Forbidden, hvac.exceptions.InvalidRequest, hvac.exceptions.InternalServerError):
            # The policy refuses other values with 403; OpenBao 2.7 answers CIDRs not within the role's with a 500
            # ("failed to verify subset relationship between CIDR blocks", tests/vault_policies/test_mint_bindings.py).
            if not kept:
                raise
            bound, _ = _bindings(client, role, base, fresh=True)
            response = _mint(client, base, bound, wrap_ttl_seconds)
    except hvac.exceptions.Forbidden:
        raise UserError(f"the Vault token may not mint secret_ids for role {role!r}; use a token with the orchestrator policy and run `gpufleet vault apply` first") from None
    except (hvac.exceptions.InvalidPath, hvac.exceptions.InvalidRequest):
        raise UserError(f"AppRole role {role!r} does not exist in Vault; add it to vault_policies/roles.yaml and run `gpufleet vault apply`") from None
    wrap = response.get("wrap_info") if isinstance(response, dict) else None
    if not wrap:
        raise UserError(f"Vault returned an unwrapped secret_id for role {role!r}; the token's policy does not force wrapping; use the orchestrator policy")
    return WrappedSecretId(role=role, role_id=role_id, wrapping_token=wrap["token"], wrap_ttl_seconds=int(wrap["ttl"]))


def _bindings(client: hvac.Client, role: str, base: str, *, fresh: bool = False) -> tuple[dict[str, str], bool]:
    """The role's secret_id and token CIDR bindings, and whether they were kept from an earlier read."""
    key = (str(client.url), str(client.adapter.namespace or ""), role)
    now = time.monotonic()
    if not fresh:
        with _kept_lock:
            entry = _kept.get(key)
        if entry is not None and now - entry[0] < BINDINGS_KEPT_SECONDS:
            return entry[1], True
    bound = {name: cidr_string(client.read(f"{base}/{name.replace('_', '-')}")["data"].get(name) or []) for name in ("secret_id_bound_cidrs", "token_bound_cidrs")}
    with _kept_lock:
        _kept[key] = (now, bound)
    return bound, False


def _mint(client: hvac.Client, base: str, bound: dict[str, str], wrap_ttl_seconds: int) -> object:
    # Each secret_id repeats the role's bindings and is single-use whatever the role says;
    # the orchestrator policy requires exactly these values.
    params = {"cidr_list": bound["secret_id_bound_cidrs"], "token_bound_cidrs": bound["token_bound_cidrs"], "num_uses": "1"}
    return client.write_data(f"{base}/secret-id", data=params, wrap_ttl=f"{wrap_ttl_seconds}s")
