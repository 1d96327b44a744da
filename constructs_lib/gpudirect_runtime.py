"""The GPUDirect runtime DaemonSets (NCCL TCPX/TCPXO/RDMA plugin installers, NRI device injector), scheduler stack.

Without them a GPUDirect pool has its extra NICs but no NCCL net plugin on the host and no NRI
injector for the RxDM sidecar's device annotations, so multi-node NCCL falls back to TCP on eth0.
The manifests are Google's (vendored verbatim in ``clusters/gpudirect_manifests/``, provenance and
regeneration there, shared with the job renderer's RxDM sidecar); gpufleet changes only where they run:

- node affinity: upstream selects every node with a matching ``cloud.google.com/gke-accelerator``;
  gpufleet ANDs ``gpufleet.dev/gpu-pool In [the pools that need it]`` to that term, so an H100 pool
  that opted out of GPUDirect (or a Nomad-style pool of the same GPU) never runs these privileged pods;
- tolerations: upstream tolerates every taint (``operator: Exists``); gpufleet tolerates exactly the
  taints of those pools (the GPU taint, the file's taints, GKE's DWS taint);
- the one image upstream leaves unversioned (``ubuntu`` in the TCPXO installer's pre-installation
  step, which only provides ``nsenter`` into the host) gets an explicit tag (UNVERSIONED_IMAGES).

They run in ``kube-system`` (privileged, hostNetwork, hostPID as upstream); no tenant namespace
gains anything from them.
"""

from __future__ import annotations

from typing import Any

from constructs import Construct

from clusters.derive.gpudirect import GpuDirectDaemonSetSpec
from clusters.derive.pools import POOL_LABEL, QUEUED_LABEL
from clusters.gpudirect_upstream import first
from constructs_lib.kueue import TAINT_EFFECTS
from constructs_lib.naming import pin, tf_id
from constructs_lib.providers import kubernetes

NAMESPACE = "kube-system"
ACCELERATOR_LABEL = "cloud.google.com/gke-accelerator"
# Upstream image reference -> the reference gpufleet deploys. ubuntu:22.04 is the tag cluster-toolkit's
# GKE examples use (examples/gke-a3-ultragpu, gke-a4); a digest could not be resolved offline.
UNVERSIONED_IMAGES = {"ubuntu": "ubuntu:22.04"}


def _containers(pod_spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod_spec.get("initContainers", []), *pod_spec.get("containers", [])]


def daemonset(spec: GpuDirectDaemonSetSpec) -> dict[str, Any]:
    """The upstream DaemonSet, narrowed to ``spec.pools``; raises if upstream's shape moved under us."""
    manifest = first(spec.name, "DaemonSet")
    if manifest["metadata"].get("namespace") != NAMESPACE:
        raise ValueError(f"{spec.name}: upstream is no longer a kube-system DaemonSet; re-read it before regenerating")
    missing = set(spec.accelerators) - accelerators_selected(manifest)
    if missing:
        raise ValueError(f"{spec.name}: upstream does not select {sorted(missing)} (pools {', '.join(spec.pools)}); "
                         "the plugin would never reach those nodes")
    pod = manifest["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    if len(terms) != 1:
        raise ValueError(f"{spec.name}: upstream has {len(terms)} node selector terms; expected one to narrow")
    terms[0]["matchExpressions"].append({"key": POOL_LABEL, "operator": "In", "values": list(spec.pools)})
    tolerations = [{"key": t.key, "operator": "Equal", "value": t.value, "effect": TAINT_EFFECTS[t.effect]} for t in spec.taints]
    if spec.queued_provisioning:
        tolerations.append({"key": QUEUED_LABEL, "operator": "Exists", "effect": "NoSchedule"})
    pod["tolerations"] = tolerations
    for container in _containers(pod):
        container["image"] = UNVERSIONED_IMAGES.get(container["image"], container["image"])
    return manifest


def accelerators_selected(manifest: dict[str, Any]) -> set[str]:
    """The accelerator values upstream's node affinity admits (a pool outside them would get no plugin)."""
    term = manifest["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
    return {v for e in term["matchExpressions"] if e["key"] == ACCELERATOR_LABEL for v in e["values"]}


class GpuDirectRuntime(Construct):
    """One kubernetes_manifest per runtime DaemonSet the cluster's GPUDirect pools need."""

    def __init__(self, scope: Construct, id_: str, *, daemonsets: tuple[GpuDirectDaemonSetSpec, ...]) -> None:
        super().__init__(scope, id_)
        self.daemonsets = {
            d.name: pin(kubernetes.manifest.Manifest(self, tf_id(d.name), manifest=daemonset(d)), f"gpudirect_{tf_id(d.name)}")
            for d in daemonsets
        }
