"""GPUDirect runtime DaemonSets in the scheduler stack (review B6 second half, D1): Google's NCCL
plugin installers and NRI device injector, only on the pools whose machine type needs them."""

from __future__ import annotations

import re

import pytest

from clusters.derive.gpudirect import derive_gpudirect_daemonsets
from clusters.derive.pools import POOL_LABEL, derive_gpu_pools
from clusters.families import GpuDirect, gpudirect_min_gke_version
from clusters.gpudirect_manifests import regenerate
from clusters.gpudirect_upstream import MANIFESTS_DIR, first
from constructs_lib import gpudirect_runtime
from constructs_lib.gpudirect_runtime import accelerators_selected, daemonset
from jobs.k8s.schemas import errors

DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
VERSION_TAG = re.compile(r":v?\d+(\.\d+)+$")


@pytest.fixture(scope="module")
def configs(example_configs):
    return {c.name: c for c in example_configs}


def _daemonsets(stack_json, stack: str) -> dict[str, dict]:
    manifests = stack_json(stack)["resource"].get("kubernetes_manifest", {})
    # The GPUDirect runtime's only (the GPU health checker, ds_gpu_health, is tests/constructs_lib/test_gpu_health.py's).
    return {k: v["manifest"] for k, v in manifests.items() if v["manifest"]["kind"] == "DaemonSet" and k.startswith("gpudirect_")}


def _pod(manifest: dict) -> dict:
    return manifest["spec"]["template"]["spec"]


def _pool_selector(manifest: dict) -> list[str]:
    (term,) = _pod(manifest)["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return next(e["values"] for e in term["matchExpressions"] if e["key"] == POOL_LABEL and e["operator"] == "In")


@pytest.mark.parametrize(("stack", "expected"), [
    ("train-a3mega-scheduler", {"gpudirect_nccl_tcpxo_installer": ["h100-mega"], "gpudirect_nri_device_injector": ["h100-mega"]}),
    ("prod-gke-scheduler", {"gpudirect_nccl_tcpx_installer": ["h100"], "gpudirect_nri_device_injector": ["h100"]}),
    ("dev-gke-scheduler", {}),
])
def test_only_gpudirect_pools_get_the_runtime_and_only_on_their_nodes(stack_json, stack, expected):
    found = _daemonsets(stack_json, stack)
    assert {k: _pool_selector(m) for k, m in found.items()} == expected
    for m in found.values():
        assert m["metadata"]["namespace"] == "kube-system"
        # No blanket toleration (upstream's `operator: Exists` without a key tolerates every taint).
        assert all("key" in t and t["operator"] == "Equal" for t in _pod(m)["tolerations"])
        assert {(t["key"], t["effect"]) for t in _pod(m)["tolerations"]} == {("nvidia.com/gpu", "NoSchedule")}


def test_synthesized_daemonsets_pass_the_kubernetes_1_35_schema(stack_json):
    for stack in ("train-a3mega-scheduler", "prod-gke-scheduler"):
        for m in _daemonsets(stack_json, stack).values():
            assert errors(m) == []


def test_the_schema_check_can_fail(stack_json):
    m = _daemonsets(stack_json, "train-a3mega-scheduler")["gpudirect_nccl_tcpxo_installer"]
    broken = {**m, "spec": {**m["spec"], "template": {**m["spec"]["template"], "spec": {**_pod(m), "hostNetwrk": True}}}}
    assert errors(broken) and "hostNetwrk" in errors(broken)[0]


def test_every_image_is_pinned_to_a_digest_or_a_version_tag(stack_json):
    images = [c["image"] for stack in ("train-a3mega-scheduler", "prod-gke-scheduler")
              for m in _daemonsets(stack_json, stack).values()
              for c in [*_pod(m).get("initContainers", []), *_pod(m)["containers"]]]
    assert "us-docker.pkg.dev/gce-ai-infra/gpudirect-tcpxo/nccl-plugin-gpudirecttcpx-dev:v1.0.15" in images
    assert "us-docker.pkg.dev/gce-ai-infra/gpudirect-tcpx/nccl-plugin-gpudirecttcpx-dev:v3.1.9" in images
    unpinned = [i for i in images if not (DIGEST.search(i) or VERSION_TAG.search(i))]
    assert unpinned == [], unpinned


def test_vendored_manifests_carry_their_provenance():
    for name, path in regenerate.FILES.items():
        first = (MANIFESTS_DIR / f"{name}.yaml").read_text().splitlines()[0]
        assert first == f"# Vendored from {regenerate.REPO} {path} at commit {regenerate.COMMIT}"


def _variant(configs, *machines, **update):
    prod = configs["prod-gke"]
    pools = tuple(prod.gpu_pools[0].model_copy(update={"name": f"p{i}", "machine_type": m, "reservation": None, **update})
                  for i, m in enumerate(machines))
    return derive_gpu_pools(prod.model_copy(update={"gpu_pools": pools}))


@pytest.mark.parametrize(("machine", "names"), [
    ("a3-highgpu-8g", ["nccl-tcpx-installer", "nri-device-injector"]),
    ("a3-megagpu-8g", ["nccl-tcpxo-installer", "nri-device-injector"]),
    ("a3-ultragpu-8g", ["nccl-rdma-installer"]),
    ("a4-highgpu-8g", ["nccl-rdma-installer"]),
    ("a3-highgpu-4g", []),
    ("g2-standard-24", []),
])
def test_runtime_per_machine_type_reaches_its_accelerator(configs, machine, names):
    specs = derive_gpudirect_daemonsets(_variant(configs, machine))
    assert [s.name for s in specs] == names
    for spec in specs:
        manifest = daemonset(spec)  # raises if upstream's affinity would not select the pool's accelerator
        assert set(spec.accelerators) <= accelerators_selected(manifest)
        assert errors(manifest) == []


def test_a_shared_injector_covers_both_transports_and_opted_out_pools_get_nothing(configs):
    specs = {s.name: s for s in derive_gpudirect_daemonsets(_variant(configs, "a3-highgpu-8g", "a3-megagpu-8g"))}
    assert specs["nri-device-injector"].pools == ("p0", "p1")
    assert specs["nccl-tcpx-installer"].pools == ("p0",) and specs["nccl-tcpxo-installer"].pools == ("p1",)
    assert derive_gpudirect_daemonsets(_variant(configs, "a3-megagpu-8g", gpudirect=False)) == ()


def test_dws_pools_runtime_tolerates_gkes_queued_taint(configs):
    (spec, _) = derive_gpudirect_daemonsets(_variant(configs, "a3-megagpu-8g", queued_provisioning=True, node_count=None,
                                                     min_nodes=0, max_nodes=2))
    tolerations = _pod(daemonset(spec))["tolerations"]
    assert {"key": "cloud.google.com/gke-queued", "operator": "Exists", "effect": "NoSchedule"} in tolerations


def test_an_accelerator_upstream_does_not_select_is_refused(configs):
    from dataclasses import replace

    (spec, _) = derive_gpudirect_daemonsets(_variant(configs, "a3-megagpu-8g"))
    with pytest.raises(ValueError, match="does not select"):
        daemonset(replace(spec, accelerators=("nvidia-l4",)))


def test_the_one_unversioned_upstream_image_is_given_a_tag():
    upstream = first("nccl-tcpxo-installer", "DaemonSet")
    assert upstream["spec"]["template"]["spec"]["initContainers"][0]["image"] == "ubuntu"
    assert set(gpudirect_runtime.UNVERSIONED_IMAGES) == {"ubuntu"}


@pytest.mark.parametrize(("transport", "version", "floor"), [
    (GpuDirect.TCPXO, "1.32.11-gke.1174000", None),
    (GpuDirect.TCPXO, "1.32.11-gke.1173999", "1.32.11-gke.1174000"),
    (GpuDirect.TCPXO, "1.27.16-gke.9999999", "1.28.15-gke.3163000"),
    (GpuDirect.TCPXO, "1.35.0-gke.1", None),
    (GpuDirect.TCPX, "1.28.15-gke.3162000", "1.28.15-gke.3163000"),
    (GpuDirect.TCPX, "1.26.1-gke.1", "1.27.16-gke.2874000"),
    (GpuDirect.RDMA, "1.20.0-gke.1", None),
])
def test_toolkit_minimum_gke_versions(transport, version, floor):
    assert gpudirect_min_gke_version(transport, version) == floor
