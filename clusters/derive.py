"""Pure derivations from a validated ClusterConfig to the specs the constructs declare.

Tests call these directly; constructs only read the specs. Nothing here knows cdktf.
"""

from __future__ import annotations

import ipaddress
import math
import re
from dataclasses import dataclass
from enum import StrEnum

from clusters.families import GPUDIRECT_RUNTIME, GPUDIRECT_SUBNET_PREFIX, GpuDirect, machine_family
from clusters.reservation import ReservationSpec, derive_reservation
from clusters.machines import MACHINE_GPUS, N1_ACCELERATOR, N1_GPU_MEMORY_GIB, N1_MODEL, NVML_GPUS, NvmlGpu, is_n1
from clusters.schema import ClusterConfig, Environment, GkeConfig, GpuPool, SchedulerKind, TaintEffect

GPU_TAINT = ("nvidia.com/gpu", "present", TaintEffect.NO_SCHEDULE)
POOL_LABEL = "gpufleet.dev/gpu-pool"
CLUSTER_LABEL = "gpufleet.dev/cluster"
# GKE taints queued-provisioning (DWS) nodes with this key; the toolkit also labels them with it
# (gke-node-pool/main.tf kubernetes_labels) so node selectors can target them.
QUEUED_LABEL = "cloud.google.com/gke-queued"


def kueue_local_queue_name(pool_name: str) -> str:
    """The LocalQueue a tenant namespace submits to for one GPU pool (the job renderer calls this too)."""
    return f"gpu-{pool_name}"


def kueue_queue_key(tenant: str, pool: str) -> str:
    """The (tenant, pool) part of the Kueue queue addresses; checks refuse two pairs that collapse into one."""
    return f"{tenant}__{pool}".replace("-", "_")


@dataclass(frozen=True)
class UpgradeSpec:
    """How GKE replaces a pool's nodes. A reserved pool has no VM beyond its reservation for a surge
    node, so it upgrades one node down at a time (toolkit default: max_surge 0, max_unavailable 1);
    DWS nodes come only through ProvisioningRequests, so GKE must not upgrade or repair them."""

    max_surge: int
    max_unavailable: int
    auto_upgrade: bool
    auto_repair: bool


def derive_upgrade(reserved: bool, queued_provisioning: bool) -> UpgradeSpec:
    if queued_provisioning:
        # toolkit examples/gke-consumption-options/dws-flex-start-queued-provisioning/gke-a3-ultragpu.yaml:164-167
        return UpgradeSpec(max_surge=1, max_unavailable=0, auto_upgrade=False, auto_repair=False)
    if reserved:
        return UpgradeSpec(max_surge=0, max_unavailable=1, auto_upgrade=True, auto_repair=True)
    return UpgradeSpec(max_surge=1, max_unavailable=0, auto_upgrade=True, auto_repair=True)


@dataclass(frozen=True)
class TaintSpec:
    key: str
    value: str
    effect: str


@dataclass(frozen=True)
class GpuPoolSpec:
    """Everything a GPU node pool (GKE) or GPU instance group (Nomad) needs, fully derived."""

    name: str
    machine_type: str
    accelerator: str
    gpus_per_node: int
    gpu_memory_gib: int
    gpu_model: str
    # What the NVIDIA device plugin reports for this pool's GPUs: placement compares these.
    nvml: NvmlGpu
    node_count: int | None
    min_nodes: int
    max_nodes: int
    spot: bool
    reservation: str | None
    queued_provisioning: bool
    compact_placement: bool
    zones: tuple[str, ...]
    boot_disk_gb: int
    boot_disk_type: str
    labels: tuple[tuple[str, str], ...]
    taints: tuple[TaintSpec, ...]
    overcommit: bool
    protected: bool
    # GKE reads a static node_count per zone; a Nomad MIG's target size is the whole group.
    node_count_per_zone: bool
    gpu_driver_version: str = "DEFAULT"
    local_ssd_count: int | None = None
    gpudirect: GpuDirect = GpuDirect.NONE
    upgrade: UpgradeSpec = UpgradeSpec(1, 0, True, True)
    location_policy: str = "BALANCED"
    # The reservation's full name and zone (GKE side): what reservation_affinity matches and the precondition checks.
    reservation_spec: ReservationSpec | None = None
    placement_policy_name: str | None = None
    host_maintenance_interval: str | None = None

    @property
    def autoscaling(self) -> bool:
        return self.node_count is None

    def _total(self, nodes: int) -> int:
        if self.node_count is not None and self.node_count_per_zone:
            return nodes * len(self.zones)
        return nodes

    @property
    def min_total_nodes(self) -> int:
        return self._total(self.min_nodes)

    @property
    def max_total_nodes(self) -> int:
        return self._total(self.max_nodes)

    @property
    def capacity_gpus(self) -> int:
        """GPUs the pool can hold at its largest: the ceiling for tenant quotas."""
        return self.max_total_nodes * self.gpus_per_node

    @property
    def initial_nodes_per_zone(self) -> int:
        """GKE creates ``initial_node_count`` nodes in every zone; spread the autoscaling minimum instead of multiplying it."""
        return math.ceil(self.min_nodes / len(self.zones))


def machine_accelerator(machine_type: str, accelerator: str | None, gpus_per_node: int | None) -> tuple[str, int] | None:
    """(accelerator, gpus) a machine type implies; N1 takes the user's T4 count. None if unknown."""
    if is_n1(machine_type):
        return (accelerator or N1_ACCELERATOR, gpus_per_node or 1)
    known = MACHINE_GPUS.get(machine_type)
    return (known.accelerator, known.gpus) if known else None


def pool_gpudirect(pool: GpuPool) -> GpuDirect:
    """The machine type's GPUDirect transport, unless the file opts the pool out."""
    return machine_family(pool.machine_type).gpudirect if pool.gpudirect is not False else GpuDirect.NONE


def default_protected(pool: GpuPool, environment: Environment) -> bool:
    """Pools are protected from destroy by default everywhere but dev, where churn is the point."""
    return pool.protected if pool.protected is not None else environment != Environment.DEV


def derive_gpu_pool(pool: GpuPool, config: ClusterConfig) -> GpuPoolSpec:
    derived = machine_accelerator(pool.machine_type, pool.accelerator, pool.gpus_per_node)
    if derived is None:
        raise ValueError(f"unknown machine type {pool.machine_type!r}; run cross-checks first")
    accelerator, gpus = derived
    known = MACHINE_GPUS.get(pool.machine_type)
    labels = {CLUSTER_LABEL: config.name, POOL_LABEL: pool.name, **pool.labels}
    if pool.queued_provisioning:
        labels[QUEUED_LABEL] = "true"
    family = machine_family(pool.machine_type)
    taints = (TaintSpec(GPU_TAINT[0], GPU_TAINT[1], GPU_TAINT[2].value),) + tuple(
        TaintSpec(t.key, t.value, t.effect.value) for t in pool.taints
    )
    static = pool.node_count is not None
    return GpuPoolSpec(
        name=pool.name,
        machine_type=pool.machine_type,
        accelerator=accelerator,
        gpus_per_node=gpus,
        gpu_memory_gib=known.gpu_memory_gib if known else N1_GPU_MEMORY_GIB,
        gpu_model=known.model if known else N1_MODEL,
        nvml=NVML_GPUS[accelerator],
        node_count=pool.node_count,
        min_nodes=pool.node_count if static else (pool.min_nodes or 0),
        max_nodes=pool.node_count if static else (pool.max_nodes or 1),
        spot=pool.spot,
        reservation=pool.reservation,
        queued_provisioning=pool.queued_provisioning,
        compact_placement=pool.placement == "COMPACT",
        zones=tuple(pool.zones or config.gcp.zones),
        boot_disk_gb=pool.boot_disk_gb,
        boot_disk_type=pool.boot_disk_type.value if pool.boot_disk_type else family.boot_disk_types[0],
        labels=tuple(sorted(labels.items())),
        taints=taints,
        overcommit=pool.overcommit,
        protected=default_protected(pool, config.environment),
        node_count_per_zone=config.scheduler == SchedulerKind.GKE,
        gpu_driver_version=pool.gpu_driver_version,
        local_ssd_count=family.local_ssd_count,
        gpudirect=pool_gpudirect(pool),
        upgrade=derive_upgrade(pool.reservation is not None, pool.queued_provisioning),
        # ANY fills unused reservations first and takes spot/DWS capacity wherever it is
        # (toolkit gke-node-pool/main.tf:120 always uses ANY); BALANCED spreads on-demand pools.
        location_policy="ANY" if pool.spot or pool.queued_provisioning or pool.reservation else "BALANCED",
        placement_policy_name=pool.placement_policy_name,
        host_maintenance_interval=pool.host_maintenance_interval,
        reservation_spec=derive_reservation(pool.reservation, config.gcp.project, (pool.zones or config.gcp.zones)[0]) if pool.reservation else None,
    )


def derive_gpu_pools(config: ClusterConfig) -> tuple[GpuPoolSpec, ...]:
    return tuple(derive_gpu_pool(p, config) for p in config.gpu_pools)


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


@dataclass(frozen=True)
class NodeNetworkSpec:
    """One extra VPC (gVNIC) or RDMA subnet a GPUDirect pool's nodes get a NIC on, and its GKE Network object."""

    key: str            # address part: gpunet_1 .. gpunet_8, rdma_0 .. rdma_7
    network: str        # VPC name
    subnetwork: str     # subnet name
    cidr: str
    k8s_name: str       # GKE Network / GKENetworkParamSet name, as the toolkit names them (gvnic-1.., rdma-0..)
    device_mode: str    # NetDevice (gVNIC) or RDMA


@dataclass(frozen=True)
class GpuDirectSpec:
    """The cluster's GPUDirect networks and which pool uses which (pool name -> network keys, in NIC order)."""

    networks: tuple[NodeNetworkSpec, ...]
    rdma_zone: str | None
    pool_networks: tuple[tuple[str, tuple[str, ...]], ...]

    def for_pool(self, pool: str) -> tuple[NodeNetworkSpec, ...]:
        keys = dict(self.pool_networks).get(pool, ())
        by_key = {n.key: n for n in self.networks}
        return tuple(by_key[k] for k in keys)


def derive_gpudirect(config: ClusterConfig) -> GpuDirectSpec:
    """gVNIC VPCs shared by every GPUDirect pool (as many as the most demanding pool needs), plus one
    RDMA VPC with 8 subnets for A3 Ultra / A4. Subnets are /20s of ``gcp.gpudirect_cidr`` in order
    (toolkit multivpc: subnetwork_cidr_suffix 20): gVNIC network i takes block i-1, RDMA subnet j block 8+j."""
    if config.scheduler != SchedulerKind.GKE:
        return GpuDirectSpec((), None, ())
    pools = [(p, machine_family(p.machine_type)) for p in config.gpu_pools if pool_gpudirect(p) != GpuDirect.NONE]
    if not pools:
        return GpuDirectSpec((), None, ())
    blocks = list(ipaddress.IPv4Network(config.gcp.gpudirect_cidr).subnets(new_prefix=GPUDIRECT_SUBNET_PREFIX))
    gvnic_count = max(f.gvnic_networks for _, f in pools)
    networks = [NodeNetworkSpec(key=f"gpunet_{i}", network=f"{config.name}-gpunet-{i}", subnetwork=f"{config.name}-gpunet-{i}-subnet",
                                cidr=str(blocks[i - 1]), k8s_name=f"gvnic-{i}", device_mode="NetDevice") for i in range(1, gvnic_count + 1)]
    rdma = [(p, f) for p, f in pools if f.rdma_subnets]
    rdma_zone = None
    if rdma:
        rdma_zone = (rdma[0][0].zones or config.gcp.zones)[0]
        networks += [NodeNetworkSpec(key=f"rdma_{j}", network=f"{config.name}-rdma", subnetwork=f"{config.name}-rdma-sub-{j}",
                                     cidr=str(blocks[8 + j]), k8s_name=f"rdma-{j}", device_mode="RDMA")
                     for j in range(max(f.rdma_subnets for _, f in rdma))]
    pool_networks = tuple((p.name, tuple(f"gpunet_{i}" for i in range(1, f.gvnic_networks + 1)) + tuple(f"rdma_{j}" for j in range(f.rdma_subnets)))
                          for p, f in pools)
    return GpuDirectSpec(tuple(networks), rdma_zone, pool_networks)


@dataclass(frozen=True)
class GpuDirectDaemonSetSpec:
    """One vendored GPUDirect runtime DaemonSet (NCCL plugin installer or NRI device injector) and
    the pools it runs on: only nodes of ``pools`` (by POOL_LABEL), tolerating only their taints."""

    name: str                       # vendored manifest stem, e.g. nccl-tcpxo-installer
    pools: tuple[str, ...]
    accelerators: tuple[str, ...]   # the pools' cloud.google.com/gke-accelerator values
    taints: tuple[TaintSpec, ...]   # every taint those pools carry (GPU taint, the file's taints)
    queued_provisioning: bool       # a DWS pool is among them: GKE taints its nodes cloud.google.com/gke-queued


def derive_gpudirect_daemonsets(pools: tuple[GpuPoolSpec, ...]) -> tuple[GpuDirectDaemonSetSpec, ...]:
    """The runtime DaemonSets the cluster's GPUDirect pools need (families.GPUDIRECT_RUNTIME), in a
    stable order; none for a cluster without such pools. A DaemonSet shared by transports (the NRI
    injector for TCPX and TCPXO) covers the union of their pools."""
    wanted: dict[str, list[GpuPoolSpec]] = {}
    for pool in pools:
        for name in GPUDIRECT_RUNTIME.get(pool.gpudirect, ()):
            wanted.setdefault(name, []).append(pool)
    specs = []
    for name in sorted(wanted):
        members = wanted[name]
        taints = {t for p in members for t in p.taints}
        specs.append(GpuDirectDaemonSetSpec(name=name, pools=tuple(sorted(p.name for p in members)),
                                            accelerators=tuple(sorted({p.accelerator for p in members})),
                                            taints=tuple(sorted(taints, key=lambda t: (t.key, t.value, t.effect))),
                                            queued_provisioning=any(p.queued_provisioning for p in members)))
    return tuple(specs)


def tfc_workspace(config: ClusterConfig, stack: str) -> str:
    """Workspace per stack: the file's explicit name for the infra stack, else derived from the stack name."""
    state = config.state
    explicit = getattr(state, "workspace", None)
    if explicit and stack == config.name:
        return explicit
    suffix = stack.removeprefix(config.name)
    return f"{explicit}{suffix}" if explicit else f"gpufleet-{stack}"


def total_gpus(specs: tuple[GpuPoolSpec, ...]) -> tuple[int, int]:
    """(min, max) GPUs across pools, for the cluster table."""
    return (sum(s.min_total_nodes * s.gpus_per_node for s in specs), sum(s.capacity_gpus for s in specs))


# Kubernetes service accounts every tenant namespace gets; the infra stack binds the tenant's
# GCP service account to WORKLOAD_KSA by name, so both stacks must agree on it.
WORKLOAD_KSA = "training"
CONTROLLER_KSA = "gpufleet-controller"
TENANT_LABEL = "gpufleet.dev/tenant"
# The tenant namespace's LimitRange default request for a container that states none (Kueue and
# the scheduler count it): e.g. the GPUDirect RxDM sidecar, which upstream ships without requests.
DEFAULT_CONTAINER_CPU_MILLICORES = 1000
DEFAULT_CONTAINER_MEMORY_MIB = 4096


@dataclass(frozen=True)
class TenantSpec:
    """A tenant as both schedulers see it: namespace, members, per-pool GPU quota, GCP identity."""

    name: str
    namespace: str
    groups: tuple[str, ...]
    gpu_quota: tuple[tuple[str, int], ...]
    gcp_account_id: str | None
    gcp_roles: tuple[str, ...]

    @property
    def total_gpus(self) -> int:
        return sum(q for _, q in self.gpu_quota)


def tenant_gpu_pools(tenant: TenantSpec, pools: tuple[GpuPoolSpec, ...]) -> tuple[GpuPoolSpec, ...]:
    """Pools the tenant can ever be admitted on: those it has quota on, and overcommitted pools it may borrow on."""
    quotas = dict(tenant.gpu_quota)
    return tuple(p for p in pools if quotas.get(p.name, 0) > 0 or p.overcommit)


def tenant_account_id(cluster: str, tenant: str) -> str:
    """GCP service account ids are project-wide and 6-30 characters; the cluster prefix avoids clashes."""
    return f"{cluster}-{tenant}"


def derive_tenants(config: ClusterConfig) -> tuple[TenantSpec, ...]:
    """Tenants in name order, so namespaces, bindings and queues synthesize in a stable order."""
    return tuple(
        TenantSpec(
            name=t.name,
            namespace=t.name,
            groups=tuple(sorted(t.groups)),
            gpu_quota=tuple(sorted(t.gpu_quota.items())),
            gcp_account_id=tenant_account_id(config.name, t.name) if t.service_account is not None else None,
            gcp_roles=tuple(sorted(set(t.service_account.roles))) if t.service_account is not None else (),
        )
        for t in sorted(config.tenants, key=lambda t: t.name)
    )


def dns_record_address(name: str) -> str:
    """Terraform address of a DNS record: '@' and '*' spelled out, '.' and '-' become '_' as in every address.

    Pure, so the cross-checks can refuse two names that would collapse into one address.
    """
    return "dns_" + re.sub(r"[.-]", "_", name.replace("@", "apex").replace("*", "wildcard"))


def iam_role_key(role: str) -> str:
    """``roles/container.developer`` -> ``container_developer``: the role part of IAM addresses."""
    return role.rsplit("/", 1)[-1].replace(".", "_")


def grant_address(role: str, member: str) -> str:
    """Address of one reviewed grant, from the whole member: 'ml@a.example.com' and 'ml@b.example.com' stay two grants."""
    return f"grant_{iam_role_key(role)}_{re.sub(r'[^a-z0-9_]', '_', member.lower())}"


class NomadRole(StrEnum):
    SERVER = "server"
    CLIENT = "client"


@dataclass(frozen=True)
class NomadSecretSpec:
    """One Secret Manager secret an agent reads at boot. Terraform creates the empty secret and
    its IAM; the bootstrap adds the value as a version, so no key is ever in a file, the
    synthesized JSON or Terraform state."""

    name: str
    secret_id: str
    path: str
    readers: tuple[NomadRole, ...]
    purpose: str


NOMAD_TLS_DIR = "/etc/nomad.d/tls"
# Created after `nomad acl bootstrap` (README), so the TLS bootstrap script does not make it.
AUTOSCALER_TOKEN = "autoscaler-token"
NOMAD_GOSSIP_FILE = "/etc/nomad.d/gossip.hcl"
# (name, file on the agent, who reads it, what it is). The CA key is never among them: it
# stays with the operator who ran the bootstrap (offline or in a separate, operator-only secret).
_NOMAD_SECRETS = (
    ("ca-cert", f"{NOMAD_TLS_DIR}/ca.pem", (NomadRole.SERVER, NomadRole.CLIENT), "CA certificate every agent verifies peers against"),
    ("server-cert", f"{NOMAD_TLS_DIR}/agent.pem", (NomadRole.SERVER,), "server certificate, SAN server.<region>.nomad"),
    ("server-key", f"{NOMAD_TLS_DIR}/agent-key.pem", (NomadRole.SERVER,), "server private key"),
    ("client-cert", f"{NOMAD_TLS_DIR}/agent.pem", (NomadRole.CLIENT,), "client certificate, SAN client.<region>.nomad"),
    ("client-key", f"{NOMAD_TLS_DIR}/agent-key.pem", (NomadRole.CLIENT,), "client private key"),
    ("gossip-key", NOMAD_GOSSIP_FILE, (NomadRole.SERVER,), "gossip (Serf) encryption key, 32 random bytes base64"),
    ("autoscaler-token", "", (NomadRole.SERVER,), "ACL token (policy gpufleet-autoscaler) of the Nomad Autoscaler on the servers"),
)


def derive_nomad_secrets(config: ClusterConfig) -> tuple[NomadSecretSpec, ...]:
    """The secrets of a Nomad cluster; with ``existing_servers`` only what its clients read."""
    has_servers = config.nomad is not None and not config.nomad.existing_servers
    autoscaled = has_servers and config.nomad is not None and config.nomad.autoscaler is not None
    return tuple(
        NomadSecretSpec(name, f"{config.name}-nomad-{name}", path, readers, purpose)
        for name, path, readers, purpose in _NOMAD_SECRETS
        if (has_servers or NomadRole.CLIENT in readers) and (name != AUTOSCALER_TOKEN or autoscaled)
    )


def nomad_secrets_for(secrets: tuple[NomadSecretSpec, ...], role: NomadRole) -> tuple[NomadSecretSpec, ...]:
    return tuple(s for s in secrets if role in s.readers)


@dataclass(frozen=True)
class NomadServerGroupSpec:
    """One zonal server group. Zonal groups of one or two servers, not one regional group: a
    regional group's fixed max_unavailable is at least its zone count, so a rolling replace
    could take a majority; here a group never has more than one server down."""

    zone: str
    size: int

    @property
    def suffix(self) -> str:
        return self.zone.rsplit("-", 1)[-1]


@dataclass(frozen=True)
class NomadServersSpec:
    count: int
    machine_type: str
    groups: tuple[NomadServerGroupSpec, ...]
    data_disk_gb: int
    protected: bool


def derive_nomad_servers(config: ClusterConfig) -> NomadServersSpec | None:
    """Servers spread round-robin over their zones (5 over 3 zones: 2, 2, 1), so losing any one
    zone leaves a majority. None when the file names existing servers."""
    nomad = config.nomad
    if nomad is None or nomad.existing_servers:
        return None
    servers = nomad.servers
    zones = tuple(dict.fromkeys(servers.zones or config.gcp.zones))
    sizes = [servers.count // len(zones) + (1 if i < servers.count % len(zones) else 0) for i in range(len(zones))]
    return NomadServersSpec(
        count=servers.count,
        machine_type=servers.machine_type,
        groups=tuple(NomadServerGroupSpec(z, n) for z, n in zip(zones, sizes, strict=True) if n > 0),
        data_disk_gb=servers.data_disk_gb,
        protected=config.environment != Environment.DEV,
    )


def nomad_task_group_name(pool: str, gpus: int) -> str:
    """``gpu-<pool>-x<gpus>``: Nomad's job-summary metrics carry the task group, not the node pool,
    so a pool's autoscaling policy finds the GPUs its runs want by this name
    (``constructs_lib.nomad_autoscaler.demand_query``); jobs name their group with it."""
    return f"gpu-{pool}-x{gpus}"
