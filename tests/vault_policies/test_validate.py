"""Bad policies and roles are refused by ``gpufleet check`` with file, line, field and fix."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from clusters.errors import ConfigError
from tests.openbao_fixture import REPO_ROOT
from vault_policies.layout import MAX_WRAP_TTL_SECONDS, MIN_WRAP_TTL_SECONDS
from vault_policies.policies import parse_policy
from vault_policies.roles import load_roles, parse_duration
from vault_policies.validate import check, load_definitions


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    shutil.copytree(REPO_ROOT / "vault_policies" / "policies", tmp_path / "vault_policies" / "policies")
    shutil.copy(REPO_ROOT / "vault_policies" / "roles.yaml", tmp_path / "vault_policies" / "roles.yaml")
    return tmp_path


def _roles(repo: Path) -> Path:
    return repo / "vault_policies" / "roles.yaml"


def _policy(repo: Path, name: str, text: str) -> Path:
    path = repo / "vault_policies" / "policies" / f"{name}.hcl"
    path.write_text(text)
    return path


def _edit_roles(repo: Path, old: str, new: str) -> None:
    path = _roles(repo)
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


def _messages(repo: Path) -> str:
    return "\n".join(str(p) for p in check(repo))


def test_repo_definitions_are_valid() -> None:
    assert check(REPO_ROOT) == []
    definitions = load_definitions(REPO_ROOT)
    assert set(definitions.roles) == {"finetune", "eval"}
    assert definitions.roles["finetune"].policies == ("ml-keys-finetune",)
    assert all(role.secret_id_num_uses == 1 for role in definitions.roles.values())


def test_orchestrator_policy_bounds_match_layout() -> None:
    orchestrator = load_definitions(REPO_ROOT).policies["orchestrator"]
    rule = next(r for r in orchestrator.rules if r.path.endswith("/secret-id"))
    assert (parse_duration(rule.min_wrapping_ttl), parse_duration(rule.max_wrapping_ttl)) == (MIN_WRAP_TTL_SECONDS, MAX_WRAP_TTL_SECONDS)


def test_fails_when_policy_is_not_hcl(repo: Path) -> None:
    _policy(repo, "ml-keys-eval", 'path "secret/data/ml-api-keys/openai" {\n  capabilities = ["read"\n}\n')
    with pytest.raises(ConfigError, match=r"ml-keys-eval\.hcl:3: invalid HCL: .*fix the syntax"):
        load_definitions(repo)


def test_fails_when_role_names_missing_policy(repo: Path) -> None:
    _edit_roles(repo, "policies: [ml-keys-eval]", "policies: [ml-keys-evals]")
    with pytest.raises(ConfigError, match=r"roles\.yaml:13: roles\.eval\.policies\[0\]: policy 'ml-keys-evals' does not exist \(did you mean 'ml-keys-eval'\?\)"):
        load_definitions(repo)


def test_fails_when_role_names_operator_policy(repo: Path) -> None:
    _edit_roles(repo, "policies: [ml-keys-eval]", "policies: [orchestrator]")
    with pytest.raises(ConfigError, match=r"roles\.eval\.policies\[0\]: 'orchestrator' is an operator policy"):
        load_definitions(repo)


def test_fails_when_token_ttl_over_one_hour(repo: Path) -> None:
    _edit_roles(repo, "token_ttl: 30m", "token_ttl: 2h")
    with pytest.raises(ConfigError, match=r"roles\.yaml:8: roles\.finetune\.token_ttl: 7200s is longer than 3600s \(1h\);.*set token_period"):
        load_roles(_roles(repo))


def test_long_token_ttl_allowed_when_periodic(repo: Path) -> None:
    _edit_roles(repo, "token_ttl: 30m", "token_ttl: 2h\n    token_period: 30m")
    assert load_roles(_roles(repo))["finetune"].token_period_seconds == 1800


def test_fails_when_token_period_over_one_hour(repo: Path) -> None:
    _edit_roles(repo, "token_ttl: 30m", "token_ttl: 30m\n    token_period: 3h")
    with pytest.raises(ConfigError, match=r"roles\.finetune\.token_period: 10800s is longer than 3600s"):
        load_roles(_roles(repo))


def test_fails_when_secret_id_reusable_without_reason(repo: Path) -> None:
    _edit_roles(repo, "secret_id_num_uses: 1", "secret_id_num_uses: 0")
    with pytest.raises(ConfigError, match=r"roles\.yaml:11: roles\.finetune\.secret_id_num_uses: 0 is not allowed without a reason; allowed: 1"):
        load_roles(_roles(repo))


def test_reusable_secret_id_allowed_with_reason(repo: Path) -> None:
    _edit_roles(repo, "secret_id_num_uses: 1", "secret_id_num_uses: 3\n    reason: notebook sessions log in again after a kernel restart")
    assert load_roles(_roles(repo))["finetune"].secret_id_num_uses == 3


def test_fails_when_max_ttl_below_ttl(repo: Path) -> None:
    _edit_roles(repo, "token_max_ttl: 4h", "token_max_ttl: 10m")
    with pytest.raises(ConfigError, match=r"roles\.eval\.token_max_ttl: 600s is shorter than token_ttl 900s; allowed: token_max_ttl >= token_ttl"):
        load_roles(_roles(repo))


def test_fails_when_duration_is_not_a_duration(repo: Path) -> None:
    _edit_roles(repo, "secret_id_ttl: 6h", "secret_id_ttl: six hours")
    with pytest.raises(ConfigError, match=r"roles\.finetune\.secret_id_ttl: 'six hours' is not a duration; use seconds \(1800\) or a string like '30m'"):
        load_roles(_roles(repo))


def test_fails_when_role_has_unknown_field(repo: Path) -> None:
    _edit_roles(repo, "token_ttl: 15m", "token_tll: 15m")
    with pytest.raises(ConfigError, match=r"roles\.eval\.token_tll: unknown field \(did you mean 'token_ttl'\?\)"):
        load_roles(_roles(repo))


def test_fails_when_bound_cidr_is_not_a_network(repo: Path) -> None:
    _edit_roles(repo, "secret_id_num_uses: 1", "secret_id_num_uses: 1\n    secret_id_bound_cidrs: [10.20.0.0/33]")
    with pytest.raises(ConfigError, match=r"secret_id_bound_cidrs.*'10\.20\.0\.0/33' is not a CIDR"):
        load_roles(_roles(repo))


def test_fails_when_job_policy_reads_outside_api_keys(repo: Path) -> None:
    _policy(repo, "ml-keys-eval", 'path "secret/data/prod/db" {\n  capabilities = ["read"]\n}\n')
    assert "ml-keys-eval.hcl:1: path \"secret/data/prod/db\": 'secret/data/prod/db' is outside secret/data/ml-api-keys/" in _messages(repo)


def test_fails_when_job_policy_forgets_kv2_data_segment(repo: Path) -> None:
    _policy(repo, "ml-keys-eval", '\npath "secret/ml-api-keys/openai" {\n  capabilities = ["read"]\n}\n')
    assert "ml-keys-eval.hcl:2" in _messages(repo)
    assert "KV v2 reads need the data/ segment: secret/data/ml-api-keys/openai" in _messages(repo)


def test_fails_when_job_policy_can_write(repo: Path) -> None:
    _policy(repo, "ml-keys-eval", 'path "secret/data/ml-api-keys/openai" {\n  capabilities = ["read", "update"]\n}\n')
    with pytest.raises(ConfigError, match=r"capabilities: \['update'\] not allowed in a job policy; allowed: \[\"read\"\]"):
        load_definitions(repo)


def test_fails_when_capability_is_unknown(repo: Path) -> None:
    _policy(repo, "ml-keys-eval", 'path "secret/data/ml-api-keys/openai" {\n  capabilities = ["reed"]\n}\n')
    assert "'reed' is not a Vault capability; allowed: create, delete, deny, list, patch, read, sudo, update" in _messages(repo)


def _orchestrator(repo: Path) -> Path:
    return repo / "vault_policies" / "policies" / "orchestrator.hcl"


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


def test_fails_when_orchestrator_can_mint_unwrapped(repo: Path) -> None:
    _edit(_orchestrator(repo), 'capabilities     = ["update"]\n  min_wrapping_ttl = "60s"\n  max_wrapping_ttl = "6h"\n}\n\npath "auth/approle/role/finetune', 'capabilities     = ["update"]\n}\n\npath "auth/approle/role/finetune')
    messages = _messages(repo)
    assert "orchestrator.hcl:7: path \"auth/approle/role/eval/secret-id\".min_wrapping_ttl: None does not match layout.py (60s)" in messages
    assert "max_wrapping_ttl: None does not match layout.py (21600s)" in messages


def test_fails_when_orchestrator_reaches_beyond_approle(repo: Path) -> None:
    path = repo / "vault_policies" / "policies" / "orchestrator.hcl"
    path.write_text(path.read_text() + '\npath "secret/data/ml-api-keys/*" {\n  capabilities = ["read"]\n}\n')
    assert "'secret/data/ml-api-keys/*' not allowed for the orchestrator" in _messages(repo)


def test_fails_when_admin_could_mint_secret_ids(repo: Path) -> None:
    path = repo / "vault_policies" / "policies" / "gpufleet-admin.hcl"
    path.write_text(path.read_text().replace('path "auth/approle/role/+"', 'path "auth/approle/role/*"'))
    assert "'auth/approle/role/*' would let the sync mint secret_ids" in _messages(repo)


def test_fails_when_orchestrator_path_has_a_wildcard(repo: Path) -> None:
    _edit(_orchestrator(repo), 'path "auth/approle/role/eval/secret-id"', 'path "auth/approle/role/+/secret-id"')
    messages = _messages(repo)
    assert "orchestrator.hcl:7: path \"auth/approle/role/+/secret-id\": 'auth/approle/role/+/secret-id' uses a wildcard, which covers every AppRole role on the mount, other teams' included" in messages
    assert "path \"auth/approle/role/eval/secret-id\": missing for role 'eval'" in messages


def test_fails_when_orchestrator_lacks_a_block_for_a_role(repo: Path) -> None:
    _edit(_orchestrator(repo), 'path "auth/approle/role/finetune/role-id" {\n  capabilities = ["read"]\n}\n', "")
    problems = [str(p) for p in check(repo)]
    assert problems == [f"{_orchestrator(repo)}: path \"auth/approle/role/finetune/role-id\": missing for role 'finetune' of vault_policies/roles.yaml; dispatch could not mint for it; add the block (copy another role's role-id block)"]


def test_fails_when_orchestrator_names_a_role_outside_the_repo(repo: Path) -> None:
    _edit(_orchestrator(repo), 'path "auth/approle/role/eval/role-id"', 'path "auth/approle/role/team-x-runner/role-id"')
    messages = _messages(repo)
    assert "path \"auth/approle/role/team-x-runner/role-id\": role 'team-x-runner' is not in vault_policies/roles.yaml; allowed: eval, finetune; the orchestrator may mint only for the repo's roles" in messages


def test_fails_when_admin_policy_does_not_deny_itself(repo: Path) -> None:
    admin = repo / "vault_policies" / "policies" / "gpufleet-admin.hcl"
    _edit(admin, 'path "sys/policies/acl/gpufleet-admin" {\n  capabilities = ["deny"]\n}\n', "")
    _edit(admin, 'path "sys/policies/acl/orchestrator" {\n  capabilities = ["deny"]', 'path "sys/policies/acl/orchestrator" {\n  capabilities = ["read"]')
    messages = _messages(repo)
    assert "path \"sys/policies/acl/gpufleet-admin\": no block is not allowed; allowed: [\"deny\"]; without it the admin token can rewrite gpufleet-admin and so become root" in messages
    assert "path \"sys/policies/acl/orchestrator\": ['read'] is not allowed; allowed: [\"deny\"]" in messages


def test_fails_when_policy_carries_managed_marker(repo: Path) -> None:
    _policy(repo, "ml-keys-eval", '# managed-by: gpufleet\npath "secret/data/ml-api-keys/openai" {\n  capabilities = ["read"]\n}\n')
    assert "ml-keys-eval.hcl:1: '# managed-by: gpufleet' is added by the sync; remove that line" in _messages(repo)


def test_fails_when_orchestrator_policy_missing(repo: Path) -> None:
    (repo / "vault_policies" / "policies" / "orchestrator.hcl").unlink()
    assert "orchestrator.hcl is missing; the dispatch flow needs it" in _messages(repo)


def test_fails_when_roles_file_is_not_yaml(repo: Path) -> None:
    _roles(repo).write_text("roles:\n  eval: [unclosed\n")
    with pytest.raises(ConfigError, match=r"roles\.yaml:\d+: invalid YAML"):
        load_roles(_roles(repo))


def test_fails_when_policy_file_has_unknown_block(repo: Path) -> None:
    path = _policy(repo, "ml-keys-eval", 'path "secret/data/ml-api-keys/openai" {\n  capabilities = ["read"]\n}\n\nname "x" {\n  value = 1\n}\n')
    _, problems = parse_policy(path)
    assert [str(p) for p in problems] == [f"{path}:5: name: unknown top-level block 'name'; allowed: path; remove it"]


def test_every_problem_reported_in_one_pass(repo: Path) -> None:
    _edit_roles(repo, "token_ttl: 30m", "token_ttl: 2h")
    _edit_roles(repo, "policies: [ml-keys-eval]", "policies: [nope]")
    _policy(repo, "ml-keys-finetune", 'path "sys/mounts" {\n  capabilities = ["sudo"]\n}\n')
    assert len(check(repo)) >= 3
