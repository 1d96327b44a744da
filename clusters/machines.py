"""The GPU machine table: which accelerator and how many GPUs each GCE machine type carries.

From ../shared/REFERENCE.md (GKE accelerators). A/G/A3/A4 series fix the accelerator and count
by machine type; N1 machines take a T4 count chosen by the user (1, 2 or 4).
"""

from __future__ import annotations

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
