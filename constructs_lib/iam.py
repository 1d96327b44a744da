"""Node identity and reviewed grants: least privilege by default, every extra grant has a reason."""

from __future__ import annotations

from constructs import Construct

from clusters.derive.addresses import grant_address, iam_role_key
from clusters.derive.nomad import node_account_id
from clusters.schema import ClusterConfig
from constructs_lib.naming import pin
from constructs_lib.providers import google

# What a GKE or Nomad GPU node needs to run and report; nothing that reaches workload data.
BASE_NODE_ROLES = (
    "roles/artifactregistry.reader",
    "roles/logging.logWriter",
    "roles/monitoring.metricWriter",
    "roles/monitoring.viewer",
    "roles/stackdriver.resourceMetadata.writer",
)


class NodeIdentity(Construct):
    """A dedicated node service account per cluster, so no node ever runs as the Compute default SA."""

    def __init__(self, scope: Construct, id_: str, *, config: ClusterConfig) -> None:
        super().__init__(scope, id_)
        project = config.gcp.project
        self.service_account = pin(google.service_account.ServiceAccount(
            self, "nodes", account_id=node_account_id(config.name), project=project,
            display_name=f"gpufleet {config.name} GPU nodes"), "node_sa")
        member = f"serviceAccount:{self.service_account.email}"
        roles = sorted(set(BASE_NODE_ROLES) | set(config.iam.node_roles))
        self.node_roles = {
            role: pin(google.project_iam_member.ProjectIamMember(self, f"node_{iam_role_key(role)}", project=project, role=role, member=member),
                      f"node_role_{iam_role_key(role)}")
            for role in roles
        }
        self.grants = {}
        for grant in sorted(config.iam.grants, key=lambda g: g.role):
            for m in sorted(grant.members):
                key = grant_address(grant.role, m)
                self.grants[(grant.role, m)] = pin(google.project_iam_member.ProjectIamMember(self, key, project=project, role=grant.role, member=m), key)
