"""The GKE cluster itself: control plane access and the system node pool.

Pure derivations from a validated ClusterConfig; tests call them directly, constructs only read the
specs. Nothing here knows cdktf.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timedelta

from clusters import clock
from clusters.derive.pools import CLUSTER_LABEL, pool_gpudirect
from clusters.families import GpuDirect
from clusters.schema import ClusterConfig, Environment, GkeConfig, UpgradeExclusion

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
    maintenance exclusion and its scope (derive_exclusion).
    """

    dns_endpoint: bool
    private_endpoint: bool
    authorized_networks: tuple[tuple[str, str], ...]
    maintenance_start_time: str
    exclusion: tuple[str, str, str, str] | None
    multi_networking: bool
    # Zonal clusters live in their first zone and list only the other zones as node locations.
    location: str = ""
    node_locations: tuple[str, ...] = ()
    intranode_visibility: bool = False

    @property
    def reachable_from_ci(self) -> bool:
        """Someone outside the VPC can plan the scheduler stack: over the DNS endpoint, or a public IP endpoint with an allow-list."""
        return self.dns_endpoint or (not self.private_endpoint and bool(self.authorized_networks))


# A renewed exclusion overlaps the next quarter by this much: an apply any time in a quarter's
# first 45 days renews it before the old window ends.
RENEWAL_OVERLAP_DAYS = 45
# ``gpufleet check`` warns this long before an exclusion ends.
EXPIRY_WARNING_DAYS = 30


def _quarter_start(day: date) -> date:
    return date(day.year, 3 * ((day.month - 1) // 3) + 1, 1)


def _next_quarter(day: date) -> date:
    start = _quarter_start(day)
    return date(start.year + (start.month == 10), (start.month + 2) % 12 + 1, 1)


def derive_exclusion(exclusion: UpgradeExclusion, today: date) -> tuple[str, str, str, str]:
    """(name, start, end, scope) of the exclusion in force today.

    Dated: the file's window. Renewed (no dates): this calendar quarter's first day to
    RENEWAL_OVERLAP_DAYS into the next, so the synthesized times only change at a quarter
    boundary (plans stay empty within a quarter) and the next quarter's first apply renews it.
    """
    if exclusion.start_time is not None and exclusion.end_time is not None:
        return exclusion.name, exclusion.start_time, exclusion.end_time, exclusion.scope
    start = _quarter_start(today)
    end = _next_quarter(today) + timedelta(days=RENEWAL_OVERLAP_DAYS)
    return exclusion.name, f"{start.isoformat()}T00:00:00Z", f"{end.isoformat()}T00:00:00Z", exclusion.scope


def exclusion_expiry(config: ClusterConfig, today: date) -> tuple[str, int] | None:
    """(end_time, days left) of a dated exclusion ending within EXPIRY_WARNING_DAYS (or already over), else None."""
    exclusion = config.gke.upgrade_exclusion if config.gke else None
    if exclusion is None or exclusion.end_time is None:
        return None
    end = datetime.fromisoformat(exclusion.end_time.replace("Z", "+00:00")).date()
    left = (end - today).days
    return (exclusion.end_time, left) if left <= EXPIRY_WARNING_DAYS else None


def derive_control_plane(config: ClusterConfig, today: date | None = None) -> ControlPlaneSpec:
    gke = gke_settings(config)
    exclusion = gke.upgrade_exclusion
    # Review D8: one zonal cluster per billing account gets GKE's free-tier credit; a dev cluster in
    # one zone loses nothing by a zonal control plane. Production keeps the regional one.
    zonal = gke.zonal if gke.zonal is not None else (config.environment == Environment.DEV and len(config.gcp.zones) == 1)
    return ControlPlaneSpec(
        dns_endpoint=gke.dns_endpoint,
        private_endpoint=gke.private_endpoint if gke.private_endpoint is not None else gke.dns_endpoint,
        authorized_networks=tuple((n.name, n.cidr) for n in config.gcp.master_authorized_networks),
        maintenance_start_time=gke.maintenance_start_time,
        exclusion=derive_exclusion(exclusion, today or clock.today()) if exclusion else None,
        multi_networking=any(pool_gpudirect(p) != GpuDirect.NONE for p in config.gpu_pools),
        location=config.gcp.zones[0] if zonal else config.gcp.region,
        node_locations=tuple(config.gcp.zones[1:]) if zonal else tuple(config.gcp.zones),
        intranode_visibility=gke.intranode_visibility,
    )
