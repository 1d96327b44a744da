"""``gpufleet check`` for the Vault layer: policies parse and stay in bounds, roles are sane
and name only policies that exist, and the fixed policies the flow depends on are present."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from clusters.errors import ConfigError, Problem
from clusters.source import did_you_mean
from vault_policies.layout import ADMIN_POLICY, ORCHESTRATOR_POLICY
from vault_policies.policies import ROLE_PATH, PolicyFile, load_policies, orchestrator_role
from vault_policies.roles import RoleSpec, load_roles_document

POLICIES_DIR = Path("vault_policies/policies")
ROLES_FILE = Path("vault_policies/roles.yaml")


@dataclass(frozen=True)
class VaultDefinitions:
    """Everything the sync writes, validated."""

    policies: dict[str, PolicyFile]
    roles: dict[str, RoleSpec]


def _collect(repo_root: Path) -> tuple[VaultDefinitions, list[Problem]]:
    policies, problems = load_policies(repo_root / POLICIES_DIR)
    for required in (ORCHESTRATOR_POLICY, ADMIN_POLICY):
        if required not in policies and not (repo_root / POLICIES_DIR / f"{required}.hcl").exists():
            problems.append(Problem(str(repo_root / POLICIES_DIR), None, "", f"{required}.hcl is missing; the dispatch flow needs it; restore it from git"))
    roles_path = repo_root / ROLES_FILE
    roles: dict[str, RoleSpec] = {}
    try:
        doc, roles = load_roles_document(roles_path)
    except ConfigError as exc:
        problems.extend(exc.problems)
        return VaultDefinitions(policies, roles), problems
    if ORCHESTRATOR_POLICY in policies:
        problems.extend(_orchestrator_roles(policies[ORCHESTRATOR_POLICY], roles))
    job_policies = sorted(set(policies) - {ORCHESTRATOR_POLICY, ADMIN_POLICY})
    for name, role in roles.items():
        for index, policy in enumerate(role.policies):
            if policy in (ORCHESTRATOR_POLICY, ADMIN_POLICY):
                problems.append(doc.problem(("roles", name, "policies", index), f"{policy!r} is an operator policy and must not reach training tasks; allowed: {', '.join(job_policies)}; name a job policy"))
            elif policy not in policies:
                problems.append(doc.problem(("roles", name, "policies", index), f"policy {policy!r} does not exist{did_you_mean(policy, job_policies)}; allowed: {', '.join(job_policies)}; add {POLICIES_DIR}/{policy}.hcl or fix the name"))
    return VaultDefinitions(policies, roles), problems


def _orchestrator_roles(policy: PolicyFile, roles: dict[str, RoleSpec]) -> list[Problem]:
    """The orchestrator may mint for exactly the repo's roles: one block pair per role."""
    problems = []
    named: dict[str, set[str]] = {}
    for rule in policy.rules:
        found = orchestrator_role(rule)
        if found is None or "+" in rule.path or "*" in rule.path:
            continue
        role, tail = found
        if role not in roles:
            problems.append(Problem(str(policy.file), rule.line, f'path "{rule.path}"', f"role {role!r} is not in {ROLES_FILE}{did_you_mean(role, roles)}; allowed: {', '.join(sorted(roles))}; the orchestrator may mint only for the repo's roles, so remove the block or add the role"))
        named.setdefault(role, set()).add(tail)
    for role in sorted(roles):
        for tail in ("secret-id", "role-id"):
            if tail not in named.get(role, set()):
                problems.append(Problem(str(policy.file), None, f'path "{ROLE_PATH}{role}/{tail}"', f"missing for role {role!r} of {ROLES_FILE}; dispatch could not mint for it; add the block (copy another role's {tail} block)"))
    return problems


def check(repo_root: Path) -> list[Problem]:
    """Every problem in the repo's Vault definitions; empty means the sync may write them."""
    return _collect(repo_root)[1]


def load_definitions(repo_root: Path) -> VaultDefinitions:
    """The validated definitions, or ConfigError listing every problem."""
    definitions, problems = _collect(repo_root)
    if problems:
        raise ConfigError(problems)
    return definitions
