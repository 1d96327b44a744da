"""GPU utilization of Nomad runs: ``GET /v1/client/allocation/:alloc_id/stats`` (the server
forwards it to the client node running the allocation).

The answer is an ``AllocResourceUsage`` (hashicorp/nomad api/tasks.go:74, ``ResourceUsage`` at :58
with ``DeviceStats []*DeviceGroupStats``). The Nomad client fills each task's ``DeviceStats`` with
the stats of the devices allocated to that task (client/allocrunner/taskrunner/task_runner.go:1543).
A ``DeviceGroupStats`` (api/nodes.go:827) has ``Vendor``, ``Type``, ``Name`` and ``InstanceStats``
(device id -> ``DeviceStats`` with ``Summary``, ``Stats``, ``Timestamp``); a ``StatValue``
(api/nodes.go:862) carries ``IntNumeratorVal``/``IntDenominatorVal`` or ``StringVal``.

The NVIDIA device plugin (hashicorp/nomad-device-nvidia stats.go) reports vendor ``nvidia``
(device.go:27), type ``gpu``; ``Stats.Attributes["GPU utilization"]`` (stats.go:22, unit ``%``,
IntNumeratorVal) and ``Summary`` = the ``Memory state`` attribute (stats.go:40, :292: used MiB as
IntNumeratorVal over total MiB as IntDenominatorVal); a value NVML did not give is
``StringVal: "N/A"`` (device.go:34), which is unknown here, never 0. The endpoint needs ``read-job``
on the allocation's namespace (client/alloc_endpoint.go:170).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from jobs.usage import Usage, UsageUnavailable, combine

if TYPE_CHECKING:
    from jobs.nomad.client import NomadClient

log = logging.getLogger("gpufleet.jobs.usage")
GPU_UTILIZATION = "GPU utilization"
MEMORY_STATE = "Memory state"


def _number(value: Any) -> float | None:
    """A StatValue's numerator (int or float); None for "N/A" or absent."""
    if not isinstance(value, dict):
        return None
    for key in ("IntNumeratorVal", "FloatNumeratorVal"):
        if isinstance(value.get(key), (int, float)):
            return float(value[key])
    return None


def parse(answer: Mapping[str, Any]) -> Usage | None:
    """An AllocResourceUsage -> the run's sample over every NVIDIA GPU of the allocation."""
    groups = ((answer.get("ResourceUsage") or {}).get("DeviceStats")) or []
    per_gpu = []
    for group in groups:
        if (group or {}).get("Vendor") != "nvidia" or group.get("Type") != "gpu":
            continue
        for device in (group.get("InstanceStats") or {}).values():
            attributes = ((device or {}).get("Stats") or {}).get("Attributes") or {}
            memory = attributes.get(MEMORY_STATE) or device.get("Summary")
            per_gpu.append((_number(attributes.get(GPU_UTILIZATION)), _number(memory)))
    return combine(per_gpu)


def sample(client: NomadClient, allocations: Mapping[str, tuple[str, str]]) -> dict[str, Usage]:
    """``allocations``: run id -> (namespace, allocation id). One GET per allocation (the caller
    bounds how many per pass). A run whose GET fails or whose GPUs report nothing is left out
    (unknown); only when every GET failed is the source unavailable."""
    from jobs.nomad.client import NomadError

    out: dict[str, Usage] = {}
    failures: list[str] = []
    for run_id, (namespace, alloc_id) in allocations.items():
        try:
            usage = parse(client.allocation_stats(alloc_id, namespace))
        except NomadError as exc:
            failures.append(str(exc))
            continue
        if usage is not None:
            out[run_id] = usage
    if failures:
        log.warning("GPU stats of %d of %d Nomad allocations unavailable: %s", len(failures), len(allocations), failures[0])
        if len(failures) == len(allocations):
            raise UsageUnavailable(failures[0])
    return out
