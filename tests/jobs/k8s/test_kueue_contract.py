"""The rendered GKE Job against the Kueue objects the scheduler stack declares for its cluster
(constructs_lib/kueue.py, issue 11): the LocalQueue it names exists in its namespace, its
ClusterQueue covers every resource the pods request (Kueue refuses a workload with an uncovered
resource), holds the pool's flavor with enough GPU quota for all ranks, and selects the namespace."""

from __future__ import annotations

from typing import Any

import pytest

from clusters.derive.pools import derive_gpu_pools
from clusters.derive.tenants import TENANT_LABEL, derive_tenants
from constructs_lib.kueue import cluster_queue, local_queue, resource_flavor
from jobs.k8s.render import QUEUE_LABEL, job_manifest
from jobs.loader import find, load


@pytest.fixture(scope="module")
def case(cluster_configs: Any, vault_view: Any) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
    spec = load(find("finetune-llama-gke"), cluster_configs=cluster_configs, vault=vault_view)
    config = next(c for c in cluster_configs if c.name == spec.cluster)
    tenant = next(t for t in derive_tenants(config) if t.name == spec.namespace)
    pools = derive_gpu_pools(config)
    queues = {(q["metadata"]["namespace"], q["metadata"]["name"]): q for t in derive_tenants(config) for q in (local_queue(t, p) for p in pools if dict(t.gpu_quota).get(p.name, 0) > 0 or p.overcommit)}
    job = job_manifest(spec, dispatch_id="contract")
    lq = queues.get((job["metadata"]["namespace"], job["metadata"]["labels"][QUEUE_LABEL]))
    assert lq is not None, f"no LocalQueue {job['metadata']['labels'][QUEUE_LABEL]} in {job['metadata']['namespace']}: {sorted(queues)}"
    cq = cluster_queue(tenant, spec.pool, config.name)
    assert cq["metadata"]["name"] == lq["spec"]["clusterQueue"]
    return job, lq, cq, resource_flavor(spec.pool, config.name)


def test_cluster_queue_covers_every_requested_resource(case: Any) -> None:
    job, _, cq, _ = case
    requested = {name for c in job["spec"]["template"]["spec"]["containers"] for name in c["resources"]["requests"]}
    covered = {name for group in cq["spec"]["resourceGroups"] for name in group["coveredResources"]}
    assert requested <= covered, f"Kueue would refuse: {sorted(requested - covered)} unavailable in ClusterQueue {cq['metadata']['name']}"


def test_cluster_queue_offers_the_pool_flavor_with_quota_for_all_ranks(case: Any) -> None:
    job, _, cq, flavor = case
    (group,) = cq["spec"]["resourceGroups"]
    (entry,) = group["flavors"]
    gpus = next(r for r in entry["resources"] if r["name"] == "nvidia.com/gpu")
    wanted = int(job["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"]) * job["spec"]["parallelism"]
    assert entry["name"] == flavor["metadata"]["name"] and gpus["nominalQuota"] >= wanted


def test_job_selector_agrees_with_the_flavor_and_namespace_is_selected(case: Any) -> None:
    job, lq, cq, flavor = case
    selector = job["spec"]["template"]["spec"]["nodeSelector"]
    labels = flavor["spec"]["nodeLabels"]
    assert all(labels.get(k, v) == v for k, v in selector.items()), "a nodeSelector that conflicts with the flavor's nodeLabels is never admitted on it"
    assert cq["spec"]["namespaceSelector"] == {"matchLabels": {TENANT_LABEL: lq["metadata"]["namespace"]}}
