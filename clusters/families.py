"""What a GPU machine family needs beyond its GPUs: boot disk types, bundled local SSDs, GPUDirect networking.

Every row names its source. "toolkit" is GoogleCloudPlatform/cluster-toolkit at 1047080375afbb44
(v1.95.0 RC); "review" is ../shared/reviews/infra-review.md. These fields are immutable on a GKE
node pool (ForceNew at google provider 6.50.0), so they are derived before the first apply
instead of being left for someone to remember.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum


class GpuDirect(StrEnum):
    """The multi-NIC GPU-to-GPU transport a machine type is built for."""

    NONE = "none"
    TCPX = "tcpx"    # a3-highgpu-8g: 4 extra gVNIC VPCs
    TCPXO = "tcpxo"  # a3-megagpu-8g: 8 extra gVNIC VPCs
    RDMA = "rdma"    # a3-ultragpu-8g, a4-highgpu-8g: 1 extra gVNIC VPC + an RDMA (RoCE) VPC with 8 subnets


@dataclass(frozen=True)
class Family:
    """Per machine family: allowed boot disk types (first is the default), bundled local SSDs, GPUDirect."""

    prefixes: tuple[str, ...]
    boot_disk_types: tuple[str, ...]
    local_ssd_count: int | None
    gpudirect: GpuDirect
    gvnic_networks: int
    rdma_subnets: int


# Boot disks:
# - a3-ultragpu / a4: Hyperdisk only. Vertex AI's DiskSpec reference: "for A3U machines, the
#   default value is hyperdisk-balanced"; the toolkit's A4X blueprints set disk_type
#   hyperdisk-balanced; the review (A3) asks to refuse pd-* on these families. GKE's own
#   rejection of pd-* could not be confirmed offline: the refusal is the safe side (a pool
#   whose first node never boots costs more than a pd-ssd default that is never used).
# - a3-highgpu / a3-megagpu: pd-ssd stays the default (what deployed pools already have:
#   disk_type is ForceNew); pd-balanced and hyperdisk-balanced are allowed.
# - a2 / g2 / n1: Persistent Disk only; Hyperdisk Balanced is not offered on these series
#   (N1 supports no Hyperdisk at all; A2/G2 support is limited to other Hyperdisk types).
# Local SSD: toolkit modules/compute/gke-node-pool/disk_definitions.tf (local_ssd_machines).
# GPUDirect: toolkit modules/compute/gke-node-pool/gpu_direct.tf (min_additional_networks 4
# for a3-highgpu-8g, 8 for a3-megagpu-8g); examples/gke-a3-ultragpu/gke-a3-ultragpu.yaml (one
# extra gVNIC VPC plus gpu-rdma-vpc with 8 subnets and the zone's vpc-roce network profile).
_PD = ("pd-ssd", "pd-balanced")
FAMILIES: tuple[Family, ...] = (
    Family(("a4-highgpu-8g",), ("hyperdisk-balanced",), 32, GpuDirect.RDMA, 1, 8),
    Family(("a3-ultragpu-8g",), ("hyperdisk-balanced",), 32, GpuDirect.RDMA, 1, 8),
    Family(("a3-megagpu-8g",), (*_PD, "hyperdisk-balanced"), 16, GpuDirect.TCPXO, 8, 0),
    Family(("a3-highgpu-8g",), (*_PD, "hyperdisk-balanced"), 16, GpuDirect.TCPX, 4, 0),
    Family(("a3-highgpu-",), (*_PD, "hyperdisk-balanced"), None, GpuDirect.NONE, 0, 0),
    Family(("a4-", "a3-ultragpu-"), ("hyperdisk-balanced",), None, GpuDirect.NONE, 0, 0),
    Family(("a2-", "g2-", "n1-"), _PD, None, GpuDirect.NONE, 0, 0),
)
# Jumbo frames on every GPUDirect gVNIC VPC: toolkit examples/gke-a3-highgpu and gke-a3-megagpu
# (mtu: 8244); the RDMA VPC keeps the toolkit gpu-rdma-vpc default (8896).
GPUDIRECT_MTU = 8244
RDMA_MTU = 8896
# Each GPUDirect subnet is a /20 of gcp.gpudirect_cidr (toolkit multivpc subnetwork_cidr_suffix: 20):
# 8 gVNIC networks at most, then 8 RDMA subnets, so the range must hold 16 of them (a /16).
GPUDIRECT_SUBNET_PREFIX = 20
GPUDIRECT_RANGE_MAX_PREFIX = 16


def machine_family(machine_type: str) -> Family:
    """The first row whose prefix the machine type starts with (exact shapes are listed before their series)."""
    for family in FAMILIES:
        if machine_type.startswith(family.prefixes):
            return family
    return Family((machine_type,), _PD, None, GpuDirect.NONE, 0, 0)


# The runtime DaemonSets a transport needs on its nodes (vendored manifest stems in
# clusters/gpudirect_manifests, from GoogleCloudPlatform/container-engine-accelerators):
# toolkit modules/compute/gke-node-pool/gpu_direct.tf gpu_direct_manifests installs the NCCL
# TCPX/TCPXO plugin installer plus the NRI device injector (which the RxDM sidecar's
# devices.gke.io annotations need); examples/gke-a3-ultragpu and gke-a4 apply only the RDMA (gIB)
# NCCL installer. gpudirect-tcpx/nccl-config.yaml, also in that list, is the NCCL test's scripts,
# not runtime, and is left out.
GPUDIRECT_RUNTIME: dict[GpuDirect, tuple[str, ...]] = {
    GpuDirect.TCPX: ("nccl-tcpx-installer", "nri-device-injector"),
    GpuDirect.TCPXO: ("nccl-tcpxo-installer", "nri-device-injector"),
    GpuDirect.RDMA: ("nccl-rdma-installer",),
}

# Minimum GKE version per minor for a transport's plugin release: toolkit gpu_direct.tf
# major_minor_version_acceptable_map. Minors below the first key are refused, minors above the
# last accepted. (The toolkit reads it through a misspelt local, `gpu_direct_setting`, so its own
# check never fires; gpufleet applies the table as written.) RDMA has no table in the toolkit.
GPUDIRECT_MIN_GKE: dict[GpuDirect, dict[str, str]] = {
    GpuDirect.TCPX: {"1.27": "1.27.16-gke.2874000", "1.28": "1.28.15-gke.3163000", "1.29": "1.29.15-gke.2467000"},
    GpuDirect.TCPXO: {"1.28": "1.28.15-gke.3163000", "1.29": "1.29.15-gke.2467000", "1.30": "1.30.14-gke.1922000",
                      "1.31": "1.31.14-gke.1243000", "1.32": "1.32.11-gke.1174000"},
}
GKE_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)-gke\.(\d+)$")


def _version_key(version: str) -> tuple[int, ...]:
    match = GKE_VERSION.match(version)
    if match is None:
        raise ValueError(f"not a GKE version (1.X.Y-gke.Z): {version!r}")
    return tuple(int(p) for p in match.groups())


def gpudirect_min_gke_version(transport: GpuDirect, version: str) -> str | None:
    """The lowest GKE version the transport accepts at ``version``'s minor, or None when ``version`` is fine."""
    table = GPUDIRECT_MIN_GKE.get(transport)
    if not table:
        return None
    key = _version_key(version)
    floors = sorted(table.values(), key=_version_key)
    minor = f"{key[0]}.{key[1]}"
    if minor in table:
        return None if key >= _version_key(table[minor]) else table[minor]
    return floors[0] if key < _version_key(floors[0]) else None


# Topology-aware scheduling (Kueue TAS). The node labels GKE puts on the families placed in
# blocks / sub-blocks / hosts, outermost first, exactly as the Kueue Topology of the toolkit's
# A3 Mega configuration lists them (cluster-toolkit examples/gke-a3-megagpu/
# kueue-configuration.yaml.tftpl lines 16-24, Topology "gke-default"). The families: A3 Mega,
# A3 Ultra and A4 (google/xpk src/xpk/core/kueue_manager.py sets topologyName "gke-default" for
# H100 Mega, H200 and B200 flavors) and A3 High, whose toolkit v1.95.0 Kueue configuration
# defines the same Topology and names it on the a3-high flavor (examples/gke-a3-highgpu/
# kueue-configuration.yaml.tftpl:15-24 Topology, :33 topologyName). A2, G2 and N1 nodes carry
# no block labels: a Topology there would leave every pod unplaceable.
# Kueue v0.19.2 apis/kueue/v1beta2/topology_types.go:117 (CEL): kubernetes.io/hostname only as
# the lowest level.
TOPOLOGY_BLOCK = "cloud.google.com/gce-topology-block"
TOPOLOGY_SUBBLOCK = "cloud.google.com/gce-topology-subblock"
TOPOLOGY_HOST = "cloud.google.com/gce-topology-host"
HOSTNAME_LABEL = "kubernetes.io/hostname"
TOPOLOGY_LEVELS: tuple[str, ...] = (TOPOLOGY_BLOCK, TOPOLOGY_SUBBLOCK, TOPOLOGY_HOST, HOSTNAME_LABEL)
# What a job file writes (jobs.schema.JobFile.topology) -> the node label of that level.
TOPOLOGY_LEVEL_NAMES: dict[str, str] = {"block": TOPOLOGY_BLOCK, "subblock": TOPOLOGY_SUBBLOCK, "host": TOPOLOGY_HOST}


@dataclass(frozen=True)
class TopologyFamily:
    """A family placed in GCE blocks: its machine-type prefixes and how many of its nodes one domain of each level holds.

    ``nodes_per_host`` is 1 for every row: each is a whole-host -8g shape (8 GPUs, all of a
    physical host's), so two nodes never share a gce-topology-host. Nodes per sub-block and per
    block are not in any upstream file this repository could read (the toolkit and xpk leave
    them to the reservation): None, and ``check`` then bounds a required block or sub-block only
    by the pool's own size.
    """

    prefixes: tuple[str, ...]
    nodes_per_host: int = 1
    nodes_per_subblock: int | None = None
    nodes_per_block: int | None = None

    def nodes_per(self, level: str) -> int | None:
        return {"host": self.nodes_per_host, "subblock": self.nodes_per_subblock, "block": self.nodes_per_block}[level]


TOPOLOGY_FAMILIES: tuple[TopologyFamily, ...] = (
    TopologyFamily(("a3-megagpu-8g",)),
    TopologyFamily(("a3-highgpu-8g",)),
    TopologyFamily(("a3-ultragpu-8g",)),
    TopologyFamily(("a4-highgpu-8g",)),
)


def topology_family(machine_type: str) -> TopologyFamily | None:
    """The row for a machine type whose nodes carry GKE's topology labels, or None."""
    return next((f for f in TOPOLOGY_FAMILIES if machine_type.startswith(f.prefixes)), None)


# NVSwitch: the full-host shapes of A3 High/Mega/Ultra and A4 pass all eight GPUs and the HGX
# board's NVSwitches through to the VM, so the guest must run NVIDIA Fabric Manager before CUDA can
# use the GPUs (NVIDIA Fabric Manager User Guide: "on NVSwitch-based systems ... FM must be running";
# the R570 data center driver release notes ship "Fabric Manager: 570.133.20", the driver's own
# version). The smaller a3-highgpu-1g/2g/4g shapes get a share of a host whose NVSwitches the
# hypervisor manages, so no guest Fabric Manager is installed there.
NVSWITCH_MACHINES = ("a3-highgpu-8g", "a3-megagpu-8g", "a3-ultragpu-8g", "a4-highgpu-8g")


def needs_fabric_manager(machine_type: str) -> bool:
    return machine_type in NVSWITCH_MACHINES


# A Nomad client's bundled local SSDs, as one volume: mounted here on the host (the boot script), offered
# as the client host volume of this name, and mounted at the same path in every task on such a pool
# (jobs/nomad/render.py), so a job finds its scratch space at one path on every A3/A4 node.
LOCAL_SSD_VOLUME = "localssd"
LOCAL_SSD_MOUNT = "/mnt/localssd"


# The oldest NVIDIA data center driver branch per accelerator that gpufleet lets a Nomad client image
# bring (the image family names it: ubuntu-accelerator-2204-amd64-with-nvidia-<branch>). Blackwell
# (B200) is supported from R570 on (the first production branch that lists it); the default image's
# R550 supports H100 and H200. Accelerators not listed run on any branch the image ships.
MIN_DRIVER_BRANCH: dict[str, int] = {"nvidia-b200": 570}
IMAGE_DRIVER_BRANCH = re.compile(r"-with-nvidia-(\d+)(?=-|$)")


def image_driver_branch(image: str) -> int | None:
    """The NVIDIA driver branch an Ubuntu accelerator image family names, or None for another image."""
    match = IMAGE_DRIVER_BRANCH.search(image.rsplit("/", 1)[-1])
    return int(match.group(1)) if match else None
