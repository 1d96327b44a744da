"""The GPU health gate of multi-node GKE runs: a ``dcgmi diag`` pre-flight init container on every
rank, its own podFailurePolicy rule, and the status that calls its failure an infrastructure failure.

Against the Kubernetes API double (tests/jobs/k8s_double.py: it validates every Job against the
vendored Kubernetes OpenAPI and the batch validation rules it implements, and plays the Job
controller's failure condition). The failure message is the Job controller's own format:
kubernetes pkg/controller/job/pod_failure_policy.go (commit 2b02db1b) matchPodFailurePolicy,
"Container %s for pod %s/%s failed with exit code %v matching %v rule at index %d", and
matchOnExitCodes matches init containers' statuses as well as the app containers'.
The cluster is a fixture copy (tests/jobs/k8s/fixtures/tas-a3mega.yaml).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import celpy
import pytest

from clusters.derive.pools import kueue_local_queue_name
from clusters.loader import load as load_cluster
from constructs_lib.k8s_queue_policy import privilege_rules
from jobs.k8s.render import PREFLIGHT_CONTAINER, job_manifest
from jobs.k8s.schemas import require_valid
from jobs.k8s.status import INFRASTRUCTURE_FAILURE, State
from jobs.runner import Phase
from jobs.schema import JobFile
from jobs.spec import derive_spec
from tests.jobs.k8s_double import K8sDouble

FIXTURE = Path(__file__).parent / "fixtures" / "tas-a3mega.yaml"
DCGM_IMAGE = "ghcr.io/acme/dcgm-diag:1.0"  # any image with dcgmi and NVVS; the tag is the operator's
META: dict[str, str] = {}


@pytest.fixture(scope="module")
def config() -> Any:
    return load_cluster(FIXTURE)


def _spec(config: Any, **change: Any) -> Any:
    data = {"name": "pretrain-gate", "cluster": "tas-a3mega", "tenant": "pretrain", "nodes": 2,
            "gpu": {"pool": "h100-mega", "count": 8}, "image": "ghcr.io/acme/train:1.0", "command": "torchrun",
            "cpu_cores": 100, "memory_mb": 800000, "disk_mb": 204800, "preflight": {"image": DCGM_IMAGE, "dcgm_diag_level": 2},
            "secrets": {"role": "finetune", "env": {"HF_TOKEN": "ml-api-keys/huggingface#token"}}, "max_run_hours": 4}
    data.update(change)
    return derive_spec(JobFile.model_validate(data), config, source=Path("jobs/pretrain-gate.yaml"))


def test_every_rank_runs_dcgm_diag_after_the_sidecars_and_before_training(config: Any) -> None:
    job = job_manifest(_spec(config))
    require_valid([job])
    pod = job["spec"]["template"]["spec"]
    inits = pod["initContainers"]
    check = inits[-1]
    assert check["name"] == PREFLIGHT_CONTAINER and check["image"] == DCGM_IMAGE
    assert all(c.get("restartPolicy") == "Always" for c in inits[:-1])  # the native sidecars start first
    assert "restartPolicy" not in check  # a regular init container: training waits for it to exit 0
    assert check["resources"]["limits"]["nvidia.com/gpu"] == pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
    rule = job["spec"]["podFailurePolicy"]["rules"][-1]
    assert rule == {"action": "FailJob", "onExitCodes": {"containerName": PREFLIGHT_CONTAINER, "operator": "NotIn", "values": [0]}}


def test_the_preflight_starts_its_own_dcgm_host_engine_and_stops_it(config: Any) -> None:
    """dcgmi is a client of nv-hostengine, and a pod has none: start one, diag, stop it, keep the diag's exit code.

    As cluster-toolkit v1.95.0 community/modules/scheduler/schedmd-slurm-gcp-v6-controller/modules/
    slurm_files/scripts/tools/gpu-test does (:80-83 start, :88 ``dcgmi diag -r 1``, :94-95 ``nv-hostengine -t``);
    the driver libraries at GKE's path as the toolkit's examples/gke-a3-highgpu/nccl-test.yaml:90-91 sets them.
    """
    check = job_manifest(_spec(config))["spec"]["template"]["spec"]["initContainers"][-1]
    pid = "--pid /tmp/nv-hostengine.pid"
    assert check["command"] == ["sh", "-c", f"nv-hostengine {pid} --log-filename /tmp/nv-hostengine.log && sleep 1 && dcgmi diag -r 2; "
                                f"rc=$?; nv-hostengine --term {pid}; exit $rc"]
    assert {"name": "LD_LIBRARY_PATH", "value": "/usr/local/nvidia/lib64"} in check["env"]
    assert {"name": "tmp", "mountPath": "/tmp"} in check["volumeMounts"]  # the pid file and log are writable as uid 1000
    assert check["securityContext"]["runAsNonRoot"] is True  # nv-hostengine runs without root (see preflight_container)


def test_the_preflight_stays_inside_the_tenant_privilege_box(config: Any) -> None:
    """The admission policy's own CEL (constructs_lib.k8s_queue_policy) accepts the pod with the pre-flight."""
    job = job_manifest(_spec(config))
    pod = {"metadata": {"annotations": job["spec"]["template"]["metadata"].get("annotations", {}),
                        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "x", "uid": "u", "controller": True}]},
           "spec": job["spec"]["template"]["spec"]}
    env = celpy.Environment()
    for name, rule in privilege_rules().items():
        assert bool(env.program(env.compile(rule)).evaluate({"object": celpy.json_to_cel(pod)})), name


def test_no_preflight_unless_asked(config: Any) -> None:
    job = job_manifest(_spec(config, preflight=None))
    assert all(c["name"] != PREFLIGHT_CONTAINER for c in job["spec"]["template"]["spec"].get("initContainers", []))
    assert len(job["spec"]["podFailurePolicy"]["rules"]) == 2


@pytest.fixture
def k8s(config: Any, tmp_path: Path) -> Iterator[K8sDouble]:
    double = K8sDouble(namespaces={"pretrain": {kueue_local_queue_name("h100-mega")}}).start()
    double.kubeconfig_path = double.kubeconfig(tmp_path / "kubeconfig")
    yield double
    double.stop()


def _client(double: K8sDouble) -> Any:
    from jobs.k8s.client import K8sClient, K8sSettings

    return K8sClient(K8sSettings(kubeconfig=str(double.kubeconfig_path), timeout_seconds=5.0, retries=1, backoff_seconds=0.01))


def _mint(ranks: int) -> tuple[str, list[str]]:
    return "role-id", [f"wrap-{rank}" for rank in range(ranks)]


def test_a_failed_preflight_is_an_infrastructure_failure(config: Any, k8s: K8sDouble) -> None:
    from jobs.runner import GkeRunner

    client = _client(k8s)
    run = client.dispatch(_spec(config), META, dispatch_id="gate-1", mint=_mint).run
    k8s.admit("pretrain", run, cluster_queue="pretrain.h100-mega", flavor="h100-mega")
    k8s.fail("pretrain", run, reason="PodFailurePolicy",
             message=f"Container {PREFLIGHT_CONTAINER} for pod pretrain/{run}-1-x7k2p failed with exit code 1 matching FailJob rule at index 2")
    status = client.status("pretrain", run)
    assert status.state == State.FAILED and status.infrastructure
    assert status.reason.startswith(f"{INFRASTRUCTURE_FAILURE}: pod pretrain/{run}-1-x7k2p failed the pre-flight GPU check (dcgmi diag exit 1)")
    assert status.exit_code is None  # the job's own code never ran
    # What the control plane's reconciler receives (jobs.runner.RunReport): failed, and flagged as infrastructure.
    report = GkeRunner._report("pretrain", status)
    assert report.phase == Phase.FAILED and report.infrastructure and report.detail.startswith(INFRASTRUCTURE_FAILURE)


def test_the_training_containers_own_failure_is_not_infrastructure(config: Any, k8s: K8sDouble) -> None:
    client = _client(k8s)
    run = client.dispatch(_spec(config), META, dispatch_id="gate-2", mint=_mint).run
    k8s.admit("pretrain", run, cluster_queue="pretrain.h100-mega", flavor="h100-mega")
    k8s.fail("pretrain", run, reason="PodFailurePolicy",
             message=f"Container train for pod pretrain/{run}-0-abcde failed with exit code 3 matching FailJob rule at index 0")
    status = client.status("pretrain", run)
    assert status.state == State.FAILED and not status.infrastructure and status.exit_code == 3
