"""Bad policies and roles are refused by ``gpufleet check`` with file, line, field and fix."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
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
    assert set(definitions.roles) == {"finetune", "eval", "eval-dev"}
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


# -- issue 22: a role may not span dev and non-dev clusters; a job policy reads only its family's keys --

SPANNING = "    clusters: [prod-gke, prod-nomad]\n    token_ttl: 5m\n    token_max_ttl: 4h"


def _render(repo: Path) -> subprocess.CompletedProcess[str]:
    gpufleet = Path(sys.executable).parent / "gpufleet"
    return subprocess.run([str(gpufleet), "vault", "render", "--repo", str(repo)], capture_output=True, text=True, timeout=120)


def test_fails_when_a_role_spans_a_dev_and_prod_clusters(repo: Path) -> None:
    """The red team's finding: the eval role bound to dev-gke and the prod clusters was accepted, so any dev
    pod (sandbox tenant, everyone group) could log in as eval and read the prod OpenAI key. `gpufleet vault
    render` (and check, and the sync, through the same validation) now refuses it in one line."""
    _edit_roles(repo, SPANNING, SPANNING.replace("[prod-gke, prod-nomad]", "[prod-gke, prod-nomad, dev-gke]"))
    done = _render(repo)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr
    assert lines[0].startswith(f"error: {_roles(repo)}:")
    assert ("roles.eval.clusters: role 'eval' spans dev cluster(s) dev-gke and non-dev cluster(s) prod-gke (prod), prod-nomad (prod): "
            "every dev pod (the sandbox tenant, the everyone group) could log in as it and read its production keys") in lines[0]
    assert "add spans_dev_and_prod: {reason: <why, 10+ characters>}" in lines[0]
    with pytest.raises(ConfigError, match="spans dev cluster"):
        load_definitions(repo)  # the sync writes nothing


def test_a_reviewed_exception_lets_a_role_span_dev_and_prod(repo: Path) -> None:
    _edit_roles(repo, SPANNING, SPANNING.replace("[prod-gke, prod-nomad]", "[prod-gke, prod-nomad, dev-gke]")
                + "\n    spans_dev_and_prod: {reason: eval suite calibration runs on dev before each prod release}")
    render(repo)
    assert check(repo) == []
    assert load_definitions(repo).roles["eval"].spans_dev_and_prod_reason == "eval suite calibration runs on dev before each prod release"


@pytest.mark.parametrize(("clusters", "reason", "message"), [
    ("[prod-gke, prod-nomad, dev-gke]", "because", r"roles\.eval\.spans_dev_and_prod\.reason: 'because' is too short to review"),
    ("[prod-gke, prod-nomad]", "eval suite calibration runs", r"roles\.eval\.spans_dev_and_prod: role 'eval' does not span dev and non-dev "
                                                               r"clusters .*the exception matches nothing; remove spans_dev_and_prod"),
])
def test_fails_when_the_span_exception_is_unreviewable_or_matches_nothing(repo: Path, clusters: str, reason: str, message: str) -> None:
    _edit_roles(repo, SPANNING, SPANNING.replace("[prod-gke, prod-nomad]", clusters) + f"\n    spans_dev_and_prod: {{reason: {reason}}}")
    assert re.search(message, _messages(repo)), _messages(repo)


@pytest.mark.parametrize("path", ["secret/data/ml-api-keys/huggingface", "secret/data/ml-api-keys/*", "secret/data/ml-api-keys/+"])
def test_fails_when_a_job_policy_grants_another_familys_key_path(repo: Path, path: str) -> None:
    """ml-keys-eval reaching the fine-tune family's Hugging Face token (by name or by a glob) is its own refusal."""
    policy = repo / "vault_policies" / "policies" / "ml-keys-eval.hcl"
    policy.write_text(policy.read_text() + f'\npath "{path}" {{\n  capabilities = ["read"]\n  denied_parameters = {{\n    "version" = []\n  }}\n}}\n')
    messages = [str(p) for p in check(repo) if "a key path of family" in str(p) and str(p).startswith(f"{policy}:")]
    assert messages and all(f'path "{path}": grants' in m for m in messages), _messages(repo)
    assert any("'secret/data/ml-api-keys/huggingface', a key path of family 'finetune' (ml-keys-finetune.hcl:4)" in m
               and "give family 'eval' its own key (e.g. secret/data/ml-api-keys/huggingface-eval)" in m for m in messages)
    done = _render(repo)
    assert done.returncode == 2 and "a key path of family 'finetune'" in done.stderr


def test_a_key_path_two_families_name_is_refused_on_both_sides(repo: Path) -> None:
    _policy(repo, "ml-keys-judge", 'path "secret/data/ml-api-keys/openai" {\n  capabilities = ["read"]\n  denied_parameters = {\n'
                                   '    "version" = []\n  }\n}\n')
    found = sorted(p.file.rsplit("/", 1)[-1] for p in check(repo) if "a key path of family" in p.message)
    assert found == ["ml-keys-eval.hcl", "ml-keys-judge.hcl"]


def test_a_familys_own_sub_tree_glob_is_not_another_familys_path(repo: Path) -> None:
    _policy(repo, "ml-keys-judge", 'path "secret/data/ml-api-keys/judge/*" {\n  capabilities = ["read"]\n  denied_parameters = {\n'
                                   '    "version" = []\n  }\n}\n')
    assert [p for p in check(repo) if "a key path of family" in p.message] == []


def _read_block(path: str) -> str:
    return f'path "{path}" {{\n  capabilities = ["read"]\n  denied_parameters = {{\n    "version" = []\n  }}\n}}\n'


def test_fails_when_two_families_globs_share_a_path_neither_covering_the_other(repo: Path) -> None:
    """Issue 22 red team: eval's ``team/*`` and eval-dev's ``+/prod-token`` both grant ``team/prod-token``, and neither
    covers the other, so the cover check passed both. `gpufleet vault render` now refuses each side, naming a path both grant."""
    eval_policy = _policy(repo, "ml-keys-eval", _read_block("secret/data/ml-api-keys/openai") + _read_block("secret/data/ml-api-keys/team/*"))
    dev_policy = _policy(repo, "ml-keys-eval-dev", _read_block("secret/data/ml-api-keys/openai-dev")
                         + _read_block("secret/data/ml-api-keys/+/prod-token"))
    overlaps = sorted(str(p) for p in check(repo) if "overlaps" in p.message)
    assert overlaps == [
        f'{dev_policy}:7: path "secret/data/ml-api-keys/+/prod-token": overlaps \'secret/data/ml-api-keys/team/*\', a key path of family '
        "'eval' (ml-keys-eval.hcl:7): both grant 'secret/data/ml-api-keys/team/prod-token'; a job policy reads only its own family's "
        "keys; allowed: patterns that share no path with another ml-keys-* policy's; name family 'eval-dev''s keys one by one, or "
        "narrow the glob to a sub-tree of its own (e.g. secret/data/ml-api-keys/eval-dev/*)",
        f'{eval_policy}:7: path "secret/data/ml-api-keys/team/*": overlaps \'secret/data/ml-api-keys/+/prod-token\', a key path of '
        "family 'eval-dev' (ml-keys-eval-dev.hcl:7): both grant 'secret/data/ml-api-keys/team/prod-token'; a job policy reads only "
        "its own family's keys; allowed: patterns that share no path with another ml-keys-* policy's; name family 'eval''s keys one "
        "by one, or narrow the glob to a sub-tree of its own (e.g. secret/data/ml-api-keys/eval/*)",
    ]
    done = _render(repo)
    assert done.returncode == 2 and "both grant 'secret/data/ml-api-keys/team/prod-token'" in done.stderr


@pytest.mark.parametrize(("one", "other", "shared"), [
    ("team/*", "+/prod-token", "team/prod-token"),
    ("ab*", "a+/c", "ab/c"),
    ("+/x", "+/y", None),
    ("judge/*", "openai", None),
    ("+", "a/b", None),
    ("a/+", "a/", None),
])
def test_common_path_follows_vaults_wildcards(one: str, other: str, shared: str | None) -> None:
    """'+' is one segment (no '/'), a trailing '*' any suffix (the reading of ``path_pattern``)."""
    from vault_policies.policies import common_path, path_pattern

    prefix = "secret/data/ml-api-keys/"
    found = common_path(prefix + one, prefix + other)
    assert found == (None if shared is None else prefix + shared)
    if found is not None:
        assert path_pattern(prefix + one).fullmatch(found) and path_pattern(prefix + other).fullmatch(found)


def _dev_gke_task_cidrs(repo: Path) -> list[str]:
    from clusters.loader import load
    from vault_policies.roles import task_source_cidrs

    return list(task_source_cidrs(load(repo / "clusters" / "dev-gke.yaml")))


def test_fails_when_a_prod_role_is_bound_by_extra_cidrs_to_a_dev_clusters_task_addresses(repo: Path) -> None:
    """Issue 22 red team: eval lists only prod clusters but carries dev-gke's pod range as extra CIDRs, so every
    dev pod can log in as eval and read the prod key; the span check only looked at ``clusters``."""
    (cidr,) = _dev_gke_task_cidrs(repo)
    _edit_roles(repo, "  eval:\n    policies: [ml-keys-eval]\n",
                f"  eval:\n    policies: [ml-keys-eval]\n    secret_id_bound_cidrs: [{cidr}]\n    token_bound_cidrs: [{cidr}]\n")
    done = _render(repo)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert (f"roles.eval.clusters: role 'eval' spans dev cluster(s) dev-gke (bound by secret_id_bound_cidrs {cidr} overlaps its "
            f"task addresses {cidr}) and non-dev cluster(s) prod-gke (prod), prod-nomad (prod): every dev pod") in line


def test_fails_when_an_extra_cidr_overlaps_a_dev_clusters_task_addresses_partly(repo: Path) -> None:
    """A wider or narrower range than the pod range binds the cluster as well: overlap, not equality."""
    (cidr,) = _dev_gke_task_cidrs(repo)
    inside = str(next(__import__("ipaddress").ip_network(cidr).subnets(new_prefix=24)))
    _edit_roles(repo, "  eval:\n    policies: [ml-keys-eval]\n", f"  eval:\n    policies: [ml-keys-eval]\n    token_bound_cidrs: [{inside}]\n")
    assert f"dev-gke (bound by token_bound_cidrs {inside} overlaps its task addresses {cidr})" in _messages(repo)


def test_an_extra_cidr_outside_every_clusters_task_addresses_binds_no_cluster(repo: Path) -> None:
    """A Cloud NAT address (the documented reason for extra CIDRs) reaches no other environment."""
    _edit_roles(repo, "  eval:\n    policies: [ml-keys-eval]\n", "  eval:\n    policies: [ml-keys-eval]\n    token_bound_cidrs: [203.0.113.7/32]\n")
    render(repo)
    assert check(repo) == []


def _add_role(repo: Path, name: str, policies: str, clusters: str, extra: str = "") -> None:
    path = _roles(repo)
    path.write_text(path.read_text() + f"  {name}:\n    policies: {policies}\n    clusters: {clusters}\n    token_ttl: 5m\n"
                                       f"    token_max_ttl: 4h\n    secret_id_ttl: 30m\n    secret_id_num_uses: 1\n{extra}")


PROD_HOLDERS = "eval (prod-gke (prod), prod-nomad (prod))"


def test_fails_when_a_dev_only_role_holds_a_prod_roles_policy(repo: Path) -> None:
    """Issue 22 red team: no role spans dev and prod, yet a dev-only role holding ml-keys-eval gives every dev pod the
    prod eval key. `gpufleet vault render` refuses it on that role's policies entry."""
    _add_role(repo, "eval-sneaky", "[ml-keys-eval]", "[dev-gke]")
    done = _render(repo)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"error: {_roles(repo)}:") and "Traceback" not in done.stderr
    assert line.endswith(
        f"roles.eval-sneaky.policies[0]: role 'eval-sneaky' reaches dev cluster(s) dev-gke and holds 'ml-keys-eval', which non-dev "
        f"role(s) {PROD_HOLDERS} hold: every dev pod (the sandbox tenant, the everyone group) could read that policy's production "
        "keys; allowed: a job policy held by dev roles only or by non-dev roles only; give 'eval-sneaky' a policy of its own "
        "(ml-keys-eval-dev, with its own keys)")
    with pytest.raises(ConfigError, match="which non-dev role"):
        load_definitions(repo)


def test_fails_when_the_dev_role_adds_the_prod_policy(repo: Path) -> None:
    _edit_roles(repo, "policies: [ml-keys-eval-dev]", "policies: [ml-keys-eval-dev, ml-keys-eval]")
    assert (f"roles.eval-dev.policies[1]: role 'eval-dev' reaches dev cluster(s) dev-gke and holds 'ml-keys-eval', which non-dev "
            f"role(s) {PROD_HOLDERS} hold") in _messages(repo)


def test_a_reviewed_spanning_role_covers_only_its_own_dev_reach(repo: Path) -> None:
    """eval spanning with its reviewed exception may share ml-keys-eval with a prod-only role; a further,
    dev-only holder of that policy is refused all the same (the exception was reviewed for eval, not for it)."""
    _edit_roles(repo, SPANNING, SPANNING.replace("[prod-gke, prod-nomad]", "[prod-gke, prod-nomad, dev-gke]")
                + "\n    spans_dev_and_prod: {reason: eval suite calibration runs on dev before each prod release}")
    _add_role(repo, "eval-batch", "[ml-keys-eval]", "[prod-gke]")
    render(repo)
    assert check(repo) == []
    _add_role(repo, "eval-sneaky", "[ml-keys-eval]", "[dev-gke]")
    messages = [str(p) for p in check(repo) if "which non-dev role" in p.message]
    assert len(messages) == 1 and "roles.eval-sneaky.policies[0]" in messages[0]
    assert "non-dev role(s) eval (prod-gke (prod), prod-nomad (prod)), eval-batch (prod-gke (prod)) hold" in messages[0]
