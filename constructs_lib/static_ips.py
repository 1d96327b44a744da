"""Named static IPs; DNS records, ingresses and load balancers point at them by name."""

from __future__ import annotations

from constructs import Construct

from clusters.schema import ClusterConfig, Environment
from constructs_lib.naming import pin
from constructs_lib.providers import google


class StaticIps(Construct):
    """The address kind follows its declared use (review C11): ``use: ingress`` is a global address,
    because GKE Ingress builds a global external Application Load Balancer that only takes one
    (``kubernetes.io/ingress.global-static-ip-name``); L4 LoadBalancer Services and regional
    Gateways take a regional EXTERNAL address. Changing ``use`` changes the resource type, so the
    old address is destroyed: ``prevent_destroy`` outside dev stops that plan instead of releasing
    a pinned IP silently. The description is immutable for the same reason.
    """

    def __init__(self, scope: Construct, id_: str, *, config: ClusterConfig) -> None:
        super().__init__(scope, id_)
        protected = config.environment != Environment.DEV
        self.addresses: dict[str, object] = {}
        for ip in sorted(config.gcp.static_ips, key=lambda ip: ip.name):
            common = {"name": f"{config.name}-{ip.name}", "address_type": "EXTERNAL",
                      "description": ip.description or f"gpufleet {config.name} {ip.name}", "lifecycle": {"prevent_destroy": protected}}
            if ip.use is not None and ip.use.is_global:
                address = google.compute_global_address.ComputeGlobalAddress(self, ip.name, ip_version="IPV4", **common)
            else:
                address = google.compute_address.ComputeAddress(self, ip.name, region=config.gcp.region, network_tier="PREMIUM", **common)
            self.addresses[ip.name] = pin(address, f"ip_{ip.name}")
