"""Kueue objects match the cluster file: a flavor per pool, a ClusterQueue per tenant holding its quotas, a LocalQueue per tenant."""

from __future__ import annotations

import dataclasses

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


def gpu_quotas(queue: dict) -> dict[str, dict]:
    """flavor -> the GPU resource entry (nominalQuota, borrowingLimit) of one ClusterQueue."""
    return {f["name"]: next(r for r in f["resources"] if r["name"] == "nvidia.com/gpu")
            for f in queue["spec"]["resourceGroups"][0]["flavors"]}


def test_one_cluster_queue_per_tenant_whose_gpu_quotas_are_the_files(manifests, prod):
    queues = {m["metadata"]["name"]: m for m in manifests.values() if m["kind"] == "ClusterQueue"}
    assert set(queues) == {t.name for t in prod.tenants} == {"research", "applied"}
    for tenant in prod.tenants:
        quotas = gpu_quotas(manifests[f"kueue_cluster_queue_{tenant.name}"])
        assert {f: q["nominalQuota"] for f, q in quotas.items()} == dict(tenant.gpu_quota)
    assert {f: q["nominalQuota"] for f, q in gpu_quotas(queues["research"]).items()} == {"h100": 24, "l4-spot": 8}


def test_tenant_queues_share_a_cohort_and_borrow_nothing_without_overcommit(manifests):
    queues = [m for m in manifests.values() if m["kind"] == "ClusterQueue"]
    assert {q["spec"]["cohort"] for q in queues} == {"prod-gke"}
    for q in queues:
        assert all(r["borrowingLimit"] == 0 for r in gpu_quotas(q).values()), q["metadata"]["name"]
        assert q["spec"]["namespaceSelector"] == {"matchLabels": {"gpufleet.dev/tenant": q["metadata"]["name"]}}
        assert q["spec"]["preemption"]["reclaimWithinCohort"] == "Any"
        assert "nvidia.com/gpu" in q["spec"]["resourceGroups"][0]["coveredResources"]


def test_overcommitted_pool_lets_tenants_borrow_and_unlisted_pools_get_zero(prod):
    pools = tuple(dataclasses.replace(p, overcommit=p.name == "l4-spot") for p in derive_gpu_pools(prod))
    tenant = dataclasses.replace(derive_tenants(prod)[0], gpu_quota=(("h100", 8),))
    quotas = gpu_quotas(cluster_queue(tenant, "prod-gke", pools))
    assert quotas == {"h100": {"name": "nvidia.com/gpu", "nominalQuota": 8, "borrowingLimit": 0},
                      "l4-spot": {"name": "nvidia.com/gpu", "nominalQuota": 0}}


def test_local_queue_per_tenant_namespace_points_at_its_own_cluster_queue(manifests, stack_json):
    queues = {k: v for k, v in manifests.items() if v["kind"] == "LocalQueue"}
    assert {q["metadata"]["namespace"] for q in queues.values()} == {"research", "applied"}
    for q in queues.values():
        tenant = q["metadata"]["namespace"]
        assert q["spec"]["clusterQueue"] == manifests[f"kueue_cluster_queue_{tenant}"]["metadata"]["name"] == tenant
    raw = stack_json("prod-gke-scheduler")["resource"]["kubernetes_manifest"]["kueue_local_queue_research"]
    assert {"kubernetes_namespace_v1.ns_research", "kubernetes_manifest.kueue_cluster_queue_research"} <= set(raw["depends_on"])


def test_builders_are_pure_functions_of_the_specs(prod):
    pools, tenants = derive_gpu_pools(prod), derive_tenants(prod)
    assert cluster_queue(tenants[0], "c", pools) == cluster_queue(tenants[0], "c", pools)
    assert [f["name"] for f in cluster_queue(tenants[0], "c", pools)["spec"]["resourceGroups"][0]["flavors"]] == ["h100", "l4-spot"]
    assert resource_flavor(pools[1])["metadata"] == {"name": "l4-spot"}
    assert local_queue(tenants[0], "q") == {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue",
                                            "metadata": {"name": "gpu", "namespace": "applied"}, "spec": {"clusterQueue": "q"}}


def test_dev_tenant_queue_matches_its_single_pool_quota(stack_json):
    manifests = {k: v["manifest"] for k, v in stack_json("dev-gke-scheduler")["resource"]["kubernetes_manifest"].items()}
    (flavor,) = manifests["kueue_cluster_queue_sandbox"]["spec"]["resourceGroups"][0]["flavors"]
    assert flavor["name"] == "t4" and flavor["resources"][0] == {"name": "nvidia.com/gpu", "nominalQuota": 2, "borrowingLimit": 0}
    assert manifests["kueue_cluster_queue_sandbox"]["spec"]["cohort"] == "dev-gke"
    assert manifests["kueue_local_queue_sandbox"]["metadata"]["namespace"] == "sandbox"
