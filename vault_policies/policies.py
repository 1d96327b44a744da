"""Vault ACL policies as files (``vault_policies/policies/<name>.hcl``): parsing and path rules.

Three kinds, told apart by name: the orchestrator policy (mint wrapped secret_ids, read
role_ids), the admin policy (what the sync needs), and job-family policies, which may only
read API keys under ``secret/data/ml-api-keys/``. A job policy that could write or read
elsewhere is refused here, before any token carries it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from clusters.errors import Problem
from vault_policies.layout import (
    ADMIN_POLICY,
    API_KEYS_POLICY_PREFIX,
    APPROLE_MOUNT,
    KV_MOUNT,
    MANAGED_MARKER,
    MANAGED_RECORD_PATH,
    MAX_WRAP_TTL_SECONDS,
    MIN_WRAP_TTL_SECONDS,
    ORCHESTRATOR_POLICY,
)

POLICY_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
VAULT_CAPABILITIES = frozenset({"create", "read", "update", "patch", "delete", "list", "sudo", "deny"})
BLOCK_FIELDS = frozenset({"capabilities", "min_wrapping_ttl", "max_wrapping_ttl", "required_parameters", "allowed_parameters", "denied_parameters"})
ROLE_PATH = f"auth/{APPROLE_MOUNT}/role/"
ADMIN_PREFIXES = ("sys/auth", "sys/mounts", "sys/policies/acl", f"auth/{APPROLE_MOUNT}/role", f"{KV_MOUNT}/data/{MANAGED_RECORD_PATH}")
_HCL_LINE = re.compile(r"Line (\d+)")


@dataclass(frozen=True)
class PolicyRule:
    path: str
    capabilities: tuple[str, ...]
    min_wrapping_ttl: str | None
    max_wrapping_ttl: str | None
    line: int | None


@dataclass(frozen=True)
class PolicyFile:
    name: str
    file: Path
    text: str
    rules: tuple[PolicyRule, ...]

    def rendered(self) -> str:
        """The text the sync writes: the managed marker first, so prune can recognise it."""
        return f"{MANAGED_MARKER} (vault_policies/policies/{self.file.name})\n{self.text}"


def line_of_text(text: str, needle: str) -> int | None:
    for number, line in enumerate(text.splitlines(), start=1):
        if needle in line:
            return number
    return None


def parse_policy(file: Path) -> tuple[PolicyFile | None, list[Problem]]:
    """One policy file; problems instead of exceptions so every file is reported in one pass."""
    import hcl

    where = str(file)
    name = file.stem
    problems: list[Problem] = []
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        return None, [Problem(where, None, "", f"cannot read file: {exc.strerror}")]
    if not POLICY_NAME.match(name):
        problems.append(Problem(where, None, "", f"policy name {name!r} is not allowed; rename the file to lowercase letters, digits, '-' or '_' + .hcl"))
    if MANAGED_MARKER in text:
        problems.append(Problem(where, line_of_text(text, MANAGED_MARKER), "", f"{MANAGED_MARKER!r} is added by the sync; remove that line from the file"))
    try:
        parsed = hcl.loads(text)
    except ValueError as exc:
        found = _HCL_LINE.search(str(exc))
        return None, [*problems, Problem(where, int(found.group(1)) if found else None, "", f"invalid HCL: {exc}; fix the syntax (blocks look like: path \"secret/data/...\" {{ capabilities = [\"read\"] }})")]
    unknown = sorted(set(parsed) - {"path"})
    for key in unknown:
        problems.append(Problem(where, line_of_text(text, key), key, f"unknown top-level block {key!r}; allowed: path; remove it"))
    blocks = parsed.get("path", {})
    if not isinstance(blocks, dict) or not blocks:
        problems.append(Problem(where, 1, "path", "the policy grants nothing; add at least one path \"...\" { capabilities = [...] } block"))
        return None, problems
    rules = []
    for path, body in blocks.items():
        line = line_of_text(text, f'"{path}"')
        field = f'path "{path}"'
        if not isinstance(body, dict):
            problems.append(Problem(where, line, field, "must be a block; write path \"...\" { capabilities = [...] }"))
            continue
        for key in sorted(set(body) - BLOCK_FIELDS):
            problems.append(Problem(where, line, f"{field}.{key}", f"unknown field {key!r}; allowed: {', '.join(sorted(BLOCK_FIELDS))}; remove it"))
        caps = body.get("capabilities")
        if not isinstance(caps, list) or not caps or not all(isinstance(c, str) for c in caps):
            problems.append(Problem(where, line, f"{field}.capabilities", f"{caps!r} is not a list of capabilities; write capabilities = [\"read\"]"))
            continue
        for cap in caps:
            if cap not in VAULT_CAPABILITIES:
                problems.append(Problem(where, line, f"{field}.capabilities", f"{cap!r} is not a Vault capability; allowed: {', '.join(sorted(VAULT_CAPABILITIES))}"))
        rules.append(PolicyRule(path, tuple(caps), body.get("min_wrapping_ttl"), body.get("max_wrapping_ttl"), line))
    policy = PolicyFile(name, file, text, tuple(rules))
    problems.extend(_kind_problems(policy))
    return policy, problems


def _kind_problems(policy: PolicyFile) -> list[Problem]:
    if policy.name == ORCHESTRATOR_POLICY:
        return [p for rule in policy.rules for p in _orchestrator_rule(policy, rule)]
    if policy.name == ADMIN_POLICY:
        return [p for rule in policy.rules for p in _admin_rule(policy, rule)] + _admin_denies(policy)
    return [p for rule in policy.rules for p in _job_rule(policy, rule)]


def _problem(policy: PolicyFile, rule: PolicyRule, suffix: str, message: str) -> Problem:
    return Problem(str(policy.file), rule.line, f'path "{rule.path}"{suffix}', message)


def _job_rule(policy: PolicyFile, rule: PolicyRule) -> list[Problem]:
    problems = []
    if not rule.path.startswith(API_KEYS_POLICY_PREFIX) or rule.path == API_KEYS_POLICY_PREFIX:
        hint = f" (KV v2 reads need the data/ segment: {KV_MOUNT}/data/{rule.path.removeprefix(f'{KV_MOUNT}/')})" if rule.path.startswith(f"{KV_MOUNT}/") and not rule.path.startswith(f"{KV_MOUNT}/data/") else ""
        problems.append(_problem(policy, rule, "", f"{rule.path!r} is outside {API_KEYS_POLICY_PREFIX}; job policies may only read API keys under {API_KEYS_POLICY_PREFIX}<name>{hint}; move the path there"))
    extra = sorted(set(rule.capabilities) - {"read"})
    if extra:
        problems.append(_problem(policy, rule, ".capabilities", f"{extra} not allowed in a job policy; allowed: [\"read\"]; job tokens are read-only, so set capabilities = [\"read\"]"))
    if rule.min_wrapping_ttl or rule.max_wrapping_ttl:
        problems.append(_problem(policy, rule, "", "wrapping TTLs belong to the orchestrator policy; remove min_wrapping_ttl/max_wrapping_ttl"))
    return problems


def _orchestrator_rule(policy: PolicyFile, rule: PolicyRule) -> list[Problem]:
    from vault_policies.roles import parse_duration

    if rule.path.startswith(ROLE_PATH) and ("+" in rule.path or "*" in rule.path):
        return [_problem(policy, rule, "", f"{rule.path!r} uses a wildcard, which covers every AppRole role on the mount, other teams' included; allowed: {ROLE_PATH}<role>/secret-id and {ROLE_PATH}<role>/role-id per role in roles.yaml; name each role")]
    tail = rule.path.removeprefix(ROLE_PATH).partition("/")[2] if rule.path.startswith(ROLE_PATH) else None
    if tail == "role-id":
        if set(rule.capabilities) != {"read"}:
            return [_problem(policy, rule, ".capabilities", f"{list(rule.capabilities)} not allowed; allowed: [\"read\"]; role_ids are only read")]
        return []
    if tail != "secret-id":
        return [_problem(policy, rule, "", f"{rule.path!r} not allowed for the orchestrator; allowed: {ROLE_PATH}<role>/secret-id and {ROLE_PATH}<role>/role-id; remove the block")]
    problems = []
    if set(rule.capabilities) != {"update"}:
        problems.append(_problem(policy, rule, ".capabilities", f"{list(rule.capabilities)} not allowed; allowed: [\"update\"]; generating a secret_id is an update"))
    for field, want in (("min_wrapping_ttl", MIN_WRAP_TTL_SECONDS), ("max_wrapping_ttl", MAX_WRAP_TTL_SECONDS)):
        value = getattr(rule, field)
        try:
            seconds = parse_duration(value) if value is not None else None
        except ValueError:
            seconds = None
        if seconds != want:
            problems.append(_problem(policy, rule, f".{field}", f"{value!r} does not match layout.py ({want}s); set {field} = \"{want}s\" so Vault refuses unwrapped or out-of-bounds secret_ids"))
    return problems


def _admin_rule(policy: PolicyFile, rule: PolicyRule) -> list[Problem]:
    if rule.path.endswith(("/secret-id", "/secret-id/*", "/*")) and rule.path.startswith(f"auth/{APPROLE_MOUNT}/"):
        return [_problem(policy, rule, "", f"{rule.path!r} would let the sync mint secret_ids; allowed: {ROLE_PATH}+ (role definitions only); narrow the path")]
    if not rule.path.startswith(ADMIN_PREFIXES):
        return [_problem(policy, rule, "", f"{rule.path!r} is outside what the sync manages; allowed prefixes: {', '.join(ADMIN_PREFIXES)}; remove the block")]
    return []


def orchestrator_role(rule: PolicyRule) -> tuple[str, str] | None:
    """(role, "secret-id" | "role-id") for an orchestrator block naming one role, else None."""
    role, _, tail = rule.path.removeprefix(ROLE_PATH).partition("/")
    if not rule.path.startswith(ROLE_PATH) or tail not in ("secret-id", "role-id") or not role:
        return None
    return role, tail


def _admin_denies(policy: PolicyFile) -> list[Problem]:
    """The admin policy must deny itself the operator policies, or it could make itself root."""
    problems = []
    for name in (ADMIN_POLICY, ORCHESTRATOR_POLICY):
        path = f"sys/policies/acl/{name}"
        rule = next((r for r in policy.rules if r.path == path), None)
        if rule is None or rule.capabilities != ("deny",):
            line = rule.line if rule is not None else None
            problems.append(Problem(str(policy.file), line, f'path "{path}"', f"{list(rule.capabilities) if rule else 'no block'} is not allowed; allowed: [\"deny\"]; without it the admin token can rewrite {name} and so become root; add path \"{path}\" {{ capabilities = [\"deny\"] }}"))
    return problems


def load_policies(directory: Path) -> tuple[dict[str, PolicyFile], list[Problem]]:
    """Every ``*.hcl`` in the directory by name (sorted), plus every problem found."""
    policies: dict[str, PolicyFile] = {}
    problems: list[Problem] = []
    for file in sorted(directory.glob("*.hcl")):
        policy, found = parse_policy(file)
        problems.extend(found)
        if policy is not None:
            policies[policy.name] = policy
    return policies, problems
