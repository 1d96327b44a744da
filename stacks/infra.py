"""The infrastructure stack of one cluster: network, IAM, compute (GKE or Nomad VMs), static IPs, DNS."""

from __future__ import annotations

from cdktf import TerraformOutput, TerraformStack
from constructs import Construct

from clusters.derive.checkpoints import derive_checkpoint_bucket
from clusters.derive.gke import derive_control_plane, derive_system_pool
from clusters.derive.gpudirect import derive_gpudirect
from clusters.derive.nomad import NomadRole, derive_nomad_pki, derive_nomad_secrets, derive_nomad_servers, nomad_secrets_for
from clusters.derive.pools import derive_gpu_pools
from clusters.derive.tenants import derive_tenants
from clusters.schema import ClusterConfig, Environment, NomadConfig, SchedulerKind
from constructs_lib.checkpoint_bucket import CheckpointBucket
from constructs_lib.dns_records import DnsRecords
from constructs_lib.gke_cluster import GkeCluster
from constructs_lib.gpu_node_pool import GpuNodePool
from constructs_lib.gpudirect_networks import GpuDirectNetworks
from constructs_lib.iam import NodeIdentity
from constructs_lib.naming import pin
from constructs_lib.network import GpuNetwork
from constructs_lib.nomad_agent_config import AgentJoin
from constructs_lib.nomad_cert_renewal import render_env, render_renewal_boot
from constructs_lib.nomad_client_pool import NomadClientPool, client_tag
from constructs_lib.nomad_firewall import NomadFirewall
from constructs_lib.nomad_private_dns import NomadPrivateDns
from constructs_lib.nomad_secrets import NomadSecrets
from constructs_lib.nomad_servers import NomadServers, server_tag
from constructs_lib.providers import google
from constructs_lib.static_ips import StaticIps
from constructs_lib.system_node_pool import SystemNodePool
from constructs_lib.tenant_identity import TenantIdentity
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
        self.tenant_identities: dict[str, TenantIdentity] = {}
        self.node_pools: dict[str, GpuNodePool] = {}
        self.system_pool: SystemNodePool | None = None
        self.gpudirect = derive_gpudirect(config)
        if config.scheduler == SchedulerKind.GKE:
            self.control_plane = derive_control_plane(config)
            self.gke = GkeCluster(self, "gke", config=config, control_plane=self.control_plane, network=self.network,
                                  node_service_account=node_sa)
            cost_labels = {"gpufleet-cluster": config.name, "environment": config.environment.value}
            self.system_pool = SystemNodePool(self, "system_pool", spec=derive_system_pool(config), cluster_id=self.gke.cluster.id,
                                              location=self.control_plane.location, node_service_account=node_sa, resource_labels=cost_labels)
            gpudirect = GpuDirectNetworks(self, "gpudirect", spec=self.gpudirect, cluster=config.name, project=config.gcp.project,
                                          region=config.gcp.region, source_range=config.gcp.gpudirect_cidr) if self.gpudirect.networks else None
            for spec in self.pool_specs:
                nics = tuple((gpudirect.networks[n.key].name, gpudirect.subnets[n.key].name)
                             for n in self.gpudirect.for_pool(spec.name)) if gpudirect else ()
                self.node_pools[spec.name] = GpuNodePool(self, f"pool_{spec.name}", spec=spec, cluster_id=self.gke.cluster.id,
                                                         location=self.control_plane.location, node_service_account=node_sa,
                                                         resource_labels=cost_labels, node_networks=nics)
            self.tenant_identities = {
                t.name: TenantIdentity(self, f"tenant_{t.name}", tenant=t, project=config.gcp.project, cluster=config.name)
                for t in derive_tenants(config) if t.gcp_account_id is not None
            }
        self.nomad_servers: NomadServers | None = None
        self.nomad_pools: dict[str, NomadClientPool] = {}
        self.nomad_address: str | None = None
        if config.scheduler == SchedulerKind.NOMAD and config.nomad is not None:
            self._nomad(config, config.nomad, node_sa)
        self.checkpoints = CheckpointBucket(
            self, "checkpoints", spec=derive_checkpoint_bucket(config), cluster=config.name, node_service_account=node_sa,
            tenant_service_accounts={name: identity.service_account.email for name, identity in self.tenant_identities.items()})
        self.dns = DnsRecords(self, "dns", cluster=config.name, dns=config.dns,
                              static_ips={n: a.address for n, a in self.static_ips.addresses.items()}) if config.dns else None
        nomad_api_records = tuple(r for r in config.dns.records if r.nomad_api) if config.dns else ()
        self.nomad_private_dns = NomadPrivateDns(
            self, "nomad_private_dns", cluster=config.name, project=config.gcp.project, zone_name=config.dns.zone_name,
            records=nomad_api_records, network=self.network.vpc.id, address=self.nomad_servers.forwarding_rule.ip_address,
        ) if config.dns and nomad_api_records and self.nomad_servers else None
        self._outputs()

    def _nomad(self, config: ClusterConfig, nomad: NomadConfig, node_sa: str) -> None:
        """Servers join each other by tag and clients join the servers, or both use the file's existing servers.

        Every agent reads its TLS material from Secret Manager at boot (``NomadSecrets``), so the
        secrets and their per-role IAM live here, next to the VMs that read them."""
        gcp, vpc, subnet = config.gcp, self.network.vpc.id, self.network.subnet.id
        join = AgentJoin.for_cluster(project=gcp.project, server_tag=server_tag(config.name), existing_servers=nomad.existing_servers)
        api_cidrs = [n.cidr for n in nomad.api_access.cidrs]
        NomadFirewall(self, "nomad_firewall", cluster=config.name, vpc_id=vpc, subnet_cidr=gcp.subnet_cidr,
                      target_tags=[client_tag(config.name), server_tag(config.name)],
                      api_tags=[server_tag(config.name)] if not nomad.existing_servers else [], api_cidrs=api_cidrs,
                      metrics_cidrs=tuple(n.cidr for n in nomad.autoscaler.scrape_cidrs) if nomad.autoscaler else (),
                      gpu_metrics_tags=[client_tag(config.name)], tls_probe_tags=[client_tag(config.name)])
        secrets = derive_nomad_secrets(config)
        pki = derive_nomad_pki(config)
        client_role = next((r for r in pki.roles if r.name == "client"), None) if pki else None
        client_certificates = render_renewal_boot(env=render_env(spec=pki, role=client_role, vault_addr=nomad.vault_addr)) \
            if pki is not None and client_role is not None else None
        readers = {NomadRole.CLIENT: node_sa}
        servers = derive_nomad_servers(config)
        if servers is not None:
            self.nomad_servers = NomadServers(
                self, "nomad_servers", cluster=config.name, project=gcp.project, region=gcp.region, spec=servers,
                datacenter=nomad.datacenter, nomad_region=nomad.region, vpc_id=vpc, subnetwork=subnet, node_service_account=node_sa,
                join=join, secrets=nomad_secrets_for(secrets, NomadRole.SERVER, pki=pki is not None), global_access=bool(api_cidrs), pools=self.pool_specs,
                prometheus_address=nomad.autoscaler.prometheus_address if nomad.autoscaler else None, pki=pki, vault_addr=nomad.vault_addr)
            self.nomad_address = self.nomad_servers.address
            readers[NomadRole.SERVER] = self.nomad_servers.service_account.email
        self.nomad_secrets = NomadSecrets(self, "nomad_secrets", cluster=config.name, project=gcp.project, secrets=secrets, readers=readers,
                                          protected=config.environment != Environment.DEV)
        for spec in self.pool_specs:
            self.nomad_pools[spec.name] = NomadClientPool(
                self, f"nomad_pool_{spec.name}", spec=spec, cluster=config.name, project=gcp.project, region=gcp.region,
                subnetwork=subnet, service_account=node_sa, datacenter=nomad.datacenter, nomad_region=nomad.region,
                join=join, image=nomad.client_machine_image, secrets=nomad_secrets_for(secrets, NomadRole.CLIENT, pki=pki is not None),
                certificates=client_certificates)

    def _outputs(self) -> None:
        """What the scheduler stack and operators need; nothing here is a secret."""
        self._output("network", self.network.vpc.name)
        self._output("subnetwork", self.network.subnet.name)
        self._output("gpu_pools", sorted(s.name for s in self.pool_specs))
        self._output("node_service_account", self.identity.service_account.email)
        self._output("checkpoint_bucket", self.checkpoints.bucket.name)
        for name, address in self.static_ips.addresses.items():
            self._output(f"static_ip_{name}", address.address)
        if self.gke is not None:
            self._output("cluster_endpoint", self.gke.cluster.endpoint)
            self._output("cluster_dns_endpoint", self.gke.dns_endpoint)
            self._output("cluster_ca_certificate", self.gke.cluster.master_auth.cluster_ca_certificate)
        for name, identity in sorted(self.tenant_identities.items()):
            self._output(f"tenant_sa_{name}", identity.service_account.email)
        if self.nomad_address is not None:
            self._output("nomad_address", self.nomad_address)

    def _output(self, name: str, value: object) -> TerraformOutput:
        output = TerraformOutput(self, f"output_{name}", value=value)
        return pin(output, name)
