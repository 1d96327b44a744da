"""The signal the L4 pool scales from exists while the pool has no node.

Against the Nomad API double (tests/jobs/nomad_double.py, whose JobSummary follows Nomad's: a run
that no node can take is Queued in its task group): gpufleet's eval-judge run, dispatched to a
cluster with no L4 node, is queued under task group ``gpu-l4-x1``. Nomad's leader publishes each
JobSummary count as ``nomad.nomad.job_summary.<state>`` labelled ``job`` and ``task_group``
(hashicorp/nomad v1.10.5 nomad/leader.go:1267-1320), so the autoscaler's Prometheus query for the
pool (constructs_lib.nomad_autoscaler.demand_query) sees that run through exactly this group, with
the GPUs the group asks for as its weight, and the pool's policy may start from 0 nodes."""

from __future__ import annotations

import re

import hcl

from clusters.derive.pools import derive_gpu_pools
from constructs_lib.nomad_autoscaler import demand_query, render_policy
from jobs.loader import load_all
from tests.jobs.conftest import a100_nodes
from tests.jobs.nomad_double import NomadDouble


def test_a_run_for_a_pool_at_zero_is_queued_under_the_group_its_policy_counts(client_for, cluster_configs):
    spec = {s.name: s for s in load_all()}["eval-judge"]
    double = NomadDouble(a100_nodes(), acl_token="nomad-acl-test-token").start()  # no L4 node at all
    try:
        client = client_for(double)
        client.register(spec)
        client.dispatch(spec, {"dataset_uri": "hf://d/x@v1", "run_id": "z1"}, role_id="r", wrapping_token="w", idempotency_token="z1")
        (stub,) = client.list_jobs(spec.namespace, f"{spec.name}/dispatch-")
    finally:
        double.stop()
    group = f"gpu-{spec.pool.name}-x{spec.gpu.count}"
    assert stub["JobSummary"]["Summary"][group]["Queued"] == 1 and stub["Status"] == "pending"

    config = {c.name: c for c in cluster_configs}[spec.cluster]
    pool = {p.name: p for p in derive_gpu_pools(config)}[spec.pool.name]
    query = demand_query(pool)
    # The queued gauge of that group, weighted by the GPUs the group asks for, over GPUs per node, rounded up.
    term = re.search(rf'(\d+) \* \(\(sum\(max by \(job\) \(nomad_nomad_job_summary_queued\{{task_group="{group}"\}}\)\)', query)
    assert term is not None and int(term.group(1)) == spec.gpu.count and query.endswith(f") / {pool.gpus_per_node})")
    (scaling,) = hcl.loads(render_policy(spec=pool, cluster=config.name, project=config.gcp.project, region=config.gcp.region))["scaling"].values()
    assert scaling["min"] == 0 and scaling["policy"]["target"]["gce-mig"]["node_pool"] == spec.pool.name
