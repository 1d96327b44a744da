"""Kueue objects match the cluster file: a flavor per pool, pool capacity as quota, a LocalQueue per tenant."""

from __future__ import annotations

import pytest

from clusters.derive import derive_gpu_pools, derive_tenants
from constructs_lib.kueue import cluster_queue, local_queue, resource_flavor


@pytest.fixture(scope="module")
def manifests(stack_json):
    return {k: v["manifest"] for k, v in stack_json("prod-gke-scheduler")["resource"]["kubernetes_manifest"].items()}


@pytest.fixture(scope="module")
def prod(example_configs):
    return {c.name: c for c in example_configs}["prod-gke"]


def test_flavor_per_pool_selects_the_accelerator_and_tolerates_the_gpu_taint(manifests):
    h100 = manifests["kueue_flavor_h100"]
    assert (h100["apiVersion"], h100["kind"], h100["metadata"]["name"]) == ("kueue.x-k8s.io/v1beta1", "ResourceFlavor", "h100")
    assert h100["spec"]["nodeLabels"]["cloud.google.com/gke-accelerator"] == "nvidia-h100-80gb"
    assert h100["spec"]["nodeLabels"]["gpufleet.dev/gpu-pool"] == "h100"
    assert h100["spec"]["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}]
    assert manifests["kueue_flavor_l4_spot"]["spec"]["nodeLabels"]["cloud.google.com/gke-accelerator"] == "nvidia-l4"


def test_cluster_queue_nominal_gpu_quota_equals_each_pools_capacity(manifests, prod):
    spec = manifests["kueue_cluster_queue"]["spec"]
    gpus = {f["name"]: next(r["nominalQuota"] for r in f["resources"] if r["name"] == "nvidia.com/gpu")
            for f in spec["resourceGroups"][0]["flavors"]}
    assert gpus == {"h100": 32, "l4-spot": 16}
    assert gpus == {s.name: s.capacity_gpus for s in derive_gpu_pools(prod)}
    assert spec["namespaceSelector"] == {"matchExpressions": [{"key": "gpufleet.dev/tenant", "operator": "Exists"}]}
    assert "nvidia.com/gpu" in spec["resourceGroups"][0]["coveredResources"]


def test_local_queue_per_tenant_namespace_points_at_the_cluster_queue(manifests, stack_json):
    queues = {k: v for k, v in manifests.items() if v["kind"] == "LocalQueue"}
    assert {q["metadata"]["namespace"] for q in queues.values()} == {"research", "applied"}
    assert all(q["spec"]["clusterQueue"] == manifests["kueue_cluster_queue"]["metadata"]["name"] == "prod-gke" for q in queues.values())
    raw = stack_json("prod-gke-scheduler")["resource"]["kubernetes_manifest"]["kueue_local_queue_research"]
    assert "kubernetes_namespace_v1.ns_research" in raw["depends_on"]


def test_builders_are_pure_functions_of_the_specs(prod):
    pools, tenants = derive_gpu_pools(prod), derive_tenants(prod)
    assert cluster_queue("q", pools) == cluster_queue("q", pools)
    assert [f["name"] for f in cluster_queue("q", pools)["spec"]["resourceGroups"][0]["flavors"]] == ["h100", "l4-spot"]
    assert resource_flavor(pools[1])["metadata"] == {"name": "l4-spot"}
    assert local_queue(tenants[0], "q") == {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue",
                                            "metadata": {"name": "gpu", "namespace": "applied"}, "spec": {"clusterQueue": "q"}}


def test_dev_cluster_queue_matches_its_single_pool(stack_json):
    manifests = {k: v["manifest"] for k, v in stack_json("dev-gke-scheduler")["resource"]["kubernetes_manifest"].items()}
    (flavor,) = manifests["kueue_cluster_queue"]["spec"]["resourceGroups"][0]["flavors"]
    assert flavor["name"] == "t4" and flavor["resources"][0] == {"name": "nvidia.com/gpu", "nominalQuota": 2}
    assert manifests["kueue_local_queue_sandbox"]["metadata"]["namespace"] == "sandbox"
