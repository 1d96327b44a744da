"""Nomad's HTTP, RPC and Serf ports, open between agents inside the VPC and nowhere else."""

from __future__ import annotations

from collections.abc import Sequence

from constructs import Construct

from constructs_lib.naming import pin
from constructs_lib.nomad_gpu_node import DCGM_EXPORTER_PORT
from constructs_lib.providers import google

NOMAD_TCP_PORTS = "4646-4648"
NOMAD_SERF_UDP = "4648"
NOMAD_HTTP_PORT = 4646


class NomadFirewall(Construct):
    """Explicit so it survives a narrower ``allow-internal`` rule; agents talk inside the node subnet only.

    The HTTP API (4646 on the servers, through the internal load balancer, which keeps the
    caller's address) is also open to the file's ``nomad.api_access`` ranges: the operators'
    VPN and the CI runners or Terraform agents that plan the scheduler stack. Callers still need
    the CLI certificate (mTLS) and an ACL token.

    The autoscaler's Prometheus scrapes every server directly, not through the load balancer: only
    the Raft leader publishes the job-summary gauges (hashicorp/nomad v1.10.5 nomad/leader.go:448,
    publishJobSummaryMetrics runs in establishLeadership), so one target behind the balancer would
    see the queue only when it lands on the leader. ``metrics_cidrs`` (``nomad.autoscaler.scrape_cidrs``)
    reach the servers' HTTP port; the scrape still needs a certificate of the cluster CA.

    The same ranges reach the GPU clients' DCGM exporter (``gpu_metrics_tags``, TCP 9400,
    constructs_lib.nomad_gpu_node), which the same Prometheus scrapes (``gpufleet nomad scrape-config``).

    And the clients' HTTPS API (``tls_probe_tags``, TCP 4646): a blackbox exporter in those ranges reads
    every agent's certificate expiry there (constructs_lib.nomad_cert_expiry); the servers' port is
    already open to them. The handshake needs a certificate of the cluster CA, any API call an ACL token.
    """

    def __init__(self, scope: Construct, id_: str, *, cluster: str, vpc_id: str, subnet_cidr: str, target_tags: list[str],
                 api_tags: list[str], api_cidrs: list[str], metrics_cidrs: tuple[str, ...] = (),
                 gpu_metrics_tags: list[str] | None = None, tls_probe_tags: list[str] | None = None) -> None:
        super().__init__(scope, id_)
        fw = google.compute_firewall
        self.rule = pin(fw.ComputeFirewall(
            self, "nomad", name=f"{cluster}-allow-nomad", network=vpc_id, direction="INGRESS", priority=900,
            source_ranges=[subnet_cidr], target_tags=sorted(target_tags),
            allow=[fw.ComputeFirewallAllow(protocol="tcp", ports=[NOMAD_TCP_PORTS]),
                   fw.ComputeFirewallAllow(protocol="udp", ports=[NOMAD_SERF_UDP])],
            log_config={"metadata": "INCLUDE_ALL_METADATA"},
        ), "fw_allow_nomad")
        self.api_rule = self._tcp_ingress("api", f"{cluster}-allow-nomad-api", vpc_id, api_cidrs, api_tags, NOMAD_HTTP_PORT,
                                          "fw_allow_nomad_api")
        self.metrics_rule = self._tcp_ingress("metrics", f"{cluster}-allow-nomad-metrics", vpc_id, metrics_cidrs, api_tags, NOMAD_HTTP_PORT,
                                              "fw_allow_nomad_metrics")
        self.gpu_metrics_rule = self._tcp_ingress("gpu_metrics", f"{cluster}-allow-gpu-metrics", vpc_id, metrics_cidrs, gpu_metrics_tags,
                                                  DCGM_EXPORTER_PORT, "fw_allow_gpu_metrics")
        self.tls_probe_rule = self._tcp_ingress("tls_probe", f"{cluster}-allow-nomad-tls-probe", vpc_id, metrics_cidrs, tls_probe_tags,
                                                NOMAD_HTTP_PORT, "fw_allow_nomad_tls_probe")

    def _tcp_ingress(self, id_: str, name: str, vpc_id: str, cidrs: Sequence[str], tags: Sequence[str] | None, port: int,
                     address: str) -> google.compute_firewall.ComputeFirewall | None:
        """One TCP port open from ``cidrs`` to ``tags``, logged; no rule when either is empty."""
        if not cidrs or not tags:
            return None
        fw = google.compute_firewall
        return pin(fw.ComputeFirewall(
            self, id_, name=name, network=vpc_id, direction="INGRESS", priority=900,
            source_ranges=sorted(cidrs), target_tags=sorted(tags),
            allow=[fw.ComputeFirewallAllow(protocol="tcp", ports=[str(port)])],
            log_config={"metadata": "INCLUDE_ALL_METADATA"},
        ), address)
