"""The infrastructure stack of one cluster: network, IAM, compute, static IPs."""

from __future__ import annotations

from cdktf import TerraformOutput, TerraformStack
from constructs import Construct

from clusters.derive import derive_gpu_pools
from clusters.schema import ClusterConfig, SchedulerKind
from constructs_lib.gke_cluster import GkeCluster
from constructs_lib.gpu_node_pool import GpuNodePool
from constructs_lib.iam import NodeIdentity
from constructs_lib.naming import pin
from constructs_lib.network import GpuNetwork
from constructs_lib.providers import google
from constructs_lib.static_ips import StaticIps
from stacks.backends import configure_backend


class ClusterStack(TerraformStack):
    """Named after the cluster; provider credentials come from the environment, never from here."""

    def __init__(self, scope: Construct, config: ClusterConfig) -> None:
        super().__init__(scope, config.name)
        self.config = config
        configure_backend(self, config, config.name)
        google.provider.GoogleProvider(self, "google", project=config.gcp.project, region=config.gcp.region,
                              default_labels={"managed-by": "gpufleet", "gpufleet-cluster": config.name})
        self.network = GpuNetwork(self, "network", config=config)
        self.identity = NodeIdentity(self, "iam", config=config)
        self.static_ips = StaticIps(self, "static_ips", config=config)
        self.pool_specs = derive_gpu_pools(config)
        node_sa = self.identity.service_account.email
        self.gke: GkeCluster | None = None
        self.node_pools: dict[str, GpuNodePool] = {}
        if config.scheduler == SchedulerKind.GKE:
            self.gke = GkeCluster(self, "gke", config=config, network=self.network, node_service_account=node_sa)
            for spec in self.pool_specs:
                self.node_pools[spec.name] = GpuNodePool(self, f"pool_{spec.name}", spec=spec, cluster_id=self.gke.cluster.id,
                                                         region=config.gcp.region, node_service_account=node_sa)
        self._outputs()

    def _outputs(self) -> None:
        """What the scheduler stack and operators need; nothing here is a secret."""
        self._output("network", self.network.vpc.name)
        self._output("subnetwork", self.network.subnet.name)
        self._output("gpu_pools", sorted(s.name for s in self.pool_specs))
        self._output("node_service_account", self.identity.service_account.email)
        for name, address in self.static_ips.addresses.items():
            self._output(f"static_ip_{name}", address.address)
        if self.gke is not None:
            self._output("cluster_endpoint", self.gke.cluster.endpoint)
            self._output("cluster_ca_certificate", self.gke.cluster.master_auth.cluster_ca_certificate)

    def _output(self, name: str, value: object) -> TerraformOutput:
        output = TerraformOutput(self, f"output_{name}", value=value)
        return pin(output, name)
