"""The extra VPCs GPUDirect needs: gVNIC networks for TCPX/TCPXO/A3U-A4, and an RDMA (RoCE) VPC for A3 Ultra / A4."""

from __future__ import annotations

from constructs import Construct

from clusters.derive.gpudirect import GpuDirectSpec
from clusters.families import GPUDIRECT_MTU, RDMA_MTU
from constructs_lib.naming import pin
from constructs_lib.providers import google


class GpuDirectNetworks(Construct):
    """One custom-mode VPC per gVNIC NIC with one subnet each, MTU 8244 (toolkit multivpc in the A3
    blueprints), a firewall that admits only the GPUDirect range itself; plus, for RDMA, one VPC with
    the zone's ``vpc-roce`` network profile, MTU 8896 and 8 subnets (toolkit gpu-rdma-vpc, which
    declares no firewall rules on it). Node NICs need no NAT or internet route: these networks carry
    only GPU-to-GPU traffic. ``network_profile`` and the subnets' ranges are immutable: right before
    the first apply.
    """

    def __init__(self, scope: Construct, id_: str, *, spec: GpuDirectSpec, cluster: str, project: str, region: str,
                 source_range: str) -> None:
        super().__init__(scope, id_)
        compute = google
        self.networks: dict[str, object] = {}
        self.subnets: dict[str, object] = {}
        rdma_vpc = None
        for n in spec.networks:
            if n.device_mode == "RDMA":
                if rdma_vpc is None:
                    rdma_vpc = pin(compute.compute_network.ComputeNetwork(
                        self, "rdma", name=n.network, auto_create_subnetworks=False, routing_mode="REGIONAL", mtu=RDMA_MTU,
                        network_profile=f"https://www.googleapis.com/compute/beta/projects/{project}/global/networkProfiles/{spec.rdma_zone}-vpc-roce",
                    ), "rdma")
                vpc = rdma_vpc
            else:
                vpc = pin(compute.compute_network.ComputeNetwork(
                    self, n.key, name=n.network, auto_create_subnetworks=False, routing_mode="REGIONAL", mtu=GPUDIRECT_MTU), n.key)
                pin(compute.compute_firewall.ComputeFirewall(
                    self, f"fw_{n.key}", name=f"{n.network}-internal", network=vpc.id, direction="INGRESS", priority=1000,
                    source_ranges=[source_range],
                    allow=[compute.compute_firewall.ComputeFirewallAllow(protocol="tcp"),
                           compute.compute_firewall.ComputeFirewallAllow(protocol="udp"),
                           compute.compute_firewall.ComputeFirewallAllow(protocol="icmp")],
                    log_config={"metadata": "EXCLUDE_ALL_METADATA"}), f"fw_{n.key}_internal")
            self.networks[n.key] = vpc
            # RoCE subnets carry only MRDMA NICs: the network profile's features gate Private Google
            # Access (networkProfiles features.allowPrivateGoogleAccess) and GCP refuses an unsupported
            # feature; cluster-toolkit's gpu-rdma-vpc sets neither it nor flow logs. gVNIC subnets keep both.
            roce = n.device_mode == "RDMA"
            self.subnets[n.key] = pin(compute.compute_subnetwork.ComputeSubnetwork(
                self, f"{n.key}_subnet", name=n.subnetwork, region=region, network=vpc.id, ip_cidr_range=n.cidr,
                **({} if roce else {
                    "private_ip_google_access": True,
                    "log_config": {"aggregation_interval": "INTERVAL_10_MIN", "flow_sampling": 0.1, "metadata": "EXCLUDE_ALL_METADATA"},
                }),
            ), f"{n.key}_subnet")
