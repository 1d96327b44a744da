"""The sync against a real OpenBao: idempotent apply, drift detection, prune that spares others."""

from __future__ import annotations

import shutil
from pathlib import Path

import hvac
import hvac.exceptions
import pytest

from clusters.errors import UserError
from gpufleet.cli import main
from tests.openbao_fixture import REPO_ROOT, VaultHandle
from vault_policies import sync
from vault_policies.devserver import start_dev_server
from vault_policies.layout import MANAGED_MARKER
from vault_policies.orchestrator import issue_wrapped_secret_id
from vault_policies.validate import load_definitions, render


def _pending(changes: tuple[sync.Change, ...]) -> list[tuple[str, str, str]]:
    return [(c.kind, c.name, c.action) for c in changes if c.action not in ("unchanged", "skip")]


def test_apply_twice_changes_nothing_the_second_time(vault: VaultHandle) -> None:
    assert _pending(sync.apply(vault.admin, vault.definitions)) == []
    assert _pending(sync.diff(vault.admin, vault.definitions)) == []
    text = vault.root.sys.read_acl_policy("ml-keys-finetune")["data"]["policy"]
    assert text.startswith(MANAGED_MARKER)


def test_fails_when_admin_token_rewrites_an_operator_policy(vault: VaultHandle) -> None:
    """gpufleet-admin may write job policies, but not its own or the orchestrator's: else it is root."""
    everything = 'path "*" {\n  capabilities = ["create", "read", "update", "delete", "list", "sudo"]\n}\n'
    before = {name: vault.root.sys.read_acl_policy(name)["data"]["policy"] for name in ("gpufleet-admin", "orchestrator")}
    for name in before:
        with pytest.raises(hvac.exceptions.Forbidden, match="permission denied"):
            vault.admin.sys.create_or_update_acl_policy(name, everything)
        with pytest.raises(hvac.exceptions.Forbidden):
            vault.admin.sys.delete_acl_policy(name)
        assert vault.root.sys.read_acl_policy(name)["data"]["policy"] == before[name]
    rows = {c.name: c.action for c in sync.diff(vault.admin, vault.definitions) if c.kind == "policy"}
    assert rows["gpufleet-admin"] == rows["orchestrator"] == "unchanged"


def test_fails_when_orchestrator_mints_for_an_unmanaged_role(vault: VaultHandle) -> None:
    vault.root.auth.approle.create_or_update_approle("team-x-runner", token_policies=["default"], token_ttl=600)
    try:
        with pytest.raises(hvac.exceptions.Forbidden):
            vault.orchestrator.auth.approle.generate_secret_id("team-x-runner", wrap_ttl="60s")
        with pytest.raises(hvac.exceptions.Forbidden):
            vault.orchestrator.auth.approle.read_role_id("team-x-runner")
        with pytest.raises(UserError, match="may not mint secret_ids for role 'team-x-runner'"):
            issue_wrapped_secret_id(vault.orchestrator, "team-x-runner", wrap_ttl_seconds=60)
        assert issue_wrapped_secret_id(vault.orchestrator, "eval", wrap_ttl_seconds=60).role == "eval"
    finally:
        vault.root.auth.approle.delete_role("team-x-runner")


def test_drift_is_shown_then_repaired(vault: VaultHandle) -> None:
    vault.root.auth.approle.create_or_update_approle("eval", token_policies=["ml-keys-eval", "orchestrator"], token_ttl=60, token_max_ttl=14400, secret_id_ttl=1800, secret_id_num_uses=1)
    vault.root.sys.create_or_update_acl_policy("ml-keys-eval", 'path "secret/data/*" { capabilities = ["read"] }')
    changes = {(c.kind, c.name): c for c in sync.diff(vault.admin, vault.definitions)}
    assert changes[("role", "eval")].action == "update"
    assert changes[("role", "eval")].detail == "token_policies 'ml-keys-eval,orchestrator' -> 'ml-keys-eval', token_ttl '60' -> '300'"
    assert changes[("policy", "ml-keys-eval")].detail == "text differs; takes over an unmanaged policy"
    assert _pending(sync.apply(vault.admin, vault.definitions)) == [("policy", "ml-keys-eval", "update"), ("role", "eval", "update")]
    assert _pending(sync.apply(vault.admin, vault.definitions)) == []


def test_prune_removes_only_what_gpufleet_wrote(prod_vault: VaultHandle, tmp_path: Path) -> None:
    """Prune deletes marked ml-keys-* policies that left the repo and the roles roles.yaml
    retires, as an operator-applied admin policy allows; never anyone else's."""
    vault = prod_vault
    shutil.copytree(REPO_ROOT / "vault_policies", tmp_path / "vault_policies", ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    shutil.copytree(REPO_ROOT / "clusters", tmp_path / "clusters", ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    (tmp_path / "vault_policies" / "policies" / "ml-keys-retired.hcl").write_text('path "secret/data/ml-api-keys/retired" {\n  capabilities = ["read"]\n  denied_parameters = {\n    "version" = []\n  }\n}\n')
    roles = tmp_path / "vault_policies" / "roles.yaml"
    roles.write_text(roles.read_text() + "  retired:\n    policies: [ml-keys-retired]\n    clusters: [prod-nomad]\n    token_ttl: 10m\n    token_max_ttl: 1h\n    secret_id_ttl: 10m\n")
    render(tmp_path)
    with_retired = load_definitions(tmp_path)
    for name in ("gpufleet-admin", "orchestrator"):  # the operator step: a role was added
        vault.root.sys.create_or_update_acl_policy(name, with_retired.policies[name].rendered())
    sync.apply(vault.admin, with_retired)
    # The role leaves the repo: roles.yaml retires it, the policy file goes, an operator re-applies.
    (tmp_path / "vault_policies" / "policies" / "ml-keys-retired.hcl").unlink()
    roles.write_text(roles.read_text().split("  retired:\n")[0] + "retired: [retired]\n")
    render(tmp_path)
    dropped = load_definitions(tmp_path)
    vault.root.sys.create_or_update_acl_policy("gpufleet-admin", dropped.policies["gpufleet-admin"].rendered())
    vault.root.sys.create_or_update_acl_policy("team-x", 'path "secret/data/team-x/*" { capabilities = ["read"] }')
    vault.root.auth.approle.create_or_update_approle("team-x-runner", token_policies=["team-x"], token_ttl=600)
    try:
        planned = _pending(sync.diff(vault.admin, dropped))
        assert ("policy", "ml-keys-retired", "delete (prune)") in planned and ("role", "retired", "delete (prune)") in planned
        pruned = _pending(sync.prune(vault.admin, dropped))
        assert pruned == [("policy", "ml-keys-retired", "delete"), ("role", "retired", "delete")]
        policies = vault.root.sys.list_acl_policies()["data"]["keys"]
        roles_left = vault.root.auth.approle.list_roles()["data"]["keys"]
        assert "team-x" in policies and "ml-keys-retired" not in policies
        assert "team-x-runner" in roles_left and "retired" not in roles_left
        assert _pending(sync.prune(vault.admin, dropped)) == []
    finally:
        vault.root.sys.delete_acl_policy("team-x")
        vault.root.auth.approle.delete_role("team-x-runner")
        definitions = load_definitions(REPO_ROOT)
        for name in ("gpufleet-admin", "orchestrator"):
            vault.root.sys.create_or_update_acl_policy(name, definitions.policies[name].rendered())


def test_cli_diff_and_apply(prod_vault: VaultHandle, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    vault = prod_vault
    monkeypatch.setenv("VAULT_ADDR", vault.addr)
    monkeypatch.setenv("VAULT_TOKEN", vault.admin.token)
    monkeypatch.delenv("VAULT_NAMESPACE", raising=False)
    assert main(["vault", "apply", "--repo", str(REPO_ROOT)]) == 0
    assert main(["vault", "diff", "--repo", str(REPO_ROOT)]) == 0
    out = capsys.readouterr().out
    assert "ml-keys-finetune" in out and out.rstrip().endswith("no changes")


def test_fails_when_cli_token_lacks_admin_policy(vault: VaultHandle, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("VAULT_ADDR", vault.addr)
    monkeypatch.setenv("VAULT_TOKEN", vault.orchestrator.token)
    assert main(["vault", "apply", "--repo", str(REPO_ROOT)]) == 2
    assert "use a VAULT_TOKEN with the gpufleet-admin policy" in capsys.readouterr().err


def test_fails_when_cli_has_no_vault_env(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("VAULT_ADDR", raising=False)
    monkeypatch.delenv("VAULT_TOKEN", raising=False)
    assert main(["vault", "diff", "--repo", str(REPO_ROOT)]) == 2
    assert "VAULT_ADDR and VAULT_TOKEN must be set" in capsys.readouterr().err


def test_fails_when_secret_mount_is_kv_version_1(tmp_path: Path) -> None:
    server = start_dev_server(tmp_path / "bao.log")
    try:
        root = hvac.Client(url=server.addr, token=server.root_token)
        root.sys.disable_secrets_engine("secret")
        root.sys.enable_secrets_engine("kv", path="secret", options={"version": "1"})
        with pytest.raises(UserError, match=r"mount secret/ exists as '1', not KV version 2; .*bao kv enable-versioning secret/"):
            sync.apply(root, load_definitions(REPO_ROOT))
        assert root.sys.list_acl_policies()["data"]["keys"] == ["default", "root"], "nothing may be written before the refusal"
    finally:
        server.stop()


def test_a_root_apply_does_not_tell_the_reader_to_find_a_root_token(tmp_path: Path) -> None:
    """`gpufleet dev up` (and a root bootstrap) wrote the operator policies: the row says so, not the
    diff's hint that only a root token may write them."""
    server = start_dev_server(tmp_path / "bao.log")
    try:
        root = hvac.Client(url=server.addr, token=server.root_token)
        rows = {c.name: c for c in sync.apply(root, load_definitions(REPO_ROOT)) if c.kind == "policy"}
        for name in ("gpufleet-admin", "orchestrator"):
            assert (rows[name].action, rows[name].detail) == ("create", "operator policy")
    finally:
        server.stop()
