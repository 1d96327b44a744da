"""GPU node pools: machine and accelerator, taints, labels, protection, queue names, GPU totals.

Pure derivations from a validated ClusterConfig; tests call them directly, constructs only read the
specs. Nothing here knows cdktf.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from clusters.derive.upgrades import UpgradeSpec, derive_upgrade
from clusters.families import GpuDirect, machine_family, topology_family
from clusters.machines import MACHINE_GPUS, N1_ACCELERATOR, N1_GPU_MEMORY_GIB, N1_MODEL, NVML_GPUS, NvmlGpu, is_n1
from clusters.reservation import ReservationSpec, derive_reservation
from clusters.schema import ClusterConfig, Environment, GpuPool, SchedulerKind, TaintEffect

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
    # Kueue topology-aware placement: the family's nodes carry GKE's block/sub-block/host labels
    # (clusters.families.TOPOLOGY_FAMILIES) and the pool can hold a multi-node run.
    topology_aware: bool = False

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


def min_nodes_of(pool: GpuPool, max_nodes: int) -> int:
    """An autoscaling pool's minimum: the file's ``min_nodes``; unset, 0, except on a specific
    reservation, which keeps its reserved nodes (``max_nodes``, what the reservation must hold:
    clusters.reservation.precondition) warm. The reservation bills those nodes whether or not they
    run, so scaling them to zero only adds a cold start to every run (issue 25). Google's cluster
    toolkit sizes a reserved pool the same way: its reserved A3 blueprints give the pool the
    reservation's node count (examples/gke-a3-megagpu/gke-a3-megagpu.yaml, vars ``static_node_count``
    beside ``reservation`` and pool ``a3_megagpu_pool`` with SPECIFIC_RESERVATION, commit c3fbd48d1bf2).
    """
    if pool.min_nodes is not None:
        return pool.min_nodes
    return max_nodes if pool.reservation else 0


@dataclass(frozen=True)
class ColdReservation:
    """A reserved autoscaling pool whose file asks for fewer warm nodes than it reserves."""

    index: int
    pool: str
    accelerator: str
    gpus_per_node: int
    min_nodes: int
    reserved_nodes: int

    @property
    def cold_gpus(self) -> int:
        return (self.reserved_nodes - self.min_nodes) * self.gpus_per_node


def cold_reservations(config: ClusterConfig) -> tuple[ColdReservation, ...]:
    """The reserved pools whose ``min_nodes`` is set below their reserved nodes (``gpufleet check`` warns
    with the price of the nodes paid for and left cold)."""
    found = []
    for index, (pool, spec) in enumerate(zip(config.gpu_pools, derive_gpu_pools(config))):
        if pool.reservation and spec.autoscaling and spec.min_total_nodes < spec.max_total_nodes:
            found.append(ColdReservation(index, spec.name, spec.accelerator, spec.gpus_per_node, spec.min_total_nodes, spec.max_total_nodes))
    return tuple(found)


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
    max_nodes = pool.node_count if static else (pool.max_nodes or 1)
    per_zone = config.scheduler == SchedulerKind.GKE
    total_max = max_nodes * len(pool.zones or config.gcp.zones) if static and per_zone else max_nodes
    return GpuPoolSpec(
        name=pool.name,
        machine_type=pool.machine_type,
        accelerator=accelerator,
        gpus_per_node=gpus,
        gpu_memory_gib=known.gpu_memory_gib if known else N1_GPU_MEMORY_GIB,
        gpu_model=known.model if known else N1_MODEL,
        nvml=NVML_GPUS[accelerator],
        node_count=pool.node_count,
        min_nodes=pool.node_count if static else min_nodes_of(pool, max_nodes),
        max_nodes=max_nodes,
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
        node_count_per_zone=per_zone,
        gpu_driver_version=pool.gpu_driver_version,
        local_ssd_count=family.local_ssd_count,
        # GPUDirect NICs are a GKE node-pool feature (check refuses gpudirect: true on Nomad); Nomad clients get one gVNIC.
        gpudirect=pool_gpudirect(pool) if per_zone else GpuDirect.NONE,
        upgrade=derive_upgrade(pool.reservation is not None, pool.queued_provisioning),
        # ANY fills unused reservations first and takes spot/DWS capacity wherever it is
        # (toolkit gke-node-pool/main.tf:120 always uses ANY); BALANCED spreads on-demand pools.
        location_policy="ANY" if pool.spot or pool.queued_provisioning or pool.reservation else "BALANCED",
        placement_policy_name=pool.placement_policy_name,
        host_maintenance_interval=pool.host_maintenance_interval,
        topology_aware=per_zone and total_max > 1 and topology_family(pool.machine_type) is not None,
        reservation_spec=derive_reservation(pool.reservation, config.gcp.project, (pool.zones or config.gcp.zones)[0]) if pool.reservation else None,
    )


def derive_gpu_pools(config: ClusterConfig) -> tuple[GpuPoolSpec, ...]:
    return tuple(derive_gpu_pool(p, config) for p in config.gpu_pools)


def total_gpus(specs: tuple[GpuPoolSpec, ...]) -> tuple[int, int]:
    """(min, max) GPUs across pools, for the cluster table."""
    return (sum(s.min_total_nodes * s.gpus_per_node for s in specs), sum(s.capacity_gpus for s in specs))
