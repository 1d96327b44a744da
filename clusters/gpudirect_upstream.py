"""Google's GPUDirect manifests, vendored verbatim in ``clusters/gpudirect_manifests`` (provenance and
regeneration in its regenerate.py): the runtime DaemonSets the scheduler stack installs
(constructs_lib/gpudirect_runtime.py) and the NCCL test pods whose RxDM sidecar, annotations,
volumes and NCCL environment a job on such a pool copies (jobs/k8s/gpudirect.py). One source for both,
so the sidecar version always matches the plugin installer version it was released with."""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path
from typing import Any

MANIFESTS_DIR = Path(__file__).resolve().parent / "gpudirect_manifests"
# transport value -> (vendored NCCL test, its RxDM daemon container or None, the Network device mode pods attach)
NCCL_TESTS = {
    "tcpx": ("nccl-test-tcpx", "tcpx-daemon", "NetDevice"),
    "tcpxo": ("nccl-test-tcpxo", "tcpxo-daemon", "NetDevice"),
    "rdma": ("nccl-test-rdma", None, "RDMA"),
}


@cache
def _documents(name: str) -> tuple[dict[str, Any], ...]:
    from ruamel.yaml import YAML

    yaml = YAML(typ="safe", pure=True)
    # gpudirect-rdma/nccl-test.yaml repeats `resources:` in its test container; gpufleet reads
    # only that pod's volumes, mounts and environment, never the repeated key.
    yaml.allow_duplicate_keys = True
    return tuple(d for d in yaml.load_all((MANIFESTS_DIR / f"{name}.yaml").read_text()) if d)


def documents(name: str) -> list[dict[str, Any]]:
    """The vendored file's YAML documents (a fresh copy the caller may change)."""
    return copy.deepcopy(list(_documents(name)))


def first(name: str, kind: str) -> dict[str, Any]:
    """The first document of ``kind`` (a fresh copy; only that one is copied: every cluster's admission
    policies read these files several times); raises if upstream no longer has one."""
    found = [d for d in _documents(name) if d.get("kind") == kind]
    if not found:
        raise ValueError(f"vendored {name}.yaml has no {kind}; upstream moved: re-read it before regenerating")
    return copy.deepcopy(found[0])


def rxdm_sidecars() -> tuple[dict[str, Any], ...]:
    """The RxDM daemon containers of the vendored NCCL tests, as upstream writes them (image,
    command, args, capabilities): the only containers a tenant pod may run with more than the
    baseline Pod Security Standard allows (constructs_lib/k8s_queue_policy.py)."""
    found = []
    for test, daemon, _mode in NCCL_TESTS.values():
        if daemon is not None:
            found.append(next(c for c in first(test, "Pod")["spec"]["containers"] if c["name"] == daemon))
    return tuple(found)


def host_paths() -> tuple[str, ...]:
    """Every hostPath a vendored NCCL test pod mounts (a superset of what a job copies)."""
    return tuple(sorted({v["hostPath"]["path"] for test, _d, _m in NCCL_TESTS.values()
                         for v in first(test, "Pod")["spec"].get("volumes", []) if "hostPath" in v}))


# gpufleet's one deviation in a workload container's mounts: TCPX's socket directory at /run/tcpx
# (upstream mounts it over /tmp, which here is the run's own emptyDir; jobs/k8s/gpudirect.py).
TCPX_SOCKET_DIR = "/run/tcpx"
# Host directories of the driver and NCCL plugin libraries that GKE also mounts into the next
# tenant's GPU containers: a tenant container may mount them only read-only.
LIBRARY_DIRS = ("/home/kubernetes/bin/nvidia", "/home/kubernetes/bin/gib")


def _host_mounts(container: dict[str, Any], volumes: dict[str, dict[str, Any]]) -> set[tuple[str, str]]:
    return {(volumes[m["name"]]["hostPath"]["path"], m["mountPath"]) for m in container.get("volumeMounts", [])
            if "hostPath" in volumes[m["name"]]}


def workload_host_mounts() -> tuple[tuple[str, str], ...]:
    """(host path, mount path) pairs the vendored NCCL tests' workload containers mount, plus the
    TCPX socket directory at TCPX_SOCKET_DIR: all any container other than RxDM may mount."""
    pairs = set()
    for test, daemon, _mode in NCCL_TESTS.values():
        spec = first(test, "Pod")["spec"]
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for container in spec["containers"]:
            if container["name"] != daemon:
                pairs |= _host_mounts(container, volumes)
    pairs.add((TCPX_SOCKET_DIR, TCPX_SOCKET_DIR))
    return tuple(sorted(pairs))


def sidecar_host_mounts() -> dict[str, tuple[tuple[str, str], ...]]:
    """RxDM daemon image -> the (host path, mount path) pairs upstream's daemon container mounts
    (``/sys`` and ``/proc/sys`` among them: only this exact container may mount those)."""
    found = {}
    for test, daemon, _mode in NCCL_TESTS.values():
        if daemon is None:
            continue
        spec = first(test, "Pod")["spec"]
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        container = next(c for c in spec["containers"] if c["name"] == daemon)
        found[container["image"]] = tuple(sorted(_host_mounts(container, volumes)))
    return found


# The container name gpufleet gives a run's training container (jobs.spec.TASK; a test pins them equal):
# the only container besides RxDM that may hold a capability upstream gives its own workload container.
WORKLOAD_CONTAINER = "train"


def workload_capabilities() -> dict[str, tuple[str, ...]]:
    """Transport -> the capabilities upstream's NCCL test adds to its workload (non-RxDM) container,
    read from the vendored Pod, never typed: TCPX adds IPC_LOCK (gpudirect-tcpx/nccl-test-latest.yaml
    lines 103-106 at the vendored commit); TCPXO adds none (its securityContext is commented out,
    gpudirect-tcpxo/nccl-test-latest.yaml lines 110-111); RDMA sets no securityContext at all
    (gpudirect-rdma/nccl-test.yaml lines 65-89)."""
    found = {}
    for transport, (test, daemon, _mode) in NCCL_TESTS.items():
        workload = next(c for c in first(test, "Pod")["spec"]["containers"] if c["name"] != daemon)
        found[transport] = tuple(sorted((workload.get("securityContext") or {}).get("capabilities", {}).get("add", [])))
    return found


def daemon_of(transport: str) -> dict[str, Any] | None:
    """The vendored RxDM daemon container of ``transport``'s NCCL test, or None (RDMA has none)."""
    test, daemon, _mode = NCCL_TESTS[transport]
    if daemon is None:
        return None
    return next(c for c in first(test, "Pod")["spec"]["containers"] if c["name"] == daemon)


def device_annotations() -> dict[str, str]:
    """Upstream's ``devices.gke.io/container.<daemon>`` annotations (key -> value) of the NCCL tests:
    the host devices GKE's NRI injector gives each RxDM daemon, and the only ones a tenant pod may ask for."""
    found = {}
    for test, daemon, _mode in NCCL_TESTS.values():
        if daemon is not None:
            annotations = first(test, "Pod")["metadata"].get("annotations", {})
            key = f"devices.gke.io/container.{daemon}"
            found[key] = annotations[key]
    return found
