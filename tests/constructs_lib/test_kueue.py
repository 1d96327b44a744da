"""Kueue objects match the cluster file: a flavor per pool, one ClusterQueue and LocalQueue per (tenant, pool) holding its quota."""

from __future__ import annotations

import dataclasses

import pytest

from clusters.derive.pools import derive_gpu_pools, kueue_local_queue_name
from clusters.derive.tenants import derive_tenants, tenant_gpu_pools
from constructs_lib.kueue import cluster_queue, cluster_queue_name, dws_objects, local_queue, resource_flavor

API = "kueue.x-k8s.io/v1beta2"


@pytest.fixture(scope="module")
def manifests(stack_json):
    return {k: v["manifest"] for k, v in stack_json("prod-gke-scheduler")["resource"]["kubernetes_manifest"].items()}


@pytest.fixture(scope="module")
def prod(example_configs):
    return {c.name: c for c in example_configs}["prod-gke"]


def of_kind(manifests: dict, kind: str) -> dict[str, dict]:
    return {m["metadata"]["name"]: m for m in manifests.values() if m["kind"] == kind}


def test_flavor_per_pool_selects_the_accelerator_and_tolerates_the_gpu_taint(manifests):
    h100 = manifests["kueue_flavor_h100"]
    assert (h100["apiVersion"], h100["kind"], h100["metadata"]["name"]) == (API, "ResourceFlavor", "h100")
    assert h100["spec"]["nodeLabels"]["cloud.google.com/gke-accelerator"] == "nvidia-h100-80gb"
    assert h100["spec"]["nodeLabels"]["gpufleet.dev/gpu-pool"] == "h100"
    assert h100["spec"]["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}]
    assert manifests["kueue_flavor_l4_spot"]["spec"]["nodeLabels"]["cloud.google.com/gke-accelerator"] == "nvidia-l4"


def test_every_kueue_object_is_v1beta2(manifests):
    """v1beta1 is deprecated since Kueue v0.16 (review D6); v1beta2 is the storage version."""
    kueue = [m for m in manifests.values() if m["apiVersion"].startswith("kueue.x-k8s.io/")]
    assert kueue and {m["apiVersion"] for m in kueue} == {API}


def test_each_cluster_queue_holds_exactly_one_pool_so_placement_is_what_the_job_asked_for(manifests, prod):
    """Review B4: with several flavors in one queue, an unpinned 1-GPU job got the first that fit (an 8xH100 node)."""
    queues = of_kind(manifests, "ClusterQueue")
    assert set(queues) == {"research.h100", "research.l4-spot", "applied.h100", "applied.l4-spot"}
    for tenant in prod.tenants:
        for pool, quota in tenant.gpu_quota.items():
            queue = queues[cluster_queue_name(tenant.name, pool)]
            (group,) = queue["spec"]["resourceGroups"]
            (flavor,) = group["flavors"]
            assert flavor["name"] == pool
            gpu = next(r for r in flavor["resources"] if r["name"] == "nvidia.com/gpu")
            assert gpu == {"name": "nvidia.com/gpu", "nominalQuota": quota, "borrowingLimit": 0}
            assert queue["spec"]["namespaceSelector"] == {"matchLabels": {"gpufleet.dev/tenant": tenant.name}}


def test_local_queue_per_tenant_and_pool_is_named_by_the_shared_function(manifests, stack_json):
    """Contract with the GKE job renderer: LocalQueue ``kueue_local_queue_name(pool)`` in the tenant's namespace."""
    local = [m for m in manifests.values() if m["kind"] == "LocalQueue"]
    pairs = {(m["metadata"]["namespace"], m["metadata"]["name"]): m["spec"]["clusterQueue"] for m in local}
    assert pairs == {
        ("research", kueue_local_queue_name("h100")): "research.h100", ("research", kueue_local_queue_name("l4-spot")): "research.l4-spot",
        ("applied", kueue_local_queue_name("h100")): "applied.h100", ("applied", kueue_local_queue_name("l4-spot")): "applied.l4-spot",
    }
    assert kueue_local_queue_name("h100") == "gpu-h100"
    raw = stack_json("prod-gke-scheduler")["resource"]["kubernetes_manifest"]["kueue_local_queue_research__h100"]
    assert {"kubernetes_namespace_v1.ns_research", "kubernetes_manifest.kueue_cluster_queue_research__h100"} <= set(raw["depends_on"])


def test_tenant_queues_share_a_cohort_and_reclaim_lent_gpus(manifests):
    queues = of_kind(manifests, "ClusterQueue").values()
    assert {q["spec"]["cohortName"] for q in queues} == {"prod-gke"}
    assert all(q["spec"]["preemption"]["reclaimWithinCohort"] == "Any" for q in queues)


def test_overcommitted_pool_lets_tenants_borrow_even_without_quota(prod):
    pools = tuple(dataclasses.replace(p, overcommit=p.name == "l4-spot") for p in derive_gpu_pools(prod))
    tenant = dataclasses.replace(derive_tenants(prod)[0], gpu_quota=(("h100", 8),))
    assert [p.name for p in tenant_gpu_pools(tenant, pools)] == ["h100", "l4-spot"]
    l4 = cluster_queue(tenant, pools[1], "prod-gke")["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]
    assert l4 == {"name": "nvidia.com/gpu", "nominalQuota": 0}
    no_overcommit = tuple(dataclasses.replace(p, overcommit=False) for p in pools)
    assert [p.name for p in tenant_gpu_pools(tenant, no_overcommit)] == ["h100"], "a queue that can admit nothing is not created"


def test_dws_pool_queue_waits_for_a_provisioning_request(prod):
    """Review A4: a queued-provisioning pool gets nodes only through Kueue's ProvisioningRequest admission check."""
    pools = derive_gpu_pools(prod)
    dws = dataclasses.replace(pools[1], spot=False, queued_provisioning=True)
    tenant = derive_tenants(prod)[0]
    spec = cluster_queue(tenant, dws, "prod-gke")["spec"]
    assert spec["admissionChecksStrategy"] == {"admissionChecks": [{"name": "dws-prov", "onFlavors": ["l4-spot"]}]}
    assert "admissionChecksStrategy" not in cluster_queue(tenant, pools[0], "prod-gke")["spec"]
    assert {"key": "cloud.google.com/gke-queued", "operator": "Exists", "effect": "NoSchedule"} in resource_flavor(dws)["spec"]["tolerations"]
    check, config = dws_objects()
    assert check["spec"]["controllerName"] == "kueue.x-k8s.io/provisioning-request"
    assert check["spec"]["parameters"] == {"apiGroup": "kueue.x-k8s.io", "kind": "ProvisioningRequestConfig", "name": config["metadata"]["name"]}
    assert config["spec"] == {"provisioningClassName": "queued-provisioning.gke.io", "managedResources": ["nvidia.com/gpu"]}


def test_builders_are_pure_functions_of_the_specs(prod):
    pools, tenants = derive_gpu_pools(prod), derive_tenants(prod)
    assert cluster_queue(tenants[0], pools[0], "c") == cluster_queue(tenants[0], pools[0], "c")
    assert resource_flavor(pools[1])["metadata"] == {"name": "l4-spot"}
    assert local_queue(tenants[0], pools[0]) == {"apiVersion": API, "kind": "LocalQueue",
                                                 "metadata": {"name": "gpu-h100", "namespace": "applied"},
                                                 "spec": {"clusterQueue": "applied.h100"}}


def test_dev_tenant_queue_matches_its_single_pool_quota(stack_json):
    manifests = {k: v["manifest"] for k, v in stack_json("dev-gke-scheduler")["resource"]["kubernetes_manifest"].items()}
    (flavor,) = manifests["kueue_cluster_queue_sandbox__t4"]["spec"]["resourceGroups"][0]["flavors"]
    assert flavor["name"] == "t4" and flavor["resources"][0] == {"name": "nvidia.com/gpu", "nominalQuota": 2, "borrowingLimit": 0}
    assert manifests["kueue_cluster_queue_sandbox__t4"]["spec"]["cohortName"] == "dev-gke"
    assert manifests["kueue_local_queue_sandbox__t4"]["metadata"] == {"name": "gpu-t4", "namespace": "sandbox"}
