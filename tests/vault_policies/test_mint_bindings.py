"""The dispatcher's mint keeps a role's CIDR bindings for a minute (vault_policies.orchestrator), against
a real OpenBao: two Vault calls a dispatch instead of four, never a secret_id with stale bindings.

A role and a minting policy of this test's own (the orchestrator policy mints only for the repo's
roles), shaped as ``render_orchestrator`` writes them: the policy accepts exactly the role's CIDRs."""

from __future__ import annotations

import uuid

import hvac

from tests.openbao_fixture import VaultHandle
from vault_policies import orchestrator
from vault_policies.layout import APPROLE_MOUNT
from vault_policies.orchestrator import issue_wrapped_secret_id


def _role_and_minter(vault: VaultHandle, role: str, cidrs: str) -> hvac.Client:
    """Write the role with ``cidrs`` and a policy that mints for it with exactly those; returns the minter."""
    base = f"auth/{APPROLE_MOUNT}/role/{role}"
    vault.root.write(base, secret_id_bound_cidrs=cidrs, token_bound_cidrs=cidrs, token_ttl="300s", secret_id_num_uses="1")
    policy = (f'path "{base}/secret-id" {{\n  capabilities = ["update"]\n  min_wrapping_ttl = "60s"\n  max_wrapping_ttl = "1800s"\n'
              f'  required_parameters = ["cidr_list", "num_uses", "token_bound_cidrs"]\n'
              f'  allowed_parameters = {{\n    "cidr_list" = ["{cidrs}"]\n    "num_uses" = ["1"]\n    "token_bound_cidrs" = ["{cidrs}"]\n  }}\n}}\n'
              + "".join(f'path "{base}/{tail}" {{\n  capabilities = ["read"]\n}}\n' for tail in ("role-id", "secret-id-bound-cidrs", "token-bound-cidrs")))
    vault.root.sys.create_or_update_acl_policy(f"{role}-minter", policy)
    token = vault.root.auth.token.create(policies=[f"{role}-minter"], ttl="10m", no_default_policy=True)["auth"]["client_token"]
    return vault.client(token)


def _secret_id_cidrs(vault: VaultHandle, role: str, wrapping_token: str) -> list[str]:
    secret_id = vault.client(wrapping_token).sys.unwrap()["data"]["secret_id"]
    looked = vault.root.write(f"auth/{APPROLE_MOUNT}/role/{role}/secret-id/lookup", secret_id=secret_id)["data"]
    return list(looked["cidr_list"])


def _count_reads(monkeypatch) -> list[str]:
    """Every path any Vault client reads from now on, in order."""
    reads: list[str] = []
    real_read = hvac.Client.read
    monkeypatch.setattr(hvac.Client, "read", lambda self, path, *a, **k: reads.append(path) or real_read(self, path, *a, **k))
    return reads


def test_bindings_are_read_once_a_minute_and_a_change_applies_at_the_next_mint(vault: VaultHandle, monkeypatch) -> None:
    role = f"probe-{uuid.uuid4().hex[:8]}"
    minter = _role_and_minter(vault, role, "10.50.0.0/20")
    reads = _count_reads(monkeypatch)
    try:
        first = issue_wrapped_secret_id(minter, role, wrap_ttl_seconds=120)
        second = issue_wrapped_secret_id(minter, role, wrap_ttl_seconds=120)
        assert len(reads) == 2  # the two bindings, read by the first mint only
        assert _secret_id_cidrs(vault, role, first.wrapping_token) == _secret_id_cidrs(vault, role, second.wrapping_token) == ["10.50.0.0/20"]

        # `gpufleet vault apply` narrows the role and the policy together: the kept value is refused by
        # Vault, read again once, and the very next secret_id carries the new binding.
        same_token_minter = _role_and_minter(vault, role, "10.50.1.0/24")
        third = issue_wrapped_secret_id(minter, role, wrap_ttl_seconds=120)
        assert _secret_id_cidrs(vault, role, third.wrapping_token) == ["10.50.1.0/24"]
        assert len(reads) == 4
        assert issue_wrapped_secret_id(same_token_minter, role, wrap_ttl_seconds=120).role_id == first.role_id
    finally:
        vault.root.delete(f"auth/{APPROLE_MOUNT}/role/{role}")
        vault.root.sys.delete_acl_policy(f"{role}-minter")


def test_kept_bindings_expire(vault: VaultHandle, monkeypatch) -> None:
    role = f"probe-{uuid.uuid4().hex[:8]}"
    minter = _role_and_minter(vault, role, "10.50.0.0/20")
    reads = _count_reads(monkeypatch)
    try:
        issue_wrapped_secret_id(minter, role, wrap_ttl_seconds=120)
        monkeypatch.setattr(orchestrator, "BINDINGS_KEPT_SECONDS", 0.0)
        issue_wrapped_secret_id(minter, role, wrap_ttl_seconds=120)
        assert len(reads) == 4
    finally:
        vault.root.delete(f"auth/{APPROLE_MOUNT}/role/{role}")
        vault.root.sys.delete_acl_policy(f"{role}-minter")


def test_a_dispatch_thread_keeps_its_vault_client_until_the_token_changes(vault: VaultHandle, monkeypatch) -> None:
    """A new HTTP session (and connection) per secret_id was a large part of a dispatch's CPU; a new
    VAULT_TOKEN still gets a client of its own, and the mint still answers with a working wrap."""
    import threading

    import jobs.vault_mint as vault_mint
    import vault_policies.client as client_module
    from jobs.loader import find, load
    from jobs.vault_mint import mint_wrapped_secret_id

    monkeypatch.setattr(vault_mint, "_clients", threading.local())  # none kept from earlier tests on this thread
    made: list[str] = []
    real_make = client_module.make_client
    monkeypatch.setattr(client_module, "make_client", lambda addr, **k: made.append(k["token"]) or real_make(addr, **k))
    spec = load(find("finetune-llama"))
    env = {"VAULT_ADDR": vault.addr, "VAULT_TOKEN": vault.orchestrator.token}
    wraps = [mint_wrapped_secret_id(spec, env, expected_queue_seconds=0) for _ in range(3)]
    assert made == [vault.orchestrator.token]
    other = vault.root.auth.token.create(policies=["orchestrator"], ttl="10m", no_default_policy=True)["auth"]["client_token"]
    wraps.append(mint_wrapped_secret_id(spec, {**env, "VAULT_TOKEN": other}, expected_queue_seconds=0))
    assert made == [vault.orchestrator.token, other]
    assert all(w is not None and vault.client(w.wrapping_token).sys.unwrap()["data"]["secret_id"] for w in wraps)


def test_a_role_narrowed_without_its_policy_is_refused_as_before(vault: VaultHandle) -> None:
    """The role's bindings narrowed behind the policy's back (drift): the kept, wider values are refused by
    the role itself (a secret_id's CIDRs must lie within the role's), read again, and the fresh ones by the
    policy: the same refusal as without kept values, never a secret_id with the old bindings."""
    import pytest

    from clusters.errors import UserError

    role = f"probe-{uuid.uuid4().hex[:8]}"
    minter = _role_and_minter(vault, role, "10.50.0.0/20")
    try:
        issue_wrapped_secret_id(minter, role, wrap_ttl_seconds=120)
        base = f"auth/{APPROLE_MOUNT}/role/{role}"
        vault.root.write(base, secret_id_bound_cidrs="10.50.1.0/24", token_bound_cidrs="10.50.1.0/24")
        with pytest.raises(UserError, match="may not mint secret_ids"):
            issue_wrapped_secret_id(minter, role, wrap_ttl_seconds=120)
    finally:
        vault.root.delete(f"auth/{APPROLE_MOUNT}/role/{role}")
        vault.root.sys.delete_acl_policy(f"{role}-minter")


def test_a_kept_client_whose_token_was_revoked_mints_nothing(vault: VaultHandle, monkeypatch) -> None:
    """The thread's kept client and the kept bindings outlive nothing Vault decides: once its token is
    revoked, the next mint on the same thread (same client, bindings kept) is refused with the one-line
    error, and no wrap comes back."""
    import threading

    import pytest

    import jobs.vault_mint as vault_mint
    from clusters.errors import UserError
    from jobs.loader import find, load
    from jobs.vault_mint import mint_wrapped_secret_id

    monkeypatch.setattr(vault_mint, "_clients", threading.local())
    spec = load(find("finetune-llama"))
    token = vault.root.auth.token.create(policies=["orchestrator"], ttl="10m", no_default_policy=True)["auth"]["client_token"]
    env = {"VAULT_ADDR": vault.addr, "VAULT_TOKEN": token}
    assert mint_wrapped_secret_id(spec, env, expected_queue_seconds=0) is not None
    vault.root.auth.token.revoke(token)
    with pytest.raises(UserError) as refused:
        mint_wrapped_secret_id(spec, env, expected_queue_seconds=0)
    assert token not in str(refused.value)
