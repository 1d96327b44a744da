"""The NCCL environment of a multi-node run on a GPUDirect pool, whichever scheduler starts it.

Everything is read from Google's vendored two-node NCCL tests (``clusters.gpudirect_upstream``):
the training container's own environment there, plus the NIC names NCCL must use
(gpudirect-tcpx/nccl-config.yaml for TCPX, gpudirect-tcpxo/README.md's Jan 9, 2026 release for
TCPXO). The platform sets these names, so ``jobs.checks`` refuses them in job files;
``jobs.k8s.gpudirect`` puts them into the pods. Scheduler-neutral, so the checks need no side.
"""

from __future__ import annotations

import re
from typing import Any

from clusters.families import GpuDirect
from clusters.gpudirect_upstream import NCCL_TESTS, TCPX_SOCKET_DIR, first

NVIDIA_LIB = "/usr/local/nvidia/lib64"
# The first extra NIC's name: pods attach the pool networks as eth1.. (jobs.k8s.gpudirect.interfaces).
FIRST_DATA_NIC = "eth1"

# transport -> (vendored NCCL test, its RxDM daemon container or None, the Network device mode pods attach)
UPSTREAM = {GpuDirect(transport): test for transport, test in NCCL_TESTS.items()}

TUNING_LINE = re.compile(r"^\s*-x (NCCL_[A-Z0-9_]+)=(\S+?)\s*\\?$")


def tcpx_tuning() -> list[dict[str, str]]:
    """The NCCL settings upstream's TCPX test passes (``-x NAME=value`` in the vendored
    gpudirect-tcpx/nccl-config.yaml ``run-nccl.sh``): algorithm, chunk and buffer sizes, socket
    threads, the per-NIC TX/RX CPU bindings (named eth1..eth4, the NIC names ``interfaces`` gives a
    TCPX pod) and the flow-steering wait. TCPX ships no env profile script, unlike TCPXO and RDMA;
    without these NCCL runs over the NICs far below their bandwidth."""
    script = first("nccl-config-tcpx", "ConfigMap")["data"]["run-nccl.sh"]
    found = [m.groups() for line in script.splitlines() if (m := TUNING_LINE.match(line))]
    if not found:
        raise ValueError("vendored nccl-config-tcpx.yaml run-nccl.sh passes no NCCL settings; upstream moved: re-read it")
    return [{"name": name, "value": value.strip('"')} for name, value in found]


def nic_env(transport: GpuDirect, nics: list[str]) -> list[dict[str, str]]:
    """The variables that name the data NICs (``nics``) for NCCL on ``transport``."""
    joined = ",".join(nics)
    if transport is GpuDirect.TCPX:
        wired = [{"name": "NCCL_SOCKET_IFNAME", "value": "eth0"}, {"name": "NCCL_GPUDIRECTTCPX_CTRL_DEV", "value": "eth0"},
                 {"name": "NCCL_GPUDIRECTTCPX_SOCKET_IFNAME", "value": joined},
                 {"name": "NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX", "value": TCPX_SOCKET_DIR}]
        return wired + [e for e in tcpx_tuning() if e["name"] not in {w["name"] for w in wired}]
    if transport is GpuDirect.TCPXO:
        return [{"name": "NCCL_SOCKET_IFNAME", "value": "eth0"}, {"name": "NCCL_FASTRAK_CTRL_DEV", "value": "eth0"},
                {"name": "NCCL_FASTRAK_IFNAME", "value": joined}, {"name": "NCCL_LIB_DIR", "value": NVIDIA_LIB}]
    return []


def upstream_workload(transport: GpuDirect) -> dict[str, Any]:
    """The training (non-daemon) container of upstream's NCCL test pod for ``transport``."""
    name, daemon, _mode = UPSTREAM[transport]
    return next(c for c in first(name, "Pod")["spec"]["containers"] if c["name"] != daemon)


def reserved_env(transport: GpuDirect) -> tuple[str, ...]:
    """Environment names the platform sets for a multi-node run on this transport (job files may not)."""
    if transport not in UPSTREAM:
        return ()
    names = {e["name"] for e in upstream_workload(transport).get("env", [])}
    return tuple(sorted(names | {e["name"] for e in nic_env(transport, [FIRST_DATA_NIC])}))
