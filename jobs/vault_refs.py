"""What a job's Vault role may read, from the reviewed role and policy files.

A job that names a key its role cannot read would dispatch fine and then fail inside the
task after waiting for a GPU; checking the policy paths here moves that failure to review.
This is the one module that reads ``vault_policies`` files, so a change there is one edit here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from clusters import repo
from vault_policies.layout import KV_MOUNT
from vault_policies.policies import PolicyFile, load_policies, path_pattern
from vault_policies.roles import RoleSpec, load_roles

ROLES_FILE = Path("vault_policies/roles.yaml")
POLICIES_DIR = Path("vault_policies/policies")
_KV_DATA = f"{KV_MOUNT}/data/"


@dataclass(frozen=True)
class VaultView:
    roles: dict[str, RoleSpec]
    policies: dict[str, PolicyFile]


def load_vault_view(roles_file: Path | None = None, policies_dir: Path | None = None) -> VaultView:
    """Roles (a broken roles file raises ConfigError) and the policies that parse.

    Policy problems are ``gpufleet check``'s to report; a policy that does not parse simply
    grants nothing here, so a job naming its paths is refused too.
    """
    root = repo.root() if roles_file is None or policies_dir is None else None
    policies, _ = load_policies(policies_dir or root / POLICIES_DIR)
    return VaultView(load_roles(roles_file or root / ROLES_FILE), policies)


def readable_paths(role: RoleSpec, view: VaultView) -> dict[str, re.Pattern[str]]:
    """KV paths (relative to the mount, as jobs write them) the role's policies may read."""
    out: dict[str, re.Pattern[str]] = {}
    for name in role.policies:
        policy = view.policies.get(name)
        for rule in policy.rules if policy else ():
            if rule.path.startswith(_KV_DATA) and "read" in rule.capabilities and "deny" not in rule.capabilities:
                relative = rule.path.removeprefix(_KV_DATA)
                out[relative] = path_pattern(relative)
    return out
