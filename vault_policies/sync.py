"""Make Vault match the repo: mounts, policies and AppRole roles (``gpufleet vault diff|apply|prune``).

Ownership is explicit so that sharing a Vault with other teams is safe: every policy the
sync writes starts with the managed marker, and the names of the roles it wrote are kept
in one KV record (AppRole roles have no field to carry a marker). ``prune`` deletes only
objects carrying one of those marks and absent from the repo. ``apply`` compares before
writing, so a second run changes nothing.

Functions take an ``hvac.Client``; only the CLI reads ``VAULT_*`` from the environment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from clusters.errors import UserError
from vault_policies.layout import APPROLE_MOUNT, KV_MOUNT, MANAGED_MARKER, MANAGED_RECORD_PATH
from vault_policies.roles import RoleSpec
from vault_policies.validate import VaultDefinitions

if TYPE_CHECKING:
    import hvac

BUILTIN_POLICIES = frozenset({"root", "default"})
ROLE_FIELDS = ("bind_secret_id", "secret_id_bound_cidrs", "secret_id_num_uses", "secret_id_ttl", "token_max_ttl", "token_num_uses", "token_period", "token_policies", "token_ttl")


@dataclass(frozen=True)
class Change:
    """One line of the diff table. ``action`` is create, update, delete, unchanged, or skip
    (an operator policy this token may not touch)."""

    kind: str
    name: str
    action: str
    detail: str = ""


@dataclass(frozen=True)
class _State:
    approle_enabled: bool
    kv_version: str | None
    policies: dict[str, str]
    denied_policies: frozenset[str]
    roles: dict[str, dict[str, Any]]
    managed_roles: tuple[str, ...]


def role_params(role: RoleSpec) -> dict[str, Any]:
    """The AppRole fields gpufleet owns, as Vault reads them back (seconds, sorted lists)."""
    return {
        "bind_secret_id": True,
        "secret_id_bound_cidrs": sorted(role.secret_id_bound_cidrs),
        "secret_id_num_uses": role.secret_id_num_uses,
        "secret_id_ttl": role.secret_id_ttl_seconds,
        "token_max_ttl": role.token_max_ttl_seconds,
        "token_num_uses": 0,
        "token_period": role.token_period_seconds or 0,
        "token_policies": sorted(role.policies),
        "token_ttl": role.token_ttl_seconds,
    }


def _current_role(data: dict[str, Any]) -> dict[str, Any]:
    current = {key: data.get(key) for key in ROLE_FIELDS}
    current["secret_id_bound_cidrs"] = sorted(current["secret_id_bound_cidrs"] or [])
    current["token_policies"] = sorted(current["token_policies"] or [])
    return current


def _read_state(client: hvac.Client) -> _State:
    import hvac.exceptions

    auth = client.sys.list_auth_methods()["data"]
    mounts = client.sys.list_mounted_secrets_engines()["data"]
    kv = mounts.get(f"{KV_MOUNT}/")
    kv_version = None
    if kv is not None:
        kv_version = (kv.get("options") or {}).get("version", "1") if kv.get("type") == "kv" else kv.get("type")
    policies = {}
    denied = set()
    for name in client.sys.list_acl_policies()["data"]["keys"]:
        if name in BUILTIN_POLICIES:
            continue
        try:
            policies[name] = client.sys.read_acl_policy(name)["data"]["policy"]
        except hvac.exceptions.Forbidden:
            # gpufleet-admin denies itself the operator policies; only an operator token sees them.
            denied.add(name)
    approle_enabled = f"{APPROLE_MOUNT}/" in auth
    roles: dict[str, dict[str, Any]] = {}
    if approle_enabled:
        try:
            names = client.auth.approle.list_roles(mount_point=APPROLE_MOUNT)["data"]["keys"]
        except hvac.exceptions.InvalidPath:
            names = []
        roles = {name: _current_role(client.auth.approle.read_role(name, mount_point=APPROLE_MOUNT)["data"]) for name in names}
    managed: tuple[str, ...] = ()
    if kv_version == "2":
        try:
            record = client.secrets.kv.v2.read_secret_version(MANAGED_RECORD_PATH, mount_point=KV_MOUNT, raise_on_deleted_version=True)
            managed = tuple(sorted(record["data"]["data"].get("roles", [])))
        except hvac.exceptions.InvalidPath:
            managed = ()
    return _State(approle_enabled, kv_version, policies, frozenset(denied), roles, managed)


def _is_managed(text: str) -> bool:
    return text.startswith(MANAGED_MARKER)


def _role_detail(want: dict[str, Any], have: dict[str, Any]) -> str:
    return ", ".join(f"{key} {have[key]!r} -> {want[key]!r}" for key in sorted(want) if want[key] != have.get(key))


def _plan(state: _State, definitions: VaultDefinitions) -> list[Change]:
    if state.kv_version not in (None, "2"):
        raise UserError(f"mount {KV_MOUNT}/ exists as {state.kv_version!r}, not KV version 2; gpufleet reads keys with the KV v2 API; migrate it (bao kv enable-versioning {KV_MOUNT}/) or free the path")
    changes = [
        Change("auth", f"{APPROLE_MOUNT}/", "unchanged" if state.approle_enabled else "create", "approle auth method"),
        Change("mount", f"{KV_MOUNT}/", "unchanged" if state.kv_version else "create", "kv version 2"),
    ]
    for name, policy in sorted(definitions.policies.items()):
        have = state.policies.get(name)
        if name in state.denied_policies:
            changes.append(Change("policy", name, "skip", "this token may not read or write it (gpufleet-admin denies itself the operator policies); apply it with an operator token"))
        elif have is None:
            changes.append(Change("policy", name, "create", policy.file.name))
        elif have != policy.rendered():
            changes.append(Change("policy", name, "update", "text differs" + ("" if _is_managed(have) else "; takes over an unmanaged policy")))
        else:
            changes.append(Change("policy", name, "unchanged"))
    for name, role in sorted(definitions.roles.items()):
        want, have = role_params(role), state.roles.get(name)
        if have is None:
            changes.append(Change("role", name, "create", f"policies {', '.join(role.policies)}"))
        elif want != have:
            takeover = "" if name in state.managed_roles else "; takes over an unmanaged role"
            changes.append(Change("role", name, "update", _role_detail(want, have) + takeover))
        else:
            changes.append(Change("role", name, "unchanged"))
    record = tuple(sorted(set(state.managed_roles) | set(definitions.roles)))
    if record != state.managed_roles:
        changes.append(Change("record", MANAGED_RECORD_PATH, "update", f"managed roles: {', '.join(record)}"))
    return changes


def _prune_plan(state: _State, definitions: VaultDefinitions) -> list[Change]:
    changes = [
        Change("policy", name, "delete", "managed by gpufleet, not in the repo")
        for name, text in sorted(state.policies.items())
        if name not in definitions.policies and _is_managed(text)
    ]
    changes += [
        Change("role", name, "delete", "managed by gpufleet, not in the repo")
        for name in state.managed_roles
        if name not in definitions.roles and name in state.roles
    ]
    record = tuple(sorted(set(state.managed_roles) & set(definitions.roles)))
    if record != state.managed_roles:
        changes.append(Change("record", MANAGED_RECORD_PATH, "update", f"managed roles: {', '.join(record) or '(none)'}"))
    return changes


def diff(client: hvac.Client, definitions: VaultDefinitions) -> tuple[Change, ...]:
    """What ``apply`` would change, then what ``prune`` would delete; nothing is written."""
    state = _read_state(client)
    prunes = [c for c in _prune_plan(state, definitions) if c.kind != "record"]
    return tuple(_plan(state, definitions) + [Change(c.kind, c.name, "delete (prune)", c.detail) for c in prunes])


def _write_record(client: hvac.Client, roles: tuple[str, ...]) -> None:
    client.secrets.kv.v2.create_or_update_secret(MANAGED_RECORD_PATH, secret={"roles": list(roles)}, mount_point=KV_MOUNT)


def apply(client: hvac.Client, definitions: VaultDefinitions) -> tuple[Change, ...]:
    """Create or update what differs; returns the full plan (unchanged rows included)."""
    state = _read_state(client)
    changes = _plan(state, definitions)
    for change in changes:
        if change.action in ("unchanged", "skip"):
            continue
        if change.kind == "auth":
            client.sys.enable_auth_method("approle", path=APPROLE_MOUNT, description="gpufleet training tasks")
        elif change.kind == "mount":
            client.sys.enable_secrets_engine("kv", path=KV_MOUNT, options={"version": "2"}, description="gpufleet API keys")
        elif change.kind == "policy":
            client.sys.create_or_update_acl_policy(change.name, definitions.policies[change.name].rendered())
        elif change.kind == "role":
            client.auth.approle.create_or_update_approle(change.name, mount_point=APPROLE_MOUNT, **role_params(definitions.roles[change.name]))
        elif change.kind == "record":
            _write_record(client, tuple(sorted(set(state.managed_roles) | set(definitions.roles))))
    return tuple(changes)


def prune(client: hvac.Client, definitions: VaultDefinitions) -> tuple[Change, ...]:
    """Delete managed policies and roles that left the repo; never anything without our mark."""
    state = _read_state(client)
    changes = _prune_plan(state, definitions)
    for change in changes:
        if change.kind == "policy":
            client.sys.delete_acl_policy(change.name)
        elif change.kind == "role":
            client.auth.approle.delete_role(change.name, mount_point=APPROLE_MOUNT)
        elif change.kind == "record":
            _write_record(client, tuple(sorted(set(state.managed_roles) & set(definitions.roles))))
    return tuple(changes)
