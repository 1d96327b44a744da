"""checkov findings in gpufleet's words: the cluster file field that produced the resource, and the fix.

checkov names a rule id and a Terraform address; a newcomer needs the line of their cluster file to
change. The table holds only the rules that can fire on what gpufleet synthesizes from a cluster file
(every other setting checkov looks at is fixed by the constructs): each was planted as a mistake in a
fixture cluster file and seen failing under ``gpufleet check`` (tests/review/test_checkov_fixes.py).
A resource that fails several rules (``roles/owner`` fails CKV_GCP_117 and CKV_GCP_49) is one root
cause and gets one line naming every rule. Rule ids and titles: checkov's checks for the google
provider (``checkov/terraform/checks/resource/gcp``) at the pinned version.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from clusters import repo
from clusters.derive.addresses import grant_address, iam_role_key
from clusters.errors import ConfigError
from clusters.schema import ClusterConfig
from clusters.source import FieldPath, format_path, read_yaml
from safety.checkov_scan import Failure

OPEN_TO_ALL = "0.0.0.0/0"


@dataclass(frozen=True)
class Fix:
    """What to tell the user for one rule; ``{value}`` is the file's value at the located field."""

    title: str
    sentence: str


# The order is the order of preference when one resource fails several rules: the first names the cause.
FIXES: dict[str, Fix] = {
    "CKV_GCP_18": Fix("control plane open to the internet",
                      f"{{value}} lets the whole internet reach the control plane's public endpoint; allowed: your VPN or CI ranges"
                      f" (e.g. 198.51.100.0/24); remove the {OPEN_TO_ALL} entry, or reach the cluster over gke.dns_endpoint: true"
                      " with gke.private_endpoint: true"),
    "CKV_GCP_117": Fix("basic role at project level",
                       "{value} is a basic role (owner, editor or viewer: nearly every permission in the project); allowed: predefined"
                       " roles such as roles/storage.objectViewer; grant the narrowest predefined role that does the job"),
    "CKV_GCP_41": Fix("service-account impersonation at project level",
                      "{value} lets its member act as every service account in the project; allowed: roles that do not impersonate"
                      " (node and tenant pods reach their own account without it); remove it"),
    "CKV_GCP_49": Fix("manages or impersonates service accounts at project level",
                      "{value} can impersonate or manage the project's service accounts; allowed: roles without iam.serviceAccounts.*"
                      " permissions; remove it or pick a narrower predefined role"),
    "CKV_GCP_65": Fix("Kubernetes RBAC without Google Groups",
                      "RBAC names single users, not Google Groups; set gke.rbac_security_group: gke-security-groups@<your domain> and"
                      " list tenants' groups (group:team@<your domain>) nested in it"),
}


def _iam_fields(config: ClusterConfig) -> Iterator[tuple[str, FieldPath, str]]:
    """(Terraform address, field path, value) of every IAM member a cluster file declares (constructs_lib/iam.py,
    constructs_lib/tenant_identity.py name them)."""
    for i, role in enumerate(config.iam.node_roles if config.iam else ()):
        yield f"google_project_iam_member.node_role_{iam_role_key(role)}", ("iam", "node_roles", i), role
    for g, grant in enumerate(config.iam.grants if config.iam else ()):
        for member in grant.members:
            yield f"google_project_iam_member.{grant_address(grant.role, member)}", ("iam", "grants", g, "role"), grant.role
    for t, tenant in enumerate(config.tenants):
        key = tenant.name.replace("-", "_")
        for r, role in enumerate(tenant.service_account.roles if tenant.service_account else ()):
            yield f"google_project_iam_member.tenant_role_{key}_{iam_role_key(role)}", ("tenants", t, "service_account", "roles", r), role


def locate(config: ClusterConfig, check_id: str, resource: str) -> tuple[FieldPath, str] | None:
    """The field of ``config`` that produced ``resource`` for this rule, and its value; None when it is not one of ours."""
    if check_id == "CKV_GCP_18" and resource.startswith("google_container_cluster."):
        networks = config.gcp.master_authorized_networks
        index = next((i for i, n in enumerate(networks) if n.cidr == OPEN_TO_ALL), None)
        return (("gcp", "master_authorized_networks", index, "cidr"), OPEN_TO_ALL) if index is not None else None
    if check_id == "CKV_GCP_65" and resource.startswith("google_container_cluster."):
        return ("gke", "rbac_security_group"), ""
    return next(((path, value) for address, path, value in _iam_fields(config) if address == resource), None)


def _shown(path: Path) -> str:
    root = repo.root_or_none()
    absolute = path.absolute()
    return str(absolute.relative_to(root)) if root is not None and absolute.is_relative_to(root) else str(path)


def explain(failures: Iterable[Failure], configs: Iterable[ClusterConfig], clusters_dir: Path) -> tuple[list[str], list[Failure]]:
    """(one line per failing resource gpufleet can trace to a cluster file field, the failures it cannot)."""
    by_name = {config.name: config for config in configs}
    grouped: dict[tuple[str, str], list[Failure]] = {}
    unexplained: list[Failure] = []
    for failure in failures:
        config = by_name.get(failure.stack)
        if failure.check_id in FIXES and config is not None and locate(config, failure.check_id, failure.resource) is not None:
            grouped.setdefault((failure.stack, failure.resource), []).append(failure)
        else:
            unexplained.append(failure)
    lines = []
    for (stack, resource), found in sorted(grouped.items()):
        ids = sorted({f.check_id for f in found}, key=list(FIXES).index)
        path, value = locate(by_name[stack], ids[0], resource)  # type: ignore[misc]
        file = clusters_dir / f"{stack}.yaml"
        try:
            line = read_yaml(file).line_of(path)
        except ConfigError:
            line = None
        where = f"{_shown(file)}:{line}" if line else _shown(file)
        lines.append(f"{where}: {format_path(path)}: {FIXES[ids[0]].sentence.format(value=value)}"
                     f" (checkov {', '.join(ids)} on {resource})")
    return lines, unexplained
