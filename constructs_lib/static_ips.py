"""Named regional static IPs; DNS records and ingresses point at them by name."""

from __future__ import annotations

from constructs import Construct

from clusters.schema import ClusterConfig, Environment
from constructs_lib.naming import pin
from constructs_lib.providers import google


class StaticIps(Construct):
    """The address description is immutable: changing it replaces the resource and releases the pinned IP."""

    def __init__(self, scope: Construct, id_: str, *, config: ClusterConfig) -> None:
        super().__init__(scope, id_)
        protected = config.environment != Environment.DEV
        self.addresses = {
            ip.name: pin(google.compute_address.ComputeAddress(
                self, ip.name, name=f"{config.name}-{ip.name}", region=config.gcp.region, address_type="EXTERNAL",
                network_tier="PREMIUM", description=ip.description or f"gpufleet {config.name} {ip.name}",
                lifecycle={"prevent_destroy": protected},
            ), f"ip_{ip.name}")
            for ip in sorted(config.gcp.static_ips, key=lambda ip: ip.name)
        }
