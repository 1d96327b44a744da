"""The GKE cluster itself: control plane access and the system node pool.

Pure derivations from a validated ClusterConfig; tests call them directly, constructs only read the
specs. Nothing here knows cdktf.
"""

from __future__ import annotations

from dataclasses import dataclass

from clusters.derive.pools import CLUSTER_LABEL, pool_gpudirect
from clusters.families import GpuDirect
from clusters.schema import ClusterConfig, Environment, GkeConfig

SYSTEM_POOL_NAME = "gpufleet-system"


# Review D9: the provider's node-pool default is 30 min (resource_container_node_pool.go); GPU nodes
# with large images and local SSDs take longer, TGKE sets 45 min.
NODE_POOL_TIMEOUTS = {"create": "45m", "update": "45m", "delete": "45m"}


# Review D5: toolkit gke-node-pool/variables.tf linux_node_config default (larger TCP buffers for
# data loading and checkpoint traffic).
NODE_SYSCTLS = (("net.ipv4.tcp_rmem", "4096 87380 16777216"), ("net.ipv4.tcp_wmem", "4096 16384 16777216"))


@dataclass(frozen=True)
class SystemPoolSpec:
    """The untainted pool system pods (Kueue's controller and webhooks, kube-dns) schedule on."""

    machine_type: str
    min_nodes: int
    max_nodes: int
    boot_disk_gb: int
    zones: tuple[str, ...]
    labels: tuple[tuple[str, str], ...]
    protected: bool


def gke_settings(config: ClusterConfig) -> GkeConfig:
    """The file's gke: section, or its defaults when the file has none."""
    return config.gke if config.gke is not None else GkeConfig()


def derive_system_pool(config: ClusterConfig) -> SystemPoolSpec:
    pool = gke_settings(config).system_pool
    return SystemPoolSpec(machine_type=pool.machine_type, min_nodes=pool.min_nodes, max_nodes=max(pool.max_nodes, pool.min_nodes),
                          boot_disk_gb=pool.boot_disk_gb, zones=tuple(config.gcp.zones),
                          labels=((CLUSTER_LABEL, config.name), ("gpufleet.dev/role", "system")),
                          protected=config.environment != Environment.DEV)


@dataclass(frozen=True)
class ControlPlaneSpec:
    """How the API server is reached and when GKE may touch the cluster.

    ``dns_endpoint``: the IAM-authorized DNS endpoint (``control_plane_endpoints_config``), which
    CI runners and Terraform need no IP allow-list for; the scheduler stack's kubernetes provider
    uses it whenever it is on. ``exclusion``: (name, start, end) of a NO_MINOR_OR_NODE_UPGRADES
    maintenance exclusion.
    """

    dns_endpoint: bool
    private_endpoint: bool
    authorized_networks: tuple[tuple[str, str], ...]
    maintenance_start_time: str
    exclusion: tuple[str, str, str] | None
    multi_networking: bool
    # Zonal clusters live in their first zone and list only the other zones as node locations.
    location: str = ""
    node_locations: tuple[str, ...] = ()
    intranode_visibility: bool = False

    @property
    def reachable_from_ci(self) -> bool:
        """Someone outside the VPC can plan the scheduler stack: over the DNS endpoint, or a public IP endpoint with an allow-list."""
        return self.dns_endpoint or (not self.private_endpoint and bool(self.authorized_networks))


def derive_control_plane(config: ClusterConfig) -> ControlPlaneSpec:
    gke = gke_settings(config)
    exclusion = gke.upgrade_exclusion
    # Review D8: one zonal cluster per billing account gets GKE's free-tier credit; a dev cluster in
    # one zone loses nothing by a zonal control plane. Production keeps the regional one.
    zonal = gke.zonal if gke.zonal is not None else (config.environment == Environment.DEV and len(config.gcp.zones) == 1)
    return ControlPlaneSpec(
        dns_endpoint=gke.dns_endpoint,
        private_endpoint=gke.private_endpoint,
        authorized_networks=tuple((n.name, n.cidr) for n in config.gcp.master_authorized_networks),
        maintenance_start_time=gke.maintenance_start_time,
        exclusion=(exclusion.name, exclusion.start_time, exclusion.end_time) if exclusion else None,
        multi_networking=any(pool_gpudirect(p) != GpuDirect.NONE for p in config.gpu_pools),
        location=config.gcp.zones[0] if zonal else config.gcp.region,
        node_locations=tuple(config.gcp.zones[1:]) if zonal else tuple(config.gcp.zones),
        intranode_visibility=gke.intranode_visibility,
    )
