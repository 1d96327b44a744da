"""The GPU machine table: which accelerator and how many GPUs each GCE machine type carries,
and what the NVIDIA device plugin reports for each GPU model.

From ../shared/REFERENCE.md (GKE accelerators). A/G/A3/A4 series fix the accelerator and count
by machine type; N1 machines take a T4 count chosen by the user (1, 2 or 4). ``gpu_memory_gib``
is the marketing size, for descriptions only; placement compares ``NVML_GPUS`` values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class MachineGpu:
    accelerator: str
    gpus: int
    gpu_memory_gib: int
    model: str


_A100_40 = ("nvidia-tesla-a100", 40, "A100-SXM4-40GB")
_A100_80 = ("nvidia-a100-80gb", 80, "A100-SXM4-80GB")
_H100 = ("nvidia-h100-80gb", 80, "H100-80GB-HBM3")

MACHINE_GPUS: dict[str, MachineGpu] = {
    **{f"g2-standard-{n}": MachineGpu("nvidia-l4", 1, 24, "L4") for n in (4, 8, 12, 16, 32)},
    "g2-standard-24": MachineGpu("nvidia-l4", 2, 24, "L4"),
    "g2-standard-48": MachineGpu("nvidia-l4", 4, 24, "L4"),
    "g2-standard-96": MachineGpu("nvidia-l4", 8, 24, "L4"),
    **{f"a2-highgpu-{n}g": MachineGpu(_A100_40[0], n, _A100_40[1], _A100_40[2]) for n in (1, 2, 4, 8)},
    "a2-megagpu-16g": MachineGpu(_A100_40[0], 16, _A100_40[1], _A100_40[2]),
    **{f"a2-ultragpu-{n}g": MachineGpu(_A100_80[0], n, _A100_80[1], _A100_80[2]) for n in (1, 2, 4, 8)},
    **{f"a3-highgpu-{n}g": MachineGpu(_H100[0], n, _H100[1], _H100[2]) for n in (1, 2, 4, 8)},
    "a3-megagpu-8g": MachineGpu("nvidia-h100-mega-80gb", 8, 80, "H100-MEGA-80GB-HBM3"),
    "a3-ultragpu-8g": MachineGpu("nvidia-h200-141gb", 8, 141, "H200-141GB-HBM3e"),
    "a4-highgpu-8g": MachineGpu("nvidia-b200", 8, 180, "B200-180GB-HBM3e"),
}

N1_ACCELERATOR = "nvidia-tesla-t4"
N1_GPU_CHOICES = (1, 2, 4)
N1_GPU_MEMORY_GIB = 16
N1_MODEL = "Tesla-T4"


def is_n1(machine_type: str) -> bool:
    return machine_type.startswith("n1-")


@dataclass(frozen=True)
class NvmlGpu:
    """What the NVIDIA device plugin fingerprints for one GPU model (nomad-device-nvidia
    fingerprint.go: ``${device.model}`` is NVML's device name, ``${device.attr.memory}`` NVML's
    total memory in MiB), with where the number comes from. Jobs compare against these, never
    against the marketing size (an L4 is sold as 24 GB and reports 23034 MiB = 22.49 GiB)."""

    nvml_name: str
    memory_mib: int
    source: str
    # False where no public NVML/nvidia-smi output was found: ``check`` then refuses memory
    # constraints on such pools instead of guessing (the pool's node_class already picks the GPU).
    memory_confirmed: bool = True

    # A regexp for ``${device.model}`` that matches this NVML name whatever vendor prefix a driver
    # release puts in front ("Tesla T4" vs "NVIDIA T4"), and no other model in the table.
    model_pattern: str = ""

    def matches(self, name: str) -> bool:
        return re.search(self.model_pattern, name) is not None


_MODAL = "modal.com blog 'GPU memory capacity' (thundergolfer.com/blog/nvidia-gpu-memory-capacity): NVML via nvidia-smi"
NVML_GPUS: dict[str, NvmlGpu] = {
    "nvidia-tesla-t4": NvmlGpu("Tesla T4", 15360, _MODAL, model_pattern=r"(^|\s)T4$"),
    "nvidia-l4": NvmlGpu("NVIDIA L4", 23034, _MODAL + "; REFERENCE.md (public nvidia-smi on GCE g2)", model_pattern=r"(^|\s)L4$"),
    "nvidia-tesla-a100": NvmlGpu("NVIDIA A100-SXM4-40GB", 40960, _MODAL + "; REFERENCE.md (public nvidia-smi on GCE a2)",
                                 model_pattern=r"A100-SXM4-40GB$"),
    "nvidia-a100-80gb": NvmlGpu("NVIDIA A100-SXM4-80GB", 81920, _MODAL, model_pattern=r"A100-SXM4-80GB$"),
    "nvidia-h100-80gb": NvmlGpu("NVIDIA H100 80GB HBM3", 81559, _MODAL, model_pattern=r"H100 80GB HBM3$"),
    "nvidia-h100-mega-80gb": NvmlGpu("NVIDIA H100 80GB HBM3", 81559, "the H100 80GB HBM3 part of A3 High (GCE GPU docs: A3 Mega"
                                     " attaches H100 80GB Mega GPUs); not observed on a3-megagpu", memory_confirmed=False,
                                     model_pattern=r"H100 80GB HBM3$"),
    "nvidia-h200-141gb": NvmlGpu("NVIDIA H200", 143771, _MODAL, model_pattern=r"(^|\s)H200$"),
    "nvidia-b200": NvmlGpu("NVIDIA B200", 183359, "not confirmed from a public NVML output (HBM3e, sold as 180 GB)",
                           memory_confirmed=False, model_pattern=r"(^|\s)B200$"),
}


@dataclass(frozen=True)
class MachineShape:
    """vCPUs and memory of a machine type: the ceiling for what one job on one node can ask for."""

    vcpus: int
    memory_gib: float


# From the Compute Engine machine-type catalog as SkyPilot publishes it (github.com/skypilot-org/
# skypilot-catalog, catalogs/v8/gcp/vms.csv at 006059e0f18a, columns vCPUs and MemoryGiB), read
# 2026-12-03. G2 and N1 follow their series' fixed ratio (G2: 4 GiB per vCPU, checked on
# g2-standard-8/48/96; N1: standard 3.75, highmem 6.5, highcpu 0.9 GiB per vCPU).
_SHAPES: dict[str, MachineShape] = {
    **{f"a2-highgpu-{n}g": MachineShape(12 * n, 85.0 * n) for n in (1, 2, 4, 8)},
    "a2-megagpu-16g": MachineShape(96, 1360.0),
    **{f"a2-ultragpu-{n}g": MachineShape(12 * n, 170.0 * n) for n in (1, 2, 4, 8)},
    **{f"a3-highgpu-{n}g": MachineShape(26 * n, 234.0 * n) for n in (1, 2, 4, 8)},
    "a3-megagpu-8g": MachineShape(208, 1872.0),
    "a3-ultragpu-8g": MachineShape(224, 2952.0),
    "a4-highgpu-8g": MachineShape(224, 3968.0),
    **{f"g2-standard-{n}": MachineShape(n, 4.0 * n) for n in (4, 8, 12, 16, 24, 32, 48, 96)},
}
_N1_GIB_PER_VCPU = {"standard": 3.75, "highmem": 6.5, "highcpu": 0.9}


def machine_shape(machine_type: str) -> MachineShape | None:
    """vCPUs and memory of a GPU machine type (or an N1 predefined type); None when unknown."""
    if machine_type in _SHAPES:
        return _SHAPES[machine_type]
    parts = machine_type.split("-")
    if len(parts) == 3 and parts[0] == "n1" and parts[1] in _N1_GIB_PER_VCPU and parts[2].isdigit():
        vcpus = int(parts[2])
        return MachineShape(vcpus, _N1_GIB_PER_VCPU[parts[1]] * vcpus)
    return None


def machine_series(machine_type: str) -> str | None:
    """The series the zone table lists (A2, A3, A4, G2, N1) for a GPU machine type."""
    prefix = machine_type.split("-", 1)[0].upper()
    return prefix if prefix in ("A2", "A3", "A4", "G2", "N1") else None

# GKE Standard node reservations ("Plan GKE node sizes", memory and CPU reservations):
# memory 25% of the first 4 GiB, 20% of the next 4, 10% of the next 8, 6% of the next 112,
# 2% above 128 GiB, plus a 100 MiB eviction threshold; CPU 6% of the first core, 1% of the
# next, 0.5% of the next 2, 0.25% above 4.
_MEMORY_STEPS = ((4.0, 0.25), (4.0, 0.20), (8.0, 0.10), (112.0, 0.06), (float("inf"), 0.02))
_CPU_STEPS = ((1.0, 0.06), (1.0, 0.01), (2.0, 0.005), (float("inf"), 0.0025))
EVICTION_THRESHOLD_MIB = 100


def _reserved(total: float, steps: tuple[tuple[float, float], ...]) -> float:
    reserved, left = 0.0, total
    for size, share in steps:
        part = min(left, size)
        reserved += part * share
        left -= part
        if left <= 0:
            break
    return reserved


def gke_allocatable(machine_type: str) -> tuple[int, int] | None:
    """(millicores, MiB) a pod can request on a GKE node of this type before DaemonSets; None if unknown."""
    shape = machine_shape(machine_type)
    if shape is None:
        return None
    millicores = int((shape.vcpus - _reserved(shape.vcpus, _CPU_STEPS)) * 1000)
    mib = int((shape.memory_gib - _reserved(shape.memory_gib, _MEMORY_STEPS)) * 1024) - EVICTION_THRESHOLD_MIB
    return millicores, mib
