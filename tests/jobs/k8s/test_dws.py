"""The DWS flex-start example: a queued-provisioning pool and a job that uses it, checked against
the toolkit's gke-dws-flex-start example (cluster-toolkit examples/gke-dws-flex-start:
gke-dws-flex-start.yaml a3_megagpu_pool settings enable_queued_provisioning, autoscaling_total_min_nodes 0,
auto_repair/auto_upgrade false; dws-queues.yaml.tftpl the dws-prov AdmissionCheck and dws-config
ProvisioningRequestConfig; sample-job.yaml the suspended Job with provreq.kueue.x-k8s.io/maxRunDurationSeconds)
and Kueue v0.19.2's CRDs. The cluster is a fixture copy of the example dev-gke
(tests/jobs/k8s/fixtures/dws-dev.yaml); the job is built here, not read from jobs/.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cdktf
import pytest

from clusters.derive.pools import QUEUED_LABEL, derive_gpu_pools
from clusters.derive.tenants import derive_tenants
from clusters.loader import load as load_cluster
from constructs_lib.kueue import DWS_CHECK, cluster_queue, dws_objects, resource_flavor
from jobs.k8s.render import DWS_MAX_RUN_ANNOTATION, QUEUE_LABEL, job_manifest
from jobs.k8s.schemas import require_valid
from jobs.schema import JobFile
from jobs.spec import derive_spec
from stacks.infra import ClusterStack
from tests.constructs_lib.test_kueue_crds import problems

FIXTURE = Path(__file__).parent / "fixtures" / "dws-dev.yaml"


@pytest.fixture(scope="module")
def config() -> Any:
    return load_cluster(FIXTURE)


def _flex(config: Any) -> Any:
    (pool,) = [p for p in derive_gpu_pools(config) if p.queued_provisioning]
    return pool


def test_pool_is_the_toolkits_flex_start_pool(config: Any) -> None:
    stack = json.loads(cdktf.Testing.synth(ClusterStack(cdktf.Testing.app(), config)))
    pool = stack["resource"]["google_container_node_pool"][f"pool_{_flex(config).name.replace('-', '_')}"]
    assert pool["queued_provisioning"] == {"enabled": True}
    assert pool["autoscaling"]["total_min_node_count"] == 0 and "node_count" not in pool
    assert pool["management"] == {"auto_repair": False, "auto_upgrade": False}
    assert not pool["node_config"].get("spot") and pool["node_config"]["reservation_affinity"] == {"consume_reservation_type": "NO_RESERVATION"}


def test_queues_carry_the_provisioning_check_valid_against_kueue(config: Any) -> None:
    flex = _flex(config)
    check, provisioning = dws_objects()
    assert check["metadata"]["name"] == "dws-prov" and provisioning["spec"]["provisioningClassName"] == "queued-provisioning.gke.io"
    (tenant,) = derive_tenants(config)
    queue = cluster_queue(tenant, flex, config.name)
    assert queue["spec"]["admissionChecksStrategy"] == {"admissionChecks": [{"name": DWS_CHECK, "onFlavors": [flex.name]}]}
    flavor = resource_flavor(flex, config.name)
    assert {"key": QUEUED_LABEL, "operator": "Exists", "effect": "NoSchedule"} in flavor["spec"]["tolerations"]
    for manifest in (check, provisioning, queue, flavor):
        assert problems(manifest) == [], manifest["kind"]


def test_job_on_the_flex_pool_asks_for_its_own_run_time(config: Any) -> None:
    job = JobFile.model_validate({
        "name": "eval-flex", "cluster": "dws-dev", "tenant": "sandbox", "gpu": {"pool": "l4-flex", "count": 2},
        "image": "ghcr.io/acme/train:1.0", "command": "python", "cpu_cores": 8, "memory_mb": 32768,
        "secrets": {"role": "eval", "env": {"OPENAI_API_KEY": "ml-api-keys/openai#api_key"}}, "max_run_hours": 2})
    manifest = job_manifest(derive_spec(job, config, source=Path("jobs/eval-flex.yaml")))
    require_valid([manifest])
    assert manifest["spec"]["suspend"] is True and manifest["metadata"]["labels"][QUEUE_LABEL] == "gpu-l4-flex"
    assert manifest["metadata"]["annotations"][DWS_MAX_RUN_ANNOTATION] == str(2 * 3600)


def test_jobs_on_other_pools_carry_no_provisioning_parameter(config: Any) -> None:
    job = JobFile.model_validate({
        "name": "smoke", "cluster": "dws-dev", "tenant": "sandbox", "gpu": {"pool": "t4", "count": 1},
        "image": "ghcr.io/acme/train:1.0", "command": "python",
        "secrets": {"role": "eval", "env": {"OPENAI_API_KEY": "ml-api-keys/openai#api_key"}}, "max_run_hours": 1})
    manifest = job_manifest(derive_spec(job, config, source=Path("jobs/smoke.yaml")))
    assert DWS_MAX_RUN_ANNOTATION not in manifest["metadata"]["annotations"]
