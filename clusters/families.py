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
# constructs_lib/gpudirect_manifests, from GoogleCloudPlatform/container-engine-accelerators):
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
