"""The ``<cluster>-scheduler`` stack: what jobs and tenants see, on GKE (Kubernetes) or Nomad.

Separate from the infra stack because a provider must not be configured from resources the
same Terraform run creates. Everything it needs from the infra stack (endpoint, CA, server
address, tenant service accounts) is a cdktf cross-stack reference, which becomes an infra
output plus a ``terraform_remote_state`` read here. Credentials are never in the JSON nor in
state: the kubernetes provider runs ``gke-gcloud-auth-plugin`` for a short-lived token on each
run (a ``google_client_config`` data source would store its access token in state), the Nomad
token comes from ``NOMAD_TOKEN`` and the mTLS files from ``NOMAD_CACERT``, ``NOMAD_CLIENT_CERT`` and
``NOMAD_CLIENT_KEY`` in the environment (the nomad provider's defaults for ``ca_file``,
``cert_file`` and ``key_file``), never from the JSON.
"""

from __future__ import annotations

from cdktf import Fn, TerraformStack, TerraformVariable
from constructs import Construct

from clusters.derive.gpu_health import derive_gpu_health
from clusters.derive.gpudirect import derive_gpudirect_daemonsets
from clusters.derive.tenants import derive_tenants
from clusters.schema import ClusterConfig
from constructs_lib.k8s_controller_role import ControllerRole
from constructs_lib.k8s_priority_classes import PriorityClasses
from constructs_lib.gke_node_networks import GkeNodeNetworks
from constructs_lib.gpu_health import GpuHealth
from constructs_lib.gpudirect_runtime import GpuDirectRuntime
from constructs_lib.k8s_queue_policy import TenantQueuePolicy
from constructs_lib.k8s_tenancy import K8sTenant
from constructs_lib.kueue import KueueQueues
from constructs_lib.naming import pin
from constructs_lib.nomad_agent_config import HTTP_PORT
from constructs_lib.nomad_gpu_node import HEALTH_POLICY, HEALTH_RULES
from constructs_lib.nomad_tenancy import NomadTenancy
from constructs_lib.providers import kubernetes, nomad
from stacks.backends import configure_backend
from stacks.infra import ClusterStack
from stacks.layout import scheduler_stack_name

# Google's kubectl credential plugin: it mints a token from the caller's gcloud credentials per run.
AUTH_PLUGIN = "gke-gcloud-auth-plugin"
EXEC_API_VERSION = "client.authentication.k8s.io/v1beta1"


class GkeSchedulerStack(TerraformStack):
    """Namespaces, RBAC, GPU quotas, priority classes and Kueue queues of one GKE cluster."""

    def __init__(self, scope: Construct, config: ClusterConfig, infra: ClusterStack) -> None:
        name = scheduler_stack_name(config.name)
        super().__init__(scope, name)
        if infra.gke is None:
            raise ValueError(f"{config.name} is not a GKE cluster; build NomadSchedulerStack for it")
        configure_backend(self, config, name)
        cluster = infra.gke.cluster
        auth = [kubernetes.provider.KubernetesProviderExec(api_version=EXEC_API_VERSION, command=AUTH_PLUGIN)]
        if infra.control_plane.dns_endpoint:
            # The DNS endpoint is fronted by Google (IAM checks container.clusters.connect before
            # the API server sees the request) and serves a publicly trusted certificate, so no
            # cluster CA is pinned: `gcloud container clusters get-credentials --dns-endpoint`
            # writes none either. Reachable from CI and TFC without any IP allow-list.
            self.provider = kubernetes.provider.KubernetesProvider(self, "kubernetes", host=f"https://{infra.gke.dns_endpoint}", exec=auth)
        else:
            self.provider = kubernetes.provider.KubernetesProvider(
                self, "kubernetes",
                host=f"https://{cluster.endpoint}",
                cluster_ca_certificate=Fn.base64decode(cluster.master_auth.cluster_ca_certificate),
                exec=auth,
            )
        pools, tenants = infra.pool_specs, derive_tenants(config)
        self.controller_role = ControllerRole(self, "controller_role")
        self.priority_classes = PriorityClasses(self, "priority_classes")
        self.tenants = {
            t.name: K8sTenant(self, f"tenant_{t.name}", tenant=t, pools=pools, controller_role=self.controller_role.name,
                              gcp_service_account=(infra.tenant_identities[t.name].service_account.email
                                                   if t.name in infra.tenant_identities else None))
            for t in tenants
        }
        self.kueue = KueueQueues(self, "kueue", cluster=config.name, pools=pools, tenants=tenants,
                                 namespaces={n: k.namespace for n, k in self.tenants.items()})
        self.queue_policy = TenantQueuePolicy(self, "queue_policy")
        self.node_networks = GkeNodeNetworks(self, "node_networks", networks=infra.gpudirect.networks)
        self.gpudirect_runtime = GpuDirectRuntime(self, "gpudirect_runtime", daemonsets=derive_gpudirect_daemonsets(pools))
        health = derive_gpu_health(pools)
        self.gpu_health = GpuHealth(self, "gpu_health", spec=health) if health is not None else None


class NomadSchedulerStack(TerraformStack):
    """Node pools, tenant namespaces and tenant ACL policies of one Nomad cluster."""

    def __init__(self, scope: Construct, config: ClusterConfig, infra: ClusterStack) -> None:
        name = scheduler_stack_name(config.name)
        super().__init__(scope, name)
        if config.nomad is None:
            raise ValueError(f"{config.name} has no nomad: section; build GkeSchedulerStack for it")
        configure_backend(self, config, name)
        self.provider = nomad.provider.NomadProvider(self, "nomad", address=self._address(config, infra), region=config.nomad.region)
        self.tenancy = NomadTenancy(self, "tenancy", cluster=config.name, pools=infra.pool_specs, tenants=derive_tenants(config),
                                    provider=self.provider)
        # The GPU health checker's policy (node:write only); its token is made after the ACL bootstrap
        # and stored as the clients' gpu-health-token secret (docs/nomad.md, GPU telemetry and health).
        self.gpu_health_policy = pin(nomad.acl_policy.AclPolicy(
            self, "acl_gpu_health", name=HEALTH_POLICY, provider=self.provider,
            description="GPU health checker on every client: mark its own node ineligible and drain it on XID/ECC faults",
            rules_hcl=HEALTH_RULES), "nomad_acl_gpu_health")


    def _address(self, config: ClusterConfig, infra: ClusterStack) -> str:
        """The servers' internal load balancer, or for existing servers a variable (``TF_VAR_nomad_address``)
        defaulting to the first named server's HTTP API; an auto-join string names no host, so no default."""
        if infra.nomad_address is not None:
            return infra.nomad_address
        first = config.nomad.existing_servers[0] if config.nomad and config.nomad.existing_servers else ""
        default = None if not first or first.startswith("provider=") else f"https://{first.rsplit(':', 1)[0]}:{HTTP_PORT}"
        variable = TerraformVariable(self, "nomad_address", type="string", default=default,
                                     description="HTTPS API of the existing Nomad servers, e.g. https://10.0.0.2:4646")
        return variable.string_value
