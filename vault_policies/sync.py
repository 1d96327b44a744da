"""Make Vault match the repo: mounts, policies and AppRole roles (``gpufleet vault diff|apply|prune``).

Ownership is decided by names the repo states, never by a record the sync token could edit:
job policies are the ``ml-keys-`` names (every one the sync writes starts with the managed
marker), roles are those of roles.yaml, and prune deletes only marked ``ml-keys-`` policies
that left the repo and the roles listed under ``retired:``. Vault enforces the same bounds
(the generated gpufleet-admin policy), so a stolen sync token cannot do more than this code.

``diff`` also reports what the sync may not fix: drift of Vault's built-in ``default``
policy (attached to every token), operator policies that differ from the rendering, policies
in our namespace gpufleet did not write, and foreign roles that carry one of our policies.

Functions take an ``hvac.Client``; only the CLI reads ``VAULT_*`` from the environment.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clusters.errors import UserError
from vault_policies.layout import APPROLE_MOUNT, BUILTIN_POLICIES, JOB_POLICY_PREFIX, KV_MOUNT, MANAGED_MARKER, OPERATOR_POLICIES
from vault_policies.operator import cidr_string, role_params
from vault_policies.policies import structure_problems
from vault_policies.validate import VaultDefinitions

if TYPE_CHECKING:
    import hvac

BUILTIN_DEFAULT = Path(__file__).resolve().parent / "builtin_default.hcl"
OPERATOR_HINT = "only an operator (root) token may write it: run `gpufleet vault apply` with one"


@dataclass(frozen=True)
class Change:
    """One line of the diff table. ``action`` is create, update, delete, unchanged, skip (an
    operator policy this token may not write), or drift (found, not fixable by the sync)."""

    kind: str
    name: str
    action: str
    detail: str = ""


@dataclass(frozen=True)
class _State:
    approle_enabled: bool
    kv_version: str | None
    policies: dict[str, str | None]
    roles: dict[str, dict[str, Any]]


def _current_role(data: dict[str, Any]) -> dict[str, str]:
    """A role as Vault reads it back, in the string form of :func:`role_params`."""
    current = {}
    for key in _ROLE_FIELDS:
        value = data.get(key)
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif isinstance(value, list) and key.endswith("_cidrs"):
            value = cidr_string(str(v) for v in value)
        elif isinstance(value, list):
            value = ",".join(sorted(str(v) for v in value))
        elif value is None:
            value = ""
        current[key] = str(value)
    return current


_ROLE_FIELDS = ("bind_secret_id", "secret_id_bound_cidrs", "secret_id_num_uses", "secret_id_ttl", "token_bound_cidrs", "token_max_ttl", "token_num_uses", "token_period", "token_policies", "token_ttl", "token_type")


def _is_ours(name: str) -> bool:
    return name.startswith(JOB_POLICY_PREFIX) or name in OPERATOR_POLICIES or name == "default"


def _read_state(client: hvac.Client) -> _State:
    import hvac.exceptions

    auth = client.sys.list_auth_methods()["data"]
    mounts = client.sys.list_mounted_secrets_engines()["data"]
    kv = mounts.get(f"{KV_MOUNT}/")
    kv_version = None
    if kv is not None:
        kv_version = (kv.get("options") or {}).get("version", "1") if kv.get("type") == "kv" else kv.get("type")
    policies: dict[str, str | None] = {}
    for name in client.sys.list_acl_policies()["data"]["keys"]:
        if not _is_ours(name):
            continue
        try:
            policies[name] = client.sys.read_acl_policy(name)["data"]["policy"]
        except hvac.exceptions.Forbidden:
            policies[name] = None  # a token without gpufleet-admin's read grants
    roles: dict[str, dict[str, Any]] = {}
    if f"{APPROLE_MOUNT}/" in auth:
        try:
            names = client.auth.approle.list_roles(mount_point=APPROLE_MOUNT)["data"]["keys"]
        except hvac.exceptions.InvalidPath:
            names = []
        for name in names:
            try:
                roles[name] = client.auth.approle.read_role(name, mount_point=APPROLE_MOUNT)["data"]
            except hvac.exceptions.Forbidden:
                roles[name] = {}
    return _State(f"{APPROLE_MOUNT}/" in auth, kv_version, policies, roles)


def _policy_paths(text: str) -> dict[str, Any] | None:
    import hcl

    try:
        parsed = hcl.loads(text)
    except ValueError:
        return None
    return parsed.get("path") or {}


def _default_drift(text: str | None) -> Change:
    if text is None:
        return Change("policy", "default", "drift", "this token may not read the default policy; diff with a gpufleet-admin token")
    builtin = _policy_paths(BUILTIN_DEFAULT.read_text(encoding="utf-8")) or {}
    repeated = structure_problems(text)
    if repeated:
        line, field, _ = repeated[0]
        return Change("policy", "default", "drift", f"line {line}: {field} is repeated or not a plain path block; pyhcl would read only part of what Vault grants; an operator must restore vault_policies/builtin_default.hcl: bao policy write default vault_policies/builtin_default.hcl")
    live = _policy_paths(text)
    if live is None:
        return Change("policy", "default", "drift", "the live default policy does not parse; restore the built-in text (" + OPERATOR_HINT.split(":")[0] + ")")
    extra = sorted(path for path, body in live.items() if builtin.get(path) != body)
    if not extra:
        return Change("policy", "default", "unchanged", "built-in")
    return Change("policy", "default", "drift", f"grants beyond OpenBao's built-in default (every token has it): {', '.join(extra)}; an operator must restore vault_policies/builtin_default.hcl: bao policy write default vault_policies/builtin_default.hcl")


def _role_detail(want: dict[str, str], have: dict[str, str]) -> str:
    return ", ".join(f"{key} {have.get(key)!r} -> {want[key]!r}" for key in sorted(want) if want[key] != have.get(key))


def _plan(state: _State, definitions: VaultDefinitions) -> list[Change]:
    if state.kv_version not in (None, "2"):
        raise UserError(f"mount {KV_MOUNT}/ exists as {state.kv_version!r}, not KV version 2; gpufleet reads keys with the KV v2 API; migrate it (bao kv enable-versioning {KV_MOUNT}/) or free the path")
    for name in definitions.policies:
        if name in BUILTIN_POLICIES or not (name.startswith(JOB_POLICY_PREFIX) or name in OPERATOR_POLICIES):
            raise UserError(f"refusing to write policy {name!r}: outside gpufleet's namespace ({JOB_POLICY_PREFIX}*, {', '.join(OPERATOR_POLICIES)}); rename vault_policies/policies/{name}.hcl")
    changes = [
        Change("auth", f"{APPROLE_MOUNT}/", "unchanged" if state.approle_enabled else "create", "approle auth method"),
        Change("mount", f"{KV_MOUNT}/", "unchanged" if state.kv_version else "create", "kv version 2"),
    ]
    if "default" in state.policies:
        changes.append(_default_drift(state.policies["default"]))
    for name, policy in sorted(definitions.policies.items()):
        have = state.policies.get(name)
        if name in OPERATOR_POLICIES:
            if name in state.policies and have is None:
                changes.append(Change("policy", name, "skip", f"this token may not read it; {OPERATOR_HINT}"))
            elif have != policy.rendered():
                changes.append(Change("policy", name, "create" if name not in state.policies else "update", f"operator policy; {OPERATOR_HINT}"))
            else:
                changes.append(Change("policy", name, "unchanged"))
        elif name not in state.policies:
            changes.append(Change("policy", name, "create", policy.file.name))
        elif have != policy.rendered():
            changes.append(Change("policy", name, "update", "text differs" + ("" if have and have.startswith(MANAGED_MARKER) else "; takes over an unmanaged policy")))
        else:
            changes.append(Change("policy", name, "unchanged"))
    for name, role in sorted(definitions.roles.items()):
        want, data = role_params(role), state.roles.get(name)
        if data is None:
            changes.append(Change("role", name, "create", f"policies {', '.join(role.policies)}"))
            continue
        have = _current_role(data)
        changes.append(Change("role", name, "update", _role_detail(want, have)) if want != have else Change("role", name, "unchanged"))
    ours = set(definitions.job_policies)
    for name, data in sorted(state.roles.items()):
        carried = sorted(ours & set(data.get("token_policies") or []))
        if name not in definitions.roles and name not in definitions.retired and carried:
            changes.append(Change("role", name, "drift", f"not in roles.yaml but carries gpufleet's {', '.join(carried)} (it can read our keys); an operator must remove it or the policy from it"))
    for name, text in sorted(state.policies.items()):
        if name.startswith(JOB_POLICY_PREFIX) and name not in definitions.policies and text is not None and not text.startswith(MANAGED_MARKER):
            changes.append(Change("policy", name, "drift", f"in gpufleet's namespace ({JOB_POLICY_PREFIX}*) but not written by gpufleet; rename it or adopt it by adding vault_policies/policies/{name}.hcl"))
    return changes


def _prune_plan(state: _State, definitions: VaultDefinitions) -> list[Change]:
    changes = [
        Change("policy", name, "delete", "managed by gpufleet, not in the repo")
        for name, text in sorted(state.policies.items())
        if name.startswith(JOB_POLICY_PREFIX) and name not in definitions.policies and text is not None and text.startswith(MANAGED_MARKER)
    ]
    changes += [Change("role", name, "delete", "listed under retired: in roles.yaml") for name in definitions.retired if name in state.roles]
    return changes


def diff(client: hvac.Client, definitions: VaultDefinitions) -> tuple[Change, ...]:
    """What ``apply`` would change, drift it cannot fix, then what ``prune`` would delete."""
    state = _read_state(client)
    return tuple(_plan(state, definitions) + [Change(c.kind, c.name, "delete (prune)", c.detail) for c in _prune_plan(state, definitions)])


def apply(client: hvac.Client, definitions: VaultDefinitions) -> tuple[Change, ...]:
    """Create or update what differs; returns the full plan (unchanged rows included).

    Operator policies are written first (a root token bootstraps or changes roles in one
    run); a token that may not write them reports them as ``skip`` and goes on.
    """
    import hvac.exceptions

    state = _read_state(client)
    changes = _plan(state, definitions)
    first = sorted(range(len(changes)), key=lambda i: (changes[i].kind not in ("auth", "mount"), changes[i].name not in OPERATOR_POLICIES, i))
    for index in first:
        change = changes[index]
        if change.action in ("unchanged", "skip", "drift"):
            continue
        if change.kind == "auth":
            client.sys.enable_auth_method("approle", path=APPROLE_MOUNT, description="gpufleet training tasks")
        elif change.kind == "mount":
            client.sys.enable_secrets_engine("kv", path=KV_MOUNT, options={"version": "2"}, description="gpufleet API keys")
        elif change.kind == "policy":
            try:
                client.sys.create_or_update_acl_policy(change.name, definitions.policies[change.name].rendered())
            except hvac.exceptions.Forbidden:
                if change.name not in OPERATOR_POLICIES:
                    raise
                changes[index] = Change(change.kind, change.name, "skip", f"not written; {OPERATOR_HINT}")
            else:
                if change.name in OPERATOR_POLICIES:  # written: the diff's "needs a root token" hint no longer applies
                    changes[index] = Change(change.kind, change.name, change.action, "operator policy")
        elif change.kind == "role":
            client.write_data(f"auth/{APPROLE_MOUNT}/role/{change.name}", data=role_params(definitions.roles[change.name]))
    return tuple(changes)


def prune(client: hvac.Client, definitions: VaultDefinitions) -> tuple[Change, ...]:
    """Delete marked job policies that left the repo and the retired roles; nothing else."""
    state = _read_state(client)
    changes = _prune_plan(state, definitions)
    for change in changes:
        if change.kind == "policy":
            client.sys.delete_acl_policy(change.name)
        else:
            client.auth.approle.delete_role(change.name, mount_point=APPROLE_MOUNT)
    return tuple(changes)
