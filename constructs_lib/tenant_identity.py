"""GCP identities of tenants, bound to their Kubernetes service account through workload identity."""

from __future__ import annotations

from constructs import Construct

from clusters.derive.addresses import iam_role_key
from clusters.derive.tenants import WORKLOAD_KSA, TenantSpec
from constructs_lib.naming import pin
from constructs_lib.providers import google


def workload_member(project: str, namespace: str, ksa: str = WORKLOAD_KSA) -> str:
    return f"serviceAccount:{project}.svc.id.goog[{namespace}/{ksa}]"


class TenantIdentity(Construct):
    """Only the tenant's ``training`` KSA in its own namespace may act as the tenant's GCP account.

    No key is ever created: pods get short-lived tokens from the GKE metadata server.
    """

    def __init__(self, scope: Construct, id_: str, *, tenant: TenantSpec, project: str, cluster: str) -> None:
        super().__init__(scope, id_)
        if tenant.gcp_account_id is None:
            raise ValueError(f"tenant {tenant.name} has no service_account; only build TenantIdentity for tenants with one")
        key = tenant.name.replace("-", "_")
        self.service_account = pin(google.service_account.ServiceAccount(
            self, "sa", account_id=tenant.gcp_account_id, project=project,
            display_name=f"gpufleet {cluster} tenant {tenant.name}"), f"tenant_sa_{key}")
        self.workload_identity = pin(google.service_account_iam_member.ServiceAccountIamMember(
            self, "wi", service_account_id=self.service_account.name, role="roles/iam.workloadIdentityUser",
            member=workload_member(project, tenant.namespace)), f"tenant_wi_{key}")
        member = f"serviceAccount:{self.service_account.email}"
        self.roles = {
            role: pin(google.project_iam_member.ProjectIamMember(self, f"role_{iam_role_key(role)}", project=project, role=role, member=member),
                      f"tenant_role_{key}_{iam_role_key(role)}")
            for role in tenant.gcp_roles
        }
