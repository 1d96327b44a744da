"""Nomad's HTTP, RPC and Serf ports, open between agents inside the VPC and nowhere else."""

from __future__ import annotations

from constructs import Construct

from constructs_lib.naming import pin
from constructs_lib.providers import google

NOMAD_TCP_PORTS = "4646-4648"
NOMAD_SERF_UDP = "4648"


class NomadFirewall(Construct):
    """Explicit so it survives a narrower ``allow-internal`` rule; the source is the node subnet only."""

    def __init__(self, scope: Construct, id_: str, *, cluster: str, vpc_id: str, subnet_cidr: str, target_tags: list[str]) -> None:
        super().__init__(scope, id_)
        fw = google.compute_firewall
        self.rule = pin(fw.ComputeFirewall(
            self, "nomad", name=f"{cluster}-allow-nomad", network=vpc_id, direction="INGRESS", priority=900,
            source_ranges=[subnet_cidr], target_tags=sorted(target_tags),
            allow=[fw.ComputeFirewallAllow(protocol="tcp", ports=[NOMAD_TCP_PORTS]),
                   fw.ComputeFirewallAllow(protocol="udp", ports=[NOMAD_SERF_UDP])],
            log_config={"metadata": "INCLUDE_ALL_METADATA"},
        ), "fw_allow_nomad")
