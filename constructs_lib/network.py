"""The cluster network: custom-mode VPC, one subnet with pod/service ranges, NAT, firewall baseline."""

from __future__ import annotations

from constructs import Construct

from clusters.derive.gpudirect import derive_gpudirect
from clusters.families import GPUDIRECT_MTU
from clusters.schema import ClusterConfig, SchedulerKind
from constructs_lib.naming import pin
from constructs_lib.providers import google

# Google's published source ranges for IAP TCP forwarding and load-balancer health checks.
IAP_RANGE = "35.235.240.0/20"
HEALTH_CHECK_RANGES = ("35.191.0.0/16", "130.211.0.0/22")
PODS_RANGE = "pods"
SERVICES_RANGE = "services"


def _health_check_rule(config: ClusterConfig) -> dict[str, object] | None:
    """Who Google's health checkers may probe (review C10).

    Nomad: only the servers' API port, the internal load balancer's health check. GKE: nothing
    from gpufleet. GKE's own controllers open exactly what each load balancer needs, scoped to the
    cluster's node tags and the Service's health-check and node ports: the Ingress controller
    (kubernetes/ingress-gce ``pkg/firewalls``, rules ``k8s-fw-l7-*``) and the L4 service
    controller (``k8s-*`` rules; on by default, ``disable_l4_lb_firewall_reconciliation`` in
    provider 6.50 turns it off; GKE docs "user-managed-firewall-rules"). An extra open TCP rule
    from the checkers' ranges would only widen what every node exposes.
    """
    if config.scheduler == SchedulerKind.NOMAD:
        return {"allow": [google.compute_firewall.ComputeFirewallAllow(protocol="tcp", ports=["4646"])],
                "target_tags": [f"{config.name}-nomad-server"]}
    return None


class GpuNetwork(Construct):
    """Nodes have no public IPs (private nodes), so egress goes through Cloud NAT."""

    def __init__(self, scope: Construct, id_: str, *, config: ClusterConfig) -> None:
        super().__init__(scope, id_)
        gcp, name = config.gcp, config.name
        self._name = name
        # Review D5 / B6: the toolkit's A3 blueprints raise the primary VPC to the GPUDirect MTU too,
        # so node-to-node traffic on the primary NIC matches the data NICs.
        mtu = {"mtu": GPUDIRECT_MTU} if derive_gpudirect(config).networks else {}
        self.vpc = pin(google.compute_network.ComputeNetwork(self, "vpc", name=f"{name}-vpc", auto_create_subnetworks=False,
                                             routing_mode="REGIONAL", **mtu), "vpc")
        self.subnet = pin(google.compute_subnetwork.ComputeSubnetwork(
            self, "subnet", name=f"{name}-nodes", region=gcp.region, network=self.vpc.id,
            ip_cidr_range=gcp.subnet_cidr, private_ip_google_access=True,
            secondary_ip_range=[
                google.compute_subnetwork.ComputeSubnetworkSecondaryIpRange(range_name=PODS_RANGE, ip_cidr_range=gcp.pods_cidr),
                google.compute_subnetwork.ComputeSubnetworkSecondaryIpRange(range_name=SERVICES_RANGE, ip_cidr_range=gcp.services_cidr),
            ],
            log_config={"aggregation_interval": gcp.flow_log_interval, "flow_sampling": gcp.flow_log_sampling, "metadata": gcp.flow_log_metadata},
        ), "subnet")
        self.router = pin(google.compute_router.ComputeRouter(self, "router", name=f"{name}-router", region=gcp.region,
                                               network=self.vpc.id), "router")
        self.nat = pin(google.compute_router_nat.ComputeRouterNat(
            self, "nat", name=f"{name}-nat", router=self.router.name, region=gcp.region,
            nat_ip_allocate_option="AUTO_ONLY", source_subnetwork_ip_ranges_to_nat="ALL_SUBNETWORKS_ALL_IP_RANGES",
            log_config={"enable": True, "filter": "ERRORS_ONLY"},
        ), "nat")
        internal = sorted({gcp.subnet_cidr, gcp.pods_cidr, gcp.services_cidr} | ({gcp.master_cidr} if gcp.master_cidr else set()))
        self.firewalls = {
            "deny_all_ingress": self._firewall("deny-all-ingress", priority=65534, source_ranges=["0.0.0.0/0"],
                                               deny=[google.compute_firewall.ComputeFirewallDeny(protocol="all")]),
            "allow_internal": self._firewall("allow-internal", priority=1000, source_ranges=internal,
                                             allow=[google.compute_firewall.ComputeFirewallAllow(protocol="tcp"),
                                                    google.compute_firewall.ComputeFirewallAllow(protocol="udp"),
                                                    google.compute_firewall.ComputeFirewallAllow(protocol="icmp")]),
            "allow_iap_ssh": self._firewall("allow-iap-ssh", priority=1000, source_ranges=[IAP_RANGE],
                                            allow=[google.compute_firewall.ComputeFirewallAllow(protocol="tcp", ports=["22"])]),
        }
        health = _health_check_rule(config)
        if health is not None:
            self.firewalls["allow_health_checks"] = self._firewall("allow-health-checks", priority=1000,
                                                                   source_ranges=list(HEALTH_CHECK_RANGES), **health)

    def _firewall(self, suffix: str, **kwargs: object) -> object:
        fid = "fw_" + suffix.replace("-", "_")
        return pin(google.compute_firewall.ComputeFirewall(
            self, fid, name=f"{self._name}-{suffix}", network=self.vpc.id, direction="INGRESS",
            log_config={"metadata": "INCLUDE_ALL_METADATA"}, **kwargs), fid)
