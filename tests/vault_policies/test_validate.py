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
from vault_policies.validate import check, load_definitions, render


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    shutil.copytree(REPO_ROOT / "vault_policies" / "policies", tmp_path / "vault_policies" / "policies")
    shutil.copy(REPO_ROOT / "vault_policies" / "roles.yaml", tmp_path / "vault_policies" / "roles.yaml")
    shutil.copytree(REPO_ROOT / "clusters", tmp_path / "clusters", ignore=shutil.ignore_patterns("*.py", "__pycache__"))
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
    with pytest.raises(ConfigError, match=r"roles\.yaml:19: roles\.eval\.policies\[0\]: policy 'ml-keys-evals' does not exist \(did you mean 'ml-keys-eval'\?\)"):
        load_definitions(repo)


def test_fails_when_role_names_operator_policy(repo: Path) -> None:
    _edit_roles(repo, "policies: [ml-keys-eval]", "policies: [orchestrator]")
    with pytest.raises(ConfigError, match=r"roles\.eval\.policies\[0\]: 'orchestrator' is an operator policy"):
        load_definitions(repo)


def test_fails_when_token_ttl_over_one_hour(repo: Path) -> None:
    _edit_roles(repo, "token_ttl: 5m", "token_ttl: 2h")
    with pytest.raises(ConfigError, match=r"roles\.yaml:14: roles\.finetune\.token_ttl: 7200s is longer than 900s \(15m\); a token orphaned by a killed wrapper lives that long.*set token_ttl: 5m"):
        load_roles(_roles(repo))


def test_long_token_ttl_allowed_when_periodic(repo: Path) -> None:
    _edit_roles(repo, "token_ttl: 5m", "token_ttl: 2h\n    token_period: 10m")
    assert load_roles(_roles(repo))["finetune"].token_period_seconds == 600


def test_fails_when_token_period_over_one_hour(repo: Path) -> None:
    _edit_roles(repo, "token_ttl: 5m", "token_ttl: 5m\n    token_period: 3h")
    with pytest.raises(ConfigError, match=r"roles\.finetune\.token_period: 10800s is longer than 900s"):
        load_roles(_roles(repo))


def test_fails_when_secret_id_reusable(repo: Path) -> None:
    """Point 16: no reason, however long, unlocks a reusable secret_id any more."""
    _edit_roles(repo, "secret_id_num_uses: 1", "secret_id_num_uses: 0\n    reason: notebook sessions log in again after a kernel restart")
    with pytest.raises(ConfigError) as caught:
        load_roles(_roles(repo))
    text = str(caught.value)
    assert "roles.finetune.secret_id_num_uses: 0 is not allowed; allowed: 1" in text
    assert "roles.finetune.reason: unknown field" in text


def test_fails_when_secret_id_outlives_the_longest_wrap(repo: Path) -> None:
    """Point 4/16: a secret_id living 6 h while wraps live minutes only serves whoever unwrapped it."""
    _edit_roles(repo, "secret_id_ttl: 30m", "secret_id_ttl: 6h")
    with pytest.raises(ConfigError, match=r"roles\.yaml:16: roles\.finetune\.secret_id_ttl: 21600s is longer than the longest wrap \(1800s\).*set secret_id_ttl: 30m"):
        load_roles(_roles(repo))


def test_fails_when_max_ttl_below_ttl(repo: Path) -> None:
    _edit_roles(repo, "token_max_ttl: 4h", "token_max_ttl: 4m")
    with pytest.raises(ConfigError, match=r"roles\.eval\.token_max_ttl: 240s is shorter than token_ttl 300s; allowed: token_max_ttl >= token_ttl"):
        load_roles(_roles(repo))


def test_fails_when_duration_is_not_a_duration(repo: Path) -> None:
    _edit_roles(repo, "secret_id_ttl: 30m", "secret_id_ttl: six hours")
    with pytest.raises(ConfigError, match=r"roles\.finetune\.secret_id_ttl: 'six hours' is not a duration; use seconds \(1800\) or a string like '30m'"):
        load_roles(_roles(repo))


def test_fails_when_role_has_unknown_field(repo: Path) -> None:
    _edit_roles(repo, "token_ttl: 5m", "token_tll: 5m")
    with pytest.raises(ConfigError, match=r"roles\.finetune\.token_tll: unknown field \(did you mean 'token_ttl'\?\)"):
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


@pytest.mark.parametrize(("name", "old", "new"), [
    ("orchestrator", 'max_wrapping_ttl = "1800s"', 'max_wrapping_ttl = "6h"'),
    ("orchestrator", 'path "auth/approle/role/eval/secret-id"', 'path "auth/approle/role/+/secret-id"'),
    ("orchestrator", '  required_parameters = ["cidr_list", "num_uses", "token_bound_cidrs"]\n', ""),
    ("gpufleet-admin", 'path "sys/policies/acl/ml-keys-*"', 'path "sys/policies/acl/*"'),
    ("gpufleet-admin", '"secret_id_num_uses" = ["1"]', '"secret_id_num_uses" = []'),
])
def test_fails_when_an_operator_policy_is_hand_edited(repo: Path, name: str, old: str, new: str) -> None:
    """The operator policies are what Vault enforces against a stolen token: they are
    rendered from roles.yaml and clusters/, and any difference is refused."""
    path = repo / "vault_policies" / "policies" / f"{name}.hcl"
    _edit(path, old, new)
    problems = [str(p) for p in check(repo)]
    assert len(problems) == 1 and problems[0].startswith(f"{path}:")
    assert "differs from what roles.yaml and clusters/ render (hand-edited or stale); run `gpufleet vault render`" in problems[0]


def test_render_follows_roles_and_clusters(repo: Path) -> None:
    """A new cluster range reaches both operator policies through `gpufleet vault render`."""
    _edit(repo / "clusters" / "prod-nomad.yaml", "subnet_cidr: 10.50.0.0/20", "subnet_cidr: 10.51.0.0/20")
    assert "differs from what roles.yaml and clusters/ render" in _messages(repo)
    written = render(repo)
    assert sorted(p.name for p in written) == ["gpufleet-admin.hcl", "orchestrator.hcl"]
    assert check(repo) == []
    assert '"cidr_list" = ["10.128.0.0/14,10.51.0.0/20,10.64.0.0/14"]' in _orchestrator(repo).read_text()


def test_fails_when_role_names_an_unknown_cluster(repo: Path) -> None:
    _edit_roles(repo, "clusters: [prod-gke, prod-nomad, train-a3mega]", "clusters: [prod-nomda]")
    assert "roles.yaml:13: roles.finetune.clusters[0]: cluster 'prod-nomda' is not in clusters/ (did you mean 'prod-nomad'?)" in _messages(repo)


@pytest.mark.parametrize("name", ["default", "root", "team-x", "gpufleet-keys"])
def test_fails_when_policy_file_is_outside_gpufleets_namespace(repo: Path, name: str) -> None:
    """Point 3: default.hcl (every token's policy) or root.hcl or another team's name never passes check."""
    path = _policy(repo, name, 'path "secret/data/ml-api-keys/openai" {\n  capabilities = ["read"]\n  denied_parameters = {\n    "version" = []\n  }\n}\n')
    messages = _messages(repo)
    assert f"{path}: " in messages
    assert ("built-in policy" if name in ("default", "root") else "outside gpufleet's namespace") in messages
    with pytest.raises(ConfigError):
        load_definitions(repo)


def test_fails_when_job_policy_reads_old_versions(repo: Path) -> None:
    _policy(repo, "ml-keys-eval", 'path "secret/data/ml-api-keys/openai" {\n  capabilities = ["read"]\n}\n')
    assert "ml-keys-eval.hcl:1: path \"secret/data/ml-api-keys/openai\".denied_parameters: missing is not allowed; allowed: {\"version\" = []}" in _messages(repo)


def test_fails_when_policy_carries_managed_marker(repo: Path) -> None:
    _policy(repo, "ml-keys-eval", '# managed-by: gpufleet\npath "secret/data/ml-api-keys/openai" {\n  capabilities = ["read"]\n}\n')
    assert "ml-keys-eval.hcl:1: '# managed-by: gpufleet' is added by the sync; remove that line" in _messages(repo)


def test_fails_when_orchestrator_policy_missing(repo: Path) -> None:
    (repo / "vault_policies" / "policies" / "orchestrator.hcl").unlink()
    assert "orchestrator.hcl is missing; the dispatch flow needs it; run `gpufleet vault render`" in _messages(repo)


def test_fails_when_roles_file_is_not_yaml(repo: Path) -> None:
    _roles(repo).write_text("roles:\n  eval: [unclosed\n")
    with pytest.raises(ConfigError, match=r"roles\.yaml:\d+: invalid YAML"):
        load_roles(_roles(repo))


def test_fails_when_policy_file_has_unknown_block(repo: Path) -> None:
    path = _policy(repo, "ml-keys-eval", 'path "secret/data/ml-api-keys/openai" {\n  capabilities = ["read"]\n  denied_parameters = {\n    "version" = []\n  }\n}\n\nname "x" {\n  value = 1\n}\n')
    _, problems = parse_policy(path)
    assert [str(p) for p in problems] == [f"{path}:8: name: unknown top-level block 'name'; allowed: path; remove it"]


def test_every_problem_reported_in_one_pass(repo: Path) -> None:
    _edit_roles(repo, "token_ttl: 5m", "token_ttl: 2h")
    _edit_roles(repo, "policies: [ml-keys-eval]", "policies: [nope]")
    _policy(repo, "ml-keys-finetune", 'path "sys/mounts" {\n  capabilities = ["sudo"]\n}\n')
    assert len(check(repo)) >= 3


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ('path "secret/data/ml-api-keys/x/*" {\n  capabilities = ["create", "update", "sudo"]\n}\n', 'path "secret/data/ml-api-keys/x/*"'),
        ('path "secret/data/ml-api-keys/y/*" {\n  capabilities = ["read"]\n  capabilities = ["read"]\n}\n', "capabilities"),
    ],
)
def test_a_repeated_block_or_key_is_refused(tmp_path, body, field):
    """Red team: pyhcl keeps only the last of two blocks/keys, Vault merges both blocks, so a
    first copy granting write passed `gpufleet check` and reached the task tokens."""
    from vault_policies.policies import parse_policy

    good = 'path "secret/data/ml-api-keys/x/*" {\n  capabilities = ["read"]\n  denied_parameters = {\n    "version" = []\n  }\n}\n'
    file = tmp_path / "ml-keys-dup.hcl"
    file.write_text(body + good if "x/*" in body else body)
    policy, problems = parse_policy(file)
    assert policy is None
    assert any(field in p.field and "twice" in p.message for p in problems), problems
    file.write_text(good)
    assert parse_policy(file)[1] == []
