"""The ClusterRole a tenant's job controller gets, bound per namespace so it never reaches beyond it."""

from __future__ import annotations

from constructs import Construct

from constructs_lib.naming import pin
from constructs_lib.providers import kubernetes

CONTROLLER_ROLE = "gpufleet-tenant-controller"
# (api group, resources, verbs): submit and watch Jobs, read what Kueue and the pods report.
CONTROLLER_RULES: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("batch", ("jobs",), ("create", "delete", "get", "list", "patch", "watch")),
    ("", ("events", "pods", "pods/log"), ("get", "list", "watch")),
    ("kueue.x-k8s.io", ("localqueues", "workloads"), ("get", "list", "watch")),
)


class ControllerRole(Construct):
    """A ClusterRole only so one definition serves every tenant; only RoleBindings reference it.

    No secrets, no RBAC objects, no cluster-scoped resources: a leaked controller token can
    start and stop Jobs in one namespace, and nothing else.
    """

    def __init__(self, scope: Construct, id_: str) -> None:
        super().__init__(scope, id_)
        cr = kubernetes.cluster_role_v1
        self.role = pin(cr.ClusterRoleV1(
            self, "role", metadata={"name": CONTROLLER_ROLE, "labels": {"app.kubernetes.io/managed-by": "gpufleet"}},
            rule=[cr.ClusterRoleV1Rule(api_groups=[group], resources=list(resources), verbs=list(verbs))
                  for group, resources, verbs in CONTROLLER_RULES],
        ), "cluster_role_tenant_controller")
        self.name = CONTROLLER_ROLE
