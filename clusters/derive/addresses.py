"""Stable names and addresses other systems key on: TFC workspaces, DNS records, IAM grants.

Pure derivations from a validated ClusterConfig; tests call them directly, constructs only read the
specs. Nothing here knows cdktf.
"""

from __future__ import annotations

import re

from clusters.schema import ClusterConfig

def tfc_workspace(config: ClusterConfig, stack: str) -> str:
    """Workspace per stack: the file's explicit name for the infra stack, else derived from the stack name."""
    state = config.state
    explicit = getattr(state, "workspace", None)
    if explicit and stack == config.name:
        return explicit
    suffix = stack.removeprefix(config.name)
    return f"{explicit}{suffix}" if explicit else f"gpufleet-{stack}"


def dns_record_address(name: str) -> str:
    """Terraform address of a DNS record: '@' and '*' spelled out, '.' and '-' become '_' as in every address.

    Pure, so the cross-checks can refuse two names that would collapse into one address.
    """
    return "dns_" + re.sub(r"[.-]", "_", name.replace("@", "apex").replace("*", "wildcard"))


def iam_role_key(role: str) -> str:
    """``roles/container.developer`` -> ``container_developer``: the role part of IAM addresses."""
    return role.rsplit("/", 1)[-1].replace(".", "_")


def grant_address(role: str, member: str) -> str:
    """Address of one reviewed grant, from the whole member: 'ml@a.example.com' and 'ml@b.example.com' stay two grants."""
    return f"grant_{iam_role_key(role)}_{re.sub(r'[^a-z0-9_]', '_', member.lower())}"
