"""GPUFLEET_CHECKPOINT_URI on both schedulers, stable across attempts, and the optional GCS FUSE mount on GKE (issue 25).

Names of the GCS FUSE CSI driver are GoogleCloudPlatform/gcs-fuse-csi-driver v1.24.4's: the pod annotation
``gke-gcsfuse/volumes`` (pkg/webhook/mutatingwebhook.go:49), the driver ``gcsfuse.csi.storage.gke.io``
(pkg/csi_driver/gcs_fuse_driver.go:40), the inline volume attributes ``bucketName`` and ``mountOptions``
(pkg/csi_driver/utils.go:81, :55), and the sidecar its webhook injects (pkg/webhook/sidecar_spec.go: container
``gke-gcsfuse-sidecar`` :30, emptyDir volumes ``gke-gcsfuse-tmp``/``-buffer``/``-cache`` with their mounts :69-103,
a native sidecar with ``restartPolicy: Always`` :142-147, and GetSecurityContext :199-212: no privilege
escalation, read-only root, ALL capabilities dropped, RuntimeDefault seccomp, uid/gid 65534). The admission
policy's own CEL (constructs_lib.k8s_queue_policy) is evaluated on the rendered pod and on the pod as that
webhook mutates it, since a ValidatingAdmissionPolicy sees the pod after mutation.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import celpy
import pytest

from clusters.derive.checkpoints import prefix_condition
from constructs_lib.k8s_queue_policy import privilege_rules
from jobs.checks import cross_check
from jobs.k8s.render import job_manifest, run_name
from jobs.k8s.schemas import require_valid
from jobs.loader import find, load
from jobs.nomad.render import render
from jobs.schema import JobFile
from jobs.spec import EXPERIMENT_META, derive_spec

GKE_BUCKET = "ml-train-prod-prod-gke-ckpt"


@pytest.fixture(scope="module")
def gke(cluster_configs: Any, vault_view: Any) -> Any:
    return load(find("finetune-llama-gke"), cluster_configs=cluster_configs, vault=vault_view)


def _with_mount(spec_source: Path, cluster_configs: Any, **change: Any) -> Any:
    from ruamel.yaml import YAML

    data = YAML(typ="safe").load(spec_source.read_text())
    data.update(change)
    config = next(c for c in cluster_configs if c.name == data["cluster"])
    return derive_spec(JobFile.model_validate(data), config, source=spec_source)


def _env(job: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}


def test_nomad_tasks_get_the_experiments_directory_interpolated_from_dispatch_meta(cluster_configs: Any, vault_view: Any) -> None:
    spec = load(find("finetune-llama"), cluster_configs=cluster_configs, vault=vault_view)
    job = render(spec)["Job"]
    env = job["TaskGroups"][0]["Tasks"][0]["Env"]
    assert env["GPUFLEET_CHECKPOINT_URI"] == "gs://ml-finetune-prod-prod-nomad-ckpt/finetune/${NOMAD_META_gpufleet_experiment}/"
    # Required: a dispatch without the experiment is refused by Nomad instead of writing to a literal "${...}" directory.
    assert EXPERIMENT_META in job["ParameterizedJob"]["MetaRequired"]


def test_nomad_dispatch_names_the_callers_experiment_not_the_attempts_token(nomad: Any, client_for: Any, cluster_configs: Any, vault_view: Any) -> None:
    spec = load(find("finetune-llama"), cluster_configs=cluster_configs, vault=vault_view)
    client = client_for(nomad)
    client.register(spec)
    meta = {"dataset_uri": "hf://datasets/demo/tiny@v1", "run_id": "r1", EXPERIMENT_META: "exp-1"}
    for attempt in ("exp-1", "exp-1-attempt-2"):
        client.dispatch(spec, meta, role_id="role", wrapping_token="s.wrap", idempotency_token=attempt)
    children = [nomad.state.jobs[("finetune", c)] for c in nomad.dispatched("finetune-llama")]
    assert len(children) == 2 and {c["Meta"][EXPERIMENT_META] for c in children} == {"exp-1"}


def test_gke_attempts_of_one_experiment_share_the_directory(gke: Any) -> None:
    first = job_manifest(gke, dispatch_id="exp-1", meta={EXPERIMENT_META: "exp-1", "run_id": "r"})
    second = job_manifest(gke, dispatch_id="exp-1-attempt-2", meta={EXPERIMENT_META: "exp-1", "run_id": "r"})
    assert first["metadata"]["name"] != second["metadata"]["name"]  # two Jobs: a new attempt is a new run
    assert _env(first)["GPUFLEET_CHECKPOINT_URI"] == _env(second)["GPUFLEET_CHECKPOINT_URI"] == f"gs://{GKE_BUCKET}/research/exp-1/"
    assert "GPUFLEET_META_gpufleet_experiment" not in _env(first) and _env(first)["GPUFLEET_META_run_id"] == "r"
    # A rendered file applied by hand has no experiment: its directory is the run's own name.
    assert _env(job_manifest(gke))["GPUFLEET_CHECKPOINT_URI"] == f"gs://{GKE_BUCKET}/research/{run_name(gke.name, None)}/"


def test_no_mount_unless_the_job_file_asks(gke: Any) -> None:
    pod = job_manifest(gke)["spec"]["template"]
    assert "gke-gcsfuse/volumes" not in (pod["metadata"].get("annotations") or {})
    assert all("csi" not in v for v in pod["spec"]["volumes"])


def _mounted(cluster_configs: Any, **change: Any) -> dict[str, Any]:
    spec = _with_mount(find("finetune-llama-gke"), cluster_configs, checkpoint={"mount": "/ckpt"}, **change)
    job = job_manifest(spec, dispatch_id="exp-9", meta={EXPERIMENT_META: "exp-9", "dataset_uri": "gs://d/v1/", "run_id": "r"})
    require_valid([job])  # Kubernetes' OpenAPI (v1.35, strict): the CSI inline volume is a known shape
    return job


def test_the_mount_is_the_experiments_directory_through_the_gcs_fuse_csi_driver(cluster_configs: Any) -> None:
    job = _mounted(cluster_configs)
    template = job["spec"]["template"]
    assert template["metadata"]["annotations"]["gke-gcsfuse/volumes"] == "true"
    volume = next(v for v in template["spec"]["volumes"] if v["name"] == "checkpoints")
    assert volume == {"name": "checkpoints", "csi": {"driver": "gcsfuse.csi.storage.gke.io", "volumeAttributes": {
        "bucketName": GKE_BUCKET, "mountOptions": "implicit-dirs,only-dir=research/exp-9"}}}
    train = template["spec"]["containers"][0]
    assert {"name": "checkpoints", "mountPath": "/ckpt"} in train["volumeMounts"]
    # The directory mounted is the one the URI names, and inside the prefix the tenant's IAM condition admits.
    assert _env(job)["GPUFLEET_CHECKPOINT_URI"] == f"gs://{GKE_BUCKET}/research/exp-9/"
    env = celpy.Environment()
    program = env.program(env.compile(prefix_condition(GKE_BUCKET, "research")), functions={"getAttribute": lambda api, k, d: api.get(k, d)})
    listing = {"resource": celpy.json_to_cel({"name": f"projects/_/buckets/{GKE_BUCKET}"}),
               "api": celpy.json_to_cel({"storage.googleapis.com/objectListPrefix": "research/exp-9/"})}
    assert program.evaluate(listing)
    # fsGroup 1000: the driver mounts with gid=1000 and dir-mode 775, so uid 1000 can write.
    assert template["spec"]["securityContext"]["fsGroup"] == 1000


GCSFUSE_SIDECAR = {
    "name": "gke-gcsfuse-sidecar", "image": "gke.gcr.io/gcs-fuse-csi-driver-sidecar-mounter:v1.24.4", "args": ["--v=5"],
    "restartPolicy": "Always", "env": [{"name": "NATIVE_SIDECAR", "value": "TRUE"}],
    "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]},
                        "seccompProfile": {"type": "RuntimeDefault"}, "runAsNonRoot": True, "runAsUser": 65534, "runAsGroup": 65534},
    "resources": {"requests": {"cpu": "250m", "memory": "256Mi", "ephemeral-storage": "5Gi"}},
    "volumeMounts": [{"name": "gke-gcsfuse-tmp", "mountPath": "/gcsfuse-tmp"}, {"name": "gke-gcsfuse-buffer", "mountPath": "/gcsfuse-buffer"},
                     {"name": "gke-gcsfuse-cache", "mountPath": "/gcsfuse-cache"}],
}


def _admitted_pod(job: dict[str, Any], *, mutated: bool) -> dict[str, Any]:
    template = copy.deepcopy(job["spec"]["template"])
    spec = template["spec"]
    if mutated:  # what the GCS FUSE webhook adds before validation
        spec["initContainers"] = [copy.deepcopy(GCSFUSE_SIDECAR), *spec.get("initContainers", [])]
        spec["volumes"] += [{"name": n, "emptyDir": {}} for n in ("gke-gcsfuse-tmp", "gke-gcsfuse-buffer", "gke-gcsfuse-cache")]
    return {"metadata": {"annotations": template["metadata"].get("annotations", {}), "labels": template["metadata"]["labels"],
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job["metadata"]["name"], "uid": "u", "controller": True}]},
            "spec": spec}


@pytest.mark.parametrize("nodes", [1, 2])
@pytest.mark.parametrize("mutated", [False, True])
def test_the_admission_policies_still_admit_the_mounted_pod(cluster_configs: Any, nodes: int, mutated: bool) -> None:
    """nodes 2 is the GPUDirect (TCPX) pod with its RxDM sidecar; the mount changes nothing the policy guards."""
    job = _mounted(cluster_configs, nodes=nodes)
    pod = _admitted_pod(job, mutated=mutated)
    env = celpy.Environment()
    for name, rule in privilege_rules().items():
        assert bool(env.program(env.compile(rule)).evaluate({"object": celpy.json_to_cel(pod)})), name


@pytest.mark.parametrize(("change", "field", "words"), [
    ({"checkpoint": {"mount": "/tmp/ckpt"}}, ("checkpoint", "mount"), "overlaps a directory the platform mounts"),
    ({"checkpoint": {"mount": "/var"}}, ("checkpoint", "mount"), "overlaps a directory the platform mounts"),
])
def test_fails_when_the_mount_overlaps_the_platforms_directories(cluster_configs: Any, vault_view: Any, change: dict, field: tuple, words: str) -> None:
    from ruamel.yaml import YAML

    data = {**YAML(typ="safe").load(find("finetune-llama-gke").read_text()), **change}
    findings = cross_check(JobFile.model_validate(data), {c.name: c for c in cluster_configs}, vault_view, file_stem="finetune-llama-gke")
    assert any(path == field and words in message for path, message in findings), findings


def test_fails_when_a_nomad_job_asks_for_a_mount(cluster_configs: Any, vault_view: Any) -> None:
    from ruamel.yaml import YAML

    data = {**YAML(typ="safe").load(find("finetune-llama").read_text()), "checkpoint": {"mount": "/ckpt"}}
    findings = cross_check(JobFile.model_validate(data), {c.name: c for c in cluster_configs}, vault_view, file_stem="finetune-llama")
    assert any(path == ("checkpoint", "mount") and "GCS FUSE CSI driver" in message for path, message in findings), findings
