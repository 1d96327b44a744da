"""GPUDirect networks: per-pool NIC networks and the runtime DaemonSets they need.

Pure derivations from a validated ClusterConfig; tests call them directly, constructs only read the
specs. Nothing here knows cdktf.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from clusters.derive.pools import GpuPoolSpec, TaintSpec, pool_gpudirect
from clusters.families import GPUDIRECT_RUNTIME, GPUDIRECT_SUBNET_PREFIX, GpuDirect, machine_family
from clusters.schema import ClusterConfig, SchedulerKind

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
