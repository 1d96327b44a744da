"""What a multi-node run's pods need on a GPUDirect pool so NCCL uses the pool's extra NICs (review B6).

Without this, the pods see only eth0 and NCCL falls back to TCP on it (~4 GB/s instead of
~340 GB/s on A3 Mega). Everything is taken from Google's two-node NCCL tests, vendored with the
runtime DaemonSets from one container-engine-accelerators commit (``clusters/gpudirect_upstream``),
so the sidecar is always the release paired with the installed NCCL plugin:

- ``networking.gke.io/interfaces``: eth0 on the default network, then one interface per pool
  network of the transport's data kind, named as the scheduler stack's Network objects
  (``clusters.derive.gpudirect.derive_gpudirect``: one derivation for both), at the NIC's position in the
  node pool's ``additional_node_network_configs``;
- TCPX / TCPXO: upstream's RxDM daemon (``tcpx-daemon`` / ``tcpxo-daemon``) as a native sidecar
  (an init container with ``restartPolicy: Always``, so the Job completes when training exits),
  running as root with upstream's added capabilities and no seccomp filter (the pod runs as uid
  1000 under RuntimeDefault; only the sidecar differs), plus upstream's
  ``devices.gke.io/container.<daemon>`` annotation (the NRI device injector gives it the GPUs);
- the training container gets upstream's host-library / device mounts and environment, plus the
  NIC names NCCL must use (``jobs.nccl``, scheduler-neutral, so the job-file checks read the same
  names without importing this side). The release's tuning variables come from the plugin's
  ``${NCCL_LIB_DIR}/nccl-env-profile.sh`` (TCPXO) / ``/usr/local/gib/scripts/set_nccl_env.sh``
  (RDMA), which the job's entrypoint sources, as upstream documents.

Privileges, each from an upstream line (container-engine-accelerators at the vendored commit, CEA below;
tests/jobs/k8s/test_gpudirect_privileges.py holds the same table):

- training container, TCPX: ``IPC_LOCK`` added (CEA gpudirect-tcpx/nccl-test-latest.yaml:103-106, the
  ``nccl-test`` container). Why: the TCPX plugin sends with ``MSG_ZEROCOPY`` (google/nccl-plugin-gpudirecttcpx
  4b8ea7f2 src/net_tcpx.cc:158), and Linux charges zerocopy pages to the user's ``RLIMIT_MEMLOCK`` unless
  the process has CAP_IPC_LOCK (net/core/skbuff.c ``mm_account_pinned_pages``: ``-ENOBUFS`` past the
  limit), which the plugin retries like EAGAIN (src/net_tcpx.cc:195): a silent slowdown, not an error.
  TCPXO and RDMA: nothing added (CEA
  gpudirect-tcpxo/nccl-test-latest.yaml:110-111 has its securityContext commented out;
  gpudirect-rdma/nccl-test.yaml:65-89 sets none). Everything else stays dropped.
- training container, user: upstream never sets one (the images run as root), and none of its lines
  needs root: the RxDM sidecar sets ``umask(0)`` before it creates the TCPX Unix sockets
  (google/tcpgpudmarxd app/tcpgpudmarxd.cu:263, source v2.0.14; the pinned image is v2.0.12), so the
  sockets under ``/run/tcpx`` are mode 0777, and the plugin's client only ``connect()``s to them, never
  binds a file there (nccl-plugin-gpudirecttcpx src/rx_buf_mgr_client/unix_socket_client.cc:31-45), so
  uid 1000 needs no write on the directory,
  no ``fsGroup`` (which Kubernetes never applies to a hostPath anyway) and no supplemental group.
  gpufleet keeps uid 1000.
  Caveat, stated: Kubernetes does not raise an added capability into a non-root process's effective
  set (kubernetes/kubernetes#56374, open; containerd#5668 closed unmerged), so for uid 1000 ``IPC_LOCK``
  is only in the bounding set and pinning is bounded by the node's ``RLIMIT_MEMLOCK``. Whether that
  suffices only the hardware can tell: ``jobs/nccl-test-a3high.yaml`` prints ``ulimit -l`` and fails
  below the bandwidth upstream documents, which a TCP fallback cannot reach.
- RxDM sidecar: root (upstream sets no user, and a capability only works for root, as above),
  ``NET_ADMIN`` (TCPX: gpudirect-tcpx/nccl-test-latest.yaml:75-78), ``NET_ADMIN`` + ``NET_BIND_SERVICE``
  (TCPXO: gpudirect-tcpxo/nccl-test-latest.yaml:91-96), never ``privileged`` (commented out at :92),
  ``/sys`` and ``/proc/sys`` mounted (TCPX :84-87, TCPXO :100-103).

Deviations from upstream, all for the same run-once Job: TCPX's socket directory is mounted at
``/run/tcpx`` (upstream mounts it over ``/tmp``, which here is the run's own emptyDir) with
``NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX`` pointing there; upstream's ``imagePullPolicy: Always``
is kept for the sidecar (its tag is pinned).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from clusters.families import GpuDirect
from clusters.gpudirect_upstream import LIBRARY_DIRS, TCPX_SOCKET_DIR, first, workload_capabilities
from jobs.nccl import UPSTREAM, nic_env

INTERFACES_ANNOTATION = "networking.gke.io/interfaces"
DEFAULT_INTERFACE_ANNOTATION = "networking.gke.io/default-interface"
DEVICES_ANNOTATION_PREFIX = "devices.gke.io/container."

@dataclass(frozen=True)
class PodNetworking:
    """Additions to a run's pod template; ``env`` names are refused in job files (jobs.checks)."""

    annotations: dict[str, str]
    sidecars: list[dict[str, Any]]
    volumes: list[dict[str, Any]]
    mounts: list[dict[str, Any]]
    env: list[dict[str, str]] = field(default_factory=list)
    # Added to the training container's (otherwise all dropped) capabilities: upstream's, no more.
    capabilities: tuple[str, ...] = ()


def interfaces(transport: GpuDirect, networks: tuple[tuple[str, str], ...]) -> list[dict[str, str]]:
    """eth0 on the default network, then eth<i> for each pool network of the transport's data kind,
    ``i`` being its 1-based position among the node's extra NICs (A3 Ultra / A4: eth1 is the gVNIC
    network pods do not attach, the RDMA networks are eth2..eth9, as upstream's RDMA test)."""
    mode = UPSTREAM[transport][2]
    return [{"interfaceName": "eth0", "network": "default"}] + [
        {"interfaceName": f"eth{i}", "network": name} for i, (name, kind) in enumerate(networks, start=1) if kind == mode
    ]


def pod_networking(transport: GpuDirect, networks: tuple[tuple[str, str], ...]) -> PodNetworking | None:
    """What a pod of a multi-node run on a pool with ``transport`` adds; None without GPUDirect.
    ``networks`` are the pool's (Network object name, device mode) in NIC order."""
    if transport not in UPSTREAM:
        return None
    name, daemon, _mode = UPSTREAM[transport]
    pod = first(name, "Pod")
    spec = pod["spec"]
    by_name = {v["name"]: v for v in spec["volumes"]}
    workload = next(c for c in spec["containers"] if c["name"] != daemon)
    # Host libraries and devices only: upstream's configMap (test scripts) and /dev/shm emptyDir stay out.
    mounts = [dict(m) for m in workload.get("volumeMounts", []) if "hostPath" in by_name[m["name"]]]
    for mount in mounts:
        if transport is GpuDirect.TCPX and mount["name"] == "tcpx-socket":
            mount["mountPath"] = TCPX_SOCKET_DIR
        path = by_name[mount["name"]]["hostPath"]["path"]
        if any(path == d or path.startswith(d + "/") for d in LIBRARY_DIRS):
            # GKE mounts this host directory into the next tenant's GPU containers: read-only here
            # (the tenant privilege policy refuses a writable mount, k8s_queue_policy._mounts).
            mount["readOnly"] = True
    used = [m["name"] for m in mounts]
    sidecars, annotations = [], {}
    if daemon is not None:
        sidecar = next(c for c in spec["containers"] if c["name"] == daemon)
        capabilities = (sidecar.get("securityContext") or {}).get("capabilities", {})
        # Root with upstream's capabilities and no seccomp filter, as upstream runs it (the pod's
        # own context is uid 1000 + RuntimeDefault for the training container).
        sidecar["securityContext"] = {"capabilities": capabilities, "runAsUser": 0, "runAsNonRoot": False,
                                      "seccompProfile": {"type": "Unconfined"}}
        sidecar["restartPolicy"] = "Always"
        sidecars.append(sidecar)
        used += [m["name"] for m in sidecar.get("volumeMounts", []) if m["name"] not in used]
        key = DEVICES_ANNOTATION_PREFIX + daemon
        annotations[key] = pod["metadata"]["annotations"][key]
    nics = interfaces(transport, networks)
    annotations[DEFAULT_INTERFACE_ANNOTATION] = "eth0"
    annotations[INTERFACES_ANNOTATION] = json.dumps(nics, separators=(",", ":"))
    env = [{"name": e["name"], "value": e["value"]} for e in workload.get("env", [])]
    env += nic_env(transport, [n["interfaceName"] for n in nics[1:]])
    return PodNetworking(annotations=annotations, sidecars=sidecars, volumes=[by_name[v] for v in used], mounts=mounts, env=env,
                         capabilities=workload_capabilities()[transport.value])

