"""Issue 16 points 1-5 and 16, as an attacker holding one token would try them, against a
real OpenBao. ``prod_vault`` holds the repo's definitions exactly as a real Vault gets them
(roles bound to the clusters' GPU ranges), so this host stands for the attacker's machine;
``vault`` is the local-development variant (roles also bound to 127.0.0.1/32)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import hvac
import hvac.exceptions
import pytest

from clusters.errors import UserError
from tests.openbao_fixture import REPO_ROOT, VaultHandle
from vault_policies import sync
from vault_policies.client import TaskConfig, VaultClientError, start_task
from vault_policies.layout import KV_MOUNT
from vault_policies.operator import role_params
from vault_policies.orchestrator import issue_wrapped_secret_id
from vault_policies.roles import task_source_cidrs
from vault_policies.validate import load_definitions

EVERYTHING = 'path "*" {\n  capabilities = ["create", "read", "update", "delete", "list", "sudo"]\n}\n'


def _pending(changes: tuple[sync.Change, ...]) -> list[tuple[str, str, str]]:
    return [(c.kind, c.name, c.action) for c in changes if c.action not in ("unchanged", "skip")]


@pytest.fixture
def team_x(prod_vault: VaultHandle) -> Iterator[None]:
    """Another team's policy and AppRole role on the same Vault, written by its own operator."""
    prod_vault.root.sys.create_or_update_acl_policy("team-x", 'path "secret/data/team-x/*" {\n  capabilities = ["read"]\n}\n')
    prod_vault.root.auth.approle.create_or_update_approle("team-x-runner", token_policies=["team-x"], token_ttl=600)
    yield
    prod_vault.root.sys.delete_acl_policy("team-x")
    prod_vault.root.auth.approle.delete_role("team-x-runner")


def test_admin_token_cannot_rewrite_default_or_write_other_policies(prod_vault: VaultHandle, team_x: None) -> None:
    """Point 1/2: the sync token may not rewrite Vault's default policy (every token has it),
    root, another team's policy, a new name, or even its own job policies beyond their reviewed text."""
    vault = prod_vault
    default_before = vault.root.sys.read_acl_policy("default")["data"]["policy"]
    for name in ("default", "root", "team-x", "backdoor", "ml-keys-backdoor", "ml-keys-finetune"):
        with pytest.raises(hvac.exceptions.Forbidden):
            vault.admin.sys.create_or_update_acl_policy(name, EVERYTHING)
    for name in ("team-x", "ml-keys-finetune", "orchestrator"):
        with pytest.raises(hvac.exceptions.Forbidden):
            vault.admin.sys.delete_acl_policy(name)
    assert vault.root.sys.read_acl_policy("default")["data"]["policy"] == default_before
    assert vault.root.sys.read_acl_policy("team-x")["data"]["policy"].startswith('path "secret/data/team-x/*"')
    assert "ml-keys-backdoor" not in vault.root.sys.list_acl_policies()["data"]["keys"]
    assert _pending(sync.diff(vault.admin, vault.definitions)) == []


def _role_write(client: hvac.Client, role: str, data: dict[str, Any]) -> None:
    client.write_data(f"auth/approle/role/{role}", data=data)


ROLE_ATTACKS = {
    "bind_secret_id false (log in with the role_id alone)": ("finetune", {"bind_secret_id": False}),
    "bind_secret_id 'false'": ("finetune", {"bind_secret_id": "false"}),
    "chosen role_id": ("finetune", {"role_id": "attacker-chosen"}),
    "reusable secret_ids (0)": ("finetune", {"secret_id_num_uses": 0}),
    "reusable secret_ids ('0')": ("finetune", {"secret_id_num_uses": "0"}),
    "orchestrator policy on a job role": ("finetune", {"token_policies": ["ml-keys-finetune", "orchestrator"]}),
    "orchestrator policy as a string": ("finetune", {"token_policies": "ml-keys-finetune,orchestrator"}),
    "the other family's keys": ("eval", {"token_policies": "ml-keys-finetune"}),
    "unbound secret_ids": ("finetune", {"secret_id_bound_cidrs": "0.0.0.0/0"}),
    "unbound tokens": ("finetune", {"token_bound_cidrs": ""}),
    "week-long tokens": ("finetune", {"token_max_ttl": "604800"}),
    "never-expiring secret_ids": ("finetune", {"secret_id_ttl": "0"}),
    "a new role with our policy": ("backdoor", {"token_policies": "ml-keys-finetune", "bind_secret_id": False}),
    "another team's role": ("team-x-runner", {"token_policies": "ml-keys-finetune"}),
}


@pytest.mark.parametrize("attack", sorted(ROLE_ATTACKS))
def test_admin_token_role_writes_are_pinned_by_vault(prod_vault: VaultHandle, team_x: None, attack: str) -> None:
    """Point 2: every role write outside the reviewed values is refused by Vault itself,
    whatever JSON type the attacker uses; the reviewed values still go through."""
    role, change = ROLE_ATTACKS[attack]
    base = role_params(prod_vault.definitions.roles[role]) if role in prod_vault.definitions.roles else {}
    with pytest.raises(hvac.exceptions.Forbidden):
        _role_write(prod_vault.admin, role, {**base, **change})
    with pytest.raises(hvac.exceptions.Forbidden):
        _role_write(prod_vault.admin, role, change)
    assert _pending(sync.diff(prod_vault.admin, prod_vault.definitions)) == []


def test_admin_token_cannot_delete_live_or_foreign_roles(prod_vault: VaultHandle, team_x: None) -> None:
    """Point 2: no delete-and-recreate of a live role (which would reset it to Vault's
    defaults), no deleting another team's role."""
    for role in ("finetune", "eval", "team-x-runner"):
        with pytest.raises(hvac.exceptions.Forbidden):
            prod_vault.admin.auth.approle.delete_role(role)
    assert {"finetune", "eval", "team-x-runner"} <= set(prod_vault.root.auth.approle.list_roles()["data"]["keys"])
    sync.apply(prod_vault.admin, prod_vault.definitions)  # the reviewed values are still writable


def test_prune_never_trusts_a_record_in_vault(prod_vault: VaultHandle, team_x: None) -> None:
    """Point 2: the old managed-roles record, edited to name another team's role, no longer
    steers prune; the admin token cannot even write it now."""
    vault = prod_vault
    with pytest.raises(hvac.exceptions.Forbidden):
        vault.admin.secrets.kv.v2.create_or_update_secret("gpufleet/managed", secret={"roles": ["team-x-runner"]}, mount_point=KV_MOUNT)
    vault.root.secrets.kv.v2.create_or_update_secret("gpufleet/managed", secret={"roles": ["eval", "finetune", "team-x-runner"]}, mount_point=KV_MOUNT)
    try:
        assert _pending(sync.prune(vault.admin, vault.definitions)) == []
        assert "team-x-runner" in vault.root.auth.approle.list_roles()["data"]["keys"]
    finally:
        vault.root.secrets.kv.v2.delete_metadata_and_all_versions("gpufleet/managed", mount_point=KV_MOUNT)


def test_diff_reports_default_drift_and_unmanaged_objects_in_our_namespace(prod_vault: VaultHandle) -> None:
    """Point 1: after someone rewrites the built-in default policy, `vault diff` says so
    (it said "no changes"); so for a policy in our namespace gpufleet did not write, and a
    foreign role carrying one of our key policies."""
    vault = prod_vault
    builtin = vault.root.sys.read_acl_policy("default")["data"]["policy"]
    vault.root.sys.create_or_update_acl_policy("default", builtin + "\n" + EVERYTHING)
    vault.root.sys.create_or_update_acl_policy("ml-keys-shadow", 'path "secret/data/ml-api-keys/*" {\n  capabilities = ["read"]\n}\n')
    vault.root.auth.approle.create_or_update_approle("team-y-runner", token_policies=["ml-keys-finetune"], token_ttl=600)
    try:
        rows = {(c.kind, c.name): c for c in sync.diff(vault.admin, vault.definitions)}
        assert rows[("policy", "default")].action == "drift" and "grants beyond OpenBao's built-in default" in rows[("policy", "default")].detail and "*" in rows[("policy", "default")].detail
        assert rows[("policy", "ml-keys-shadow")].action == "drift"
        assert rows[("role", "team-y-runner")].action == "drift" and "carries gpufleet's ml-keys-finetune" in rows[("role", "team-y-runner")].detail
        assert ("policy", "default", "drift") in _pending(sync.apply(vault.admin, vault.definitions))
        assert vault.root.sys.read_acl_policy("default")["data"]["policy"].endswith(EVERYTHING), "apply must not pretend to fix it"
    finally:
        vault.root.sys.create_or_update_acl_policy("default", builtin)
        vault.root.sys.delete_acl_policy("ml-keys-shadow")
        vault.root.auth.approle.delete_role("team-y-runner")
    assert rows and sync.diff(vault.admin, vault.definitions)[2] == sync.Change("policy", "default", "unchanged", "built-in")


def test_sync_refuses_to_write_a_builtin_policy(prod_vault: VaultHandle) -> None:
    """Point 3: even definitions built around `gpufleet check` never write default."""
    definitions = prod_vault.definitions
    policies = {**definitions.policies, "default": replace(definitions.policies["ml-keys-eval"], name="default")}
    before = prod_vault.root.sys.read_acl_policy("default")["data"]["policy"]
    with pytest.raises(UserError, match="refusing to write policy 'default'"):
        sync.apply(prod_vault.root, replace(definitions, policies=policies))
    assert prod_vault.root.sys.read_acl_policy("default")["data"]["policy"] == before


def test_roles_are_bound_to_the_clusters_gpu_ranges(prod_vault: VaultHandle, example_configs: tuple) -> None:
    """Point 4: both bindings come from the cluster files (Nomad subnet, GKE pod range)."""
    clusters = {c.name: c for c in example_configs}
    for name, role in load_definitions(REPO_ROOT).roles.items():
        want = sorted(cidr for cluster in role.clusters for cidr in task_source_cidrs(clusters[cluster]))
        data = prod_vault.root.auth.approle.read_role(name)["data"]
        assert sorted(data["secret_id_bound_cidrs"]) == sorted(data["token_bound_cidrs"]) == want
        assert data["secret_id_num_uses"] == 1 and data["bind_secret_id"] is True and data["secret_id_ttl"] <= 1800


def test_stolen_wrap_is_useless_off_the_gpu_nodes(prod_vault: VaultHandle) -> None:
    """Point 4: a reader of the dispatch meta (role_id + wrapping token) on another host
    cannot log in; the same flow from an allowed address works (the local variant)."""
    wrapped = issue_wrapped_secret_id(prod_vault.orchestrator, "finetune", wrap_ttl_seconds=120)
    stolen = TaskConfig.from_env({"VAULT_ADDR": prod_vault.addr, "GPUFLEET_VAULT_ROLE_ID": wrapped.role_id, "GPUFLEET_VAULT_WRAPPED_SECRET_ID": wrapped.wrapping_token, "GPUFLEET_SECRETS": "HF_TOKEN=ml-api-keys/huggingface#token"})
    with pytest.raises(VaultClientError, match="AppRole login refused"):
        start_task(stolen)


def test_local_variant_logs_in_from_loopback(vault: VaultHandle) -> None:
    with start_task(TaskConfig.from_env(vault.task_env("eval", "OPENAI_API_KEY=ml-api-keys/openai#api_key"))) as task:
        assert task.secrets == {"OPENAI_API_KEY": "fake-openai-test-0000"}


def test_orchestrator_token_alone_cannot_reach_the_keys(prod_vault: VaultHandle) -> None:
    """Point 5: mint wrapped, unwrap it itself, log in: refused by the CIDR binding."""
    wrapped = issue_wrapped_secret_id(prod_vault.orchestrator, "finetune", wrap_ttl_seconds=120)
    secret_id = prod_vault.client(wrapped.wrapping_token).sys.unwrap()["data"]["secret_id"]
    with pytest.raises(hvac.exceptions.InvalidRequest, match="unauthorized by CIDR restrictions"):
        prod_vault.client().auth.approle.login(wrapped.role_id, secret_id)
    with pytest.raises(hvac.exceptions.Forbidden):
        prod_vault.orchestrator.secrets.kv.v2.read_secret_version("ml-api-keys/huggingface", mount_point=KV_MOUNT, raise_on_deleted_version=True)


ORCHESTRATOR_ATTACKS = {
    "no bindings (inherit whatever the role says)": {},
    "reusable": {"num_uses": "0"},
    "any source": {"cidr_list": "0.0.0.0/0", "token_bound_cidrs": "0.0.0.0/0", "num_uses": "1"},
    "own host": {"cidr_list": "127.0.0.1/32", "token_bound_cidrs": "127.0.0.1/32", "num_uses": "1"},
    "metadata": {"metadata": '{"x": "y"}'},
}


@pytest.mark.parametrize("attack", sorted(ORCHESTRATOR_ATTACKS))
def test_orchestrator_cannot_mint_unbound_or_reusable_secret_ids(prod_vault: VaultHandle, attack: str) -> None:
    """Points 4/5: each secret_id is single-use and bound, whatever the orchestrator asks."""
    with pytest.raises(hvac.exceptions.Forbidden):
        prod_vault.orchestrator.write_data("auth/approle/role/finetune/secret-id", data=ORCHESTRATOR_ATTACKS[attack], wrap_ttl="120s")


def test_wrap_ttl_is_capped_at_thirty_minutes(prod_vault: VaultHandle) -> None:
    """Point 4: Vault refuses a wrap longer than 30 min (it allowed 6 h)."""
    cidrs = "10.128.0.0/14,10.50.0.0/20,10.64.0.0/14"  # finetune: prod-gke, prod-nomad and train-a3mega task ranges
    params = {"cidr_list": cidrs, "token_bound_cidrs": cidrs, "num_uses": "1"}
    with pytest.raises(hvac.exceptions.Forbidden):
        prod_vault.orchestrator.write_data("auth/approle/role/finetune/secret-id", data=params, wrap_ttl="3600s")
    assert prod_vault.orchestrator.write_data("auth/approle/role/finetune/secret-id", data=params, wrap_ttl="1800s")["wrap_info"]["ttl"] == 1800


def test_task_token_reads_only_the_current_key_version(vault: VaultHandle) -> None:
    """Point 16: a rotated-out key (older KV version) is out of reach of the task token."""
    path = "ml-api-keys/openai"
    current = vault.root.secrets.kv.v2.read_secret_version(path, mount_point=KV_MOUNT, raise_on_deleted_version=True)["data"]
    vault.root.secrets.kv.v2.create_or_update_secret(path, secret=current["data"], mount_point=KV_MOUNT)
    old = current["metadata"]["version"]
    with start_task(TaskConfig.from_env(vault.task_env("eval", "OPENAI_API_KEY=ml-api-keys/openai#api_key"))) as task:
        assert task.secrets["OPENAI_API_KEY"] == "fake-openai-test-0000"
        with pytest.raises(hvac.exceptions.Forbidden):
            task.client.secrets.kv.v2.read_secret_version(path, version=old, mount_point=KV_MOUNT, raise_on_deleted_version=True)
        with pytest.raises(hvac.exceptions.Forbidden):
            task.client.secrets.kv.v2.read_secret_metadata(path, mount_point=KV_MOUNT)


def test_a_policy_ending_in_a_glob_cannot_be_extended_by_the_sync_token(prod_vault: VaultHandle, tmp_path) -> None:
    """Red team: Vault reads an ``allowed_parameters`` value ending in ``*`` as a prefix glob. A
    reviewed job policy whose last character is ``*`` (a trailing comment, no final newline)
    let the sync token write "reviewed text + path "*" {...}". The rendered text always ends
    with a newline, so Vault compares the whole string."""
    from vault_policies.operator import render_admin
    from vault_policies.policies import PolicyFile

    text = 'path "secret/data/ml-api-keys/glob/*" {\n  capabilities = ["read"]\n}\n# rotated keys: see ml-api-keys/*'
    policy = PolicyFile("ml-keys-globtest", tmp_path / "ml-keys-globtest.hcl", text, ())
    vault = prod_vault
    vault.root.sys.create_or_update_acl_policy("globtest-admin", render_admin({}, (), {policy.name: policy.rendered()}))
    token = vault.root.auth.token.create(policies=["globtest-admin"], ttl="10m", no_default_policy=True)["auth"]["client_token"]
    sync_token = vault.client(token)
    try:
        assert not policy.rendered().endswith("*")
        sync_token.sys.create_or_update_acl_policy(policy.name, policy.rendered())
        with pytest.raises(hvac.exceptions.Forbidden):
            sync_token.sys.create_or_update_acl_policy(policy.name, policy.rendered() + EVERYTHING)
        with pytest.raises(hvac.exceptions.Forbidden):
            sync_token.sys.create_or_update_acl_policy(policy.name, policy.rendered().rstrip("\n") + "\n" + EVERYTHING)
        assert vault.root.sys.read_acl_policy(policy.name)["data"]["policy"] == policy.rendered()
    finally:
        vault.root.sys.delete_acl_policy("globtest-admin")
        vault.root.sys.delete_acl_policy(policy.name)


def test_diff_sees_a_default_policy_backdoor_hidden_behind_a_repeated_block(prod_vault: VaultHandle) -> None:
    """Red team: pyhcl keeps the last of two ``path "x"`` blocks, Vault merges both; a grant
    placed in a first copy of a built-in block made `vault diff` print "unchanged"."""
    vault = prod_vault
    builtin = vault.root.sys.read_acl_policy("default")["data"]["policy"]
    hidden = 'path "auth/token/lookup-self" {\n  capabilities = ["read", "update", "sudo"]\n}\n'
    assert 'path "auth/token/lookup-self"' in builtin
    vault.root.sys.create_or_update_acl_policy("default", hidden + builtin)
    try:
        row = next(c for c in sync.diff(vault.admin, vault.definitions) if (c.kind, c.name) == ("policy", "default"))
    finally:
        vault.root.sys.create_or_update_acl_policy("default", builtin)
    assert row.action == "drift" and "repeated" in row.detail, row
