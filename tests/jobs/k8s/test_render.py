"""Rendered Kubernetes manifests for GKE jobs: upstream schemas, golden file, and one test per
safety property, so dropping any of them (suspend, backoffLimit 0, toleration, pool selector,
deadline, security context, no key in the file) fails a test.

Golden: tests/jobs/golden/finetune-llama-gke.yaml. After an intended change, regenerate with
``.venv/bin/python -c "import jobs.loader as l, jobs.k8s.render as r; from pathlib import Path;
s = l.load(l.find('finetune-llama-gke')); Path('tests/jobs/golden/finetune-llama-gke.yaml').write_text(r.to_yaml(r.manifests(s)))"``
and review the diff.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from clusters.derive.pools import POOL_LABEL, kueue_local_queue_name
from clusters.derive.tenants import WORKLOAD_KSA
from jobs.k8s import render as k8s_render
from jobs.k8s.render import QUEUE_LABEL, manifests, to_yaml, write_manifests
from jobs.k8s.schemas import SchemaError, errors, require_valid
from jobs.loader import find, load
from jobs.nomad.render import render
from jobs.spec import FinetuneSpec

GOLDEN = Path(__file__).parent.parent / "golden"
EXAMPLE = "finetune-llama-gke"


@pytest.fixture(scope="module")
def gke_spec(cluster_configs: Any, vault_view: Any) -> FinetuneSpec:
    return load(find(EXAMPLE), cluster_configs=cluster_configs, vault=vault_view)


@pytest.fixture(scope="module")
def single_spec(cluster_configs: Any, vault_view: Any, tmp_path_factory: pytest.TempPathFactory) -> FinetuneSpec:
    text = find(EXAMPLE).read_text().replace("nodes: 2\n", "").replace("name: finetune-llama-gke", "name: one-node")
    path = tmp_path_factory.mktemp("jobs") / "one-node.yaml"
    path.write_text(text)
    return load(path, cluster_configs=cluster_configs, vault=vault_view)


def _job(spec: FinetuneSpec) -> dict[str, Any]:
    return next(d for d in manifests(spec) if d["kind"] == "Job")


def _pod(spec: FinetuneSpec) -> dict[str, Any]:
    return _job(spec)["spec"]["template"]["spec"]


def test_example_matches_golden(gke_spec: FinetuneSpec) -> None:
    assert to_yaml(manifests(gke_spec)) == (GOLDEN / f"{EXAMPLE}.yaml").read_text()


@pytest.mark.parametrize("which", ["multi", "single"])
def test_every_manifest_validates_against_the_vendored_upstream_schemas(gke_spec: FinetuneSpec, single_spec: FinetuneSpec, which: str) -> None:
    spec = gke_spec if which == "multi" else single_spec
    docs = manifests(spec, dispatch_id="d-1", meta={"run_id": "r1", "dataset_uri": "gs://a/b/v1/"})
    assert [d["kind"] for d in docs] == (["Service", "Job"] if which == "multi" else ["Job"])
    for doc in docs:
        assert errors(doc) == []


def test_fails_when_a_manifest_has_a_field_kubernetes_does_not_know(gke_spec: FinetuneSpec) -> None:
    """The validator is strict (unknown fields, wrong types), so the schema check above can fail."""
    job = copy.deepcopy(_job(gke_spec))
    job["spec"]["backoffLimits"] = 0
    job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] = "8"
    found = errors(job)
    assert any("spec: Additional properties are not allowed ('backoffLimits' was unexpected)" in e for e in found), found
    assert any("containers.0.resources.limits: '8' is not of type 'object'" in e for e in found), found
    with pytest.raises(SchemaError, match=r"^Job finetune-llama-gke: spec.template.*; Job finetune-llama-gke: spec: Additional properties"):
        require_valid([job])


def test_fails_to_write_an_invalid_manifest_and_leaves_nothing(gke_spec: FinetuneSpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = k8s_render.manifests

    def broken(spec: FinetuneSpec, **kwargs: Any) -> list[dict[str, Any]]:
        docs = real(spec, **kwargs)
        docs[-1]["spec"]["suspended"] = True
        return docs

    monkeypatch.setattr(k8s_render, "manifests", broken)
    with pytest.raises(SchemaError, match="'suspended' was unexpected"):
        write_manifests(gke_spec, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_rendered_file_is_multi_document_yaml_kubectl_reads(gke_spec: FinetuneSpec, tmp_path: Path) -> None:
    from ruamel.yaml import YAML

    path = write_manifests(gke_spec, tmp_path)
    assert path == tmp_path / f"{EXAMPLE}.yaml"
    docs = list(YAML(typ="safe").load_all(path.read_text()))
    assert docs == [k8s_render._sorted(d) for d in manifests(gke_spec)]


# Each safety property: (id, getter on the Job, expected value). Dropping any one fails its case.
SAFETY: list[tuple[str, Callable[[dict[str, Any]], Any], Any]] = [
    ("suspended-for-kueue", lambda j: j["spec"]["suspend"], True),
    ("no-pod-retries", lambda j: j["spec"]["backoffLimit"], 0),
    ("no-replacement-while-terminating", lambda j: j["spec"]["podReplacementPolicy"], "Failed"),
    # The disruption rule before the exit-code rule: the first matching rule wins, and an evicted pod's
    # container exits non-zero too (tests/experiments/test_retries.py, the gracefully evicted pod).
    ("fail-job-on-disruption-first", lambda j: j["spec"]["podFailurePolicy"]["rules"][0],
     {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}),
    ("fail-job-on-any-nonzero-exit", lambda j: j["spec"]["podFailurePolicy"]["rules"][1],
     {"action": "FailJob", "onExitCodes": {"containerName": "train", "operator": "NotIn", "values": [0]}}),
    ("never-restart-in-place", lambda j: j["spec"]["template"]["spec"]["restartPolicy"], "Never"),
    ("deadline-from-max-run-hours", lambda j: j["spec"]["activeDeadlineSeconds"], 20 * 3600),
    ("cleaned-up-after-a-day", lambda j: j["spec"]["ttlSecondsAfterFinished"], 86400),
    ("queue-label", lambda j: j["metadata"]["labels"][QUEUE_LABEL], kueue_local_queue_name("h100")),
    ("pool-selector", lambda j: j["spec"]["template"]["spec"]["nodeSelector"], {POOL_LABEL: "h100"}),
    ("gpu-toleration", lambda j: j["spec"]["template"]["spec"]["tolerations"],
     [{"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}]),
    ("gpu-limit", lambda j: j["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"], "8"),
    ("requests", lambda j: j["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"],
     {"cpu": "96000m", "memory": "819200Mi", "ephemeral-storage": "204800Mi", "nvidia.com/gpu": "8"}),
    ("workload-identity-ksa", lambda j: j["spec"]["template"]["spec"]["serviceAccountName"], WORKLOAD_KSA),
    ("no-api-token-in-pod", lambda j: j["spec"]["template"]["spec"]["automountServiceAccountToken"], False),
    ("priority-class", lambda j: j["spec"]["template"]["spec"]["priorityClassName"], "training-high"),
    ("grace-from-kill-timeout", lambda j: j["spec"]["template"]["spec"]["terminationGracePeriodSeconds"], 120),
    ("pod-security-context", lambda j: j["spec"]["template"]["spec"]["securityContext"],
     {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000, "seccompProfile": {"type": "RuntimeDefault"}}),
    ("container-security-context", lambda j: j["spec"]["template"]["spec"]["containers"][0]["securityContext"],
     # IPC_LOCK: a TCPX pod's training container, as upstream's (tests/jobs/k8s/test_gpudirect_privileges.py).
     {"allowPrivilegeEscalation": False, "privileged": False, "runAsNonRoot": True, "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]},
      "seccompProfile": {"type": "RuntimeDefault"}}),
    ("command-behind-gpufleet-exec", lambda j: j["spec"]["template"]["spec"]["containers"][0]["command"], ["gpufleet-exec", "--", "torchrun"]),
    ("indexed-all-ranks", lambda j: (j["spec"]["completionMode"], j["spec"]["completions"], j["spec"]["parallelism"]), ("Indexed", 2, 2)),
]


@pytest.mark.parametrize(("getter", "expected"), [case[1:] for case in SAFETY], ids=[case[0] for case in SAFETY])
def test_safety_property_is_rendered(gke_spec: FinetuneSpec, getter: Callable[[dict[str, Any]], Any], expected: Any) -> None:
    assert getter(_job(gke_spec)) == expected


def _env(spec: FinetuneSpec) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in _pod(spec)["containers"][0]["env"]}


def test_multi_node_gets_rendezvous_and_rank_from_the_completion_index(gke_spec: FinetuneSpec) -> None:
    service, job = manifests(gke_spec)
    pod = job["spec"]["template"]["spec"]
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == {"gpufleet.dev/run": "finetune-llama-gke"}
    assert service["spec"]["selector"].items() <= job["spec"]["template"]["metadata"]["labels"].items()
    assert pod["subdomain"] == service["metadata"]["name"] == job["metadata"]["name"]
    env = _env(gke_spec)
    assert env["NODE_RANK"] == {"fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}
    assert (env["NNODES"], env["NPROC_PER_NODE"], env["WORLD_SIZE"], env["MASTER_PORT"]) == ("2", "8", "16", "29500")
    assert env["MASTER_ADDR"] == "finetune-llama-gke-0.finetune-llama-gke.research.svc"
    names = [e["name"] for e in pod["containers"][0]["env"]]
    # $(NODE_RANK) expands only if NODE_RANK is defined earlier in the list.
    assert names.index("NODE_RANK") < names.index("GPUFLEET_VAULT_WRAPPED_SECRET_ID_FILE")
    assert env["GPUFLEET_VAULT_WRAPPED_SECRET_ID_FILE"] == "/var/run/gpufleet/vault/wrapped-secret-id-$(NODE_RANK)"


def test_single_node_is_a_plain_job_without_service(single_spec: FinetuneSpec) -> None:
    docs = manifests(single_spec)
    assert [d["kind"] for d in docs] == ["Job"]
    job = docs[0]
    assert (job["spec"]["completionMode"], job["spec"]["completions"], job["spec"]["parallelism"]) == ("NonIndexed", 1, 1)
    assert "subdomain" not in job["spec"]["template"]["spec"]
    env = _env(single_spec)
    assert "NODE_RANK" not in env and "MASTER_ADDR" not in env
    assert env["GPUFLEET_VAULT_WRAPPED_SECRET_ID_FILE"] == "/var/run/gpufleet/vault/wrapped-secret-id-0"


def test_keys_come_only_from_the_dispatch_secret_never_from_the_manifest(gke_spec: FinetuneSpec) -> None:
    pod = _pod(gke_spec)
    env = _env(gke_spec)
    assert env["GPUFLEET_VAULT_ROLE_ID"] == {"secretKeyRef": {"name": "finetune-llama-gke-vault", "key": "role-id"}}
    assert "GPUFLEET_VAULT_WRAPPED_SECRET_ID" not in env
    assert env["GPUFLEET_SECRETS"] == "HF_TOKEN=ml-api-keys/huggingface#token"
    assert {"name": "vault", "secret": {"secretName": "finetune-llama-gke-vault", "defaultMode": 0o440, "optional": False}} in pod["volumes"]
    assert {"name": "vault", "mountPath": "/var/run/gpufleet/vault", "readOnly": True} in pod["containers"][0]["volumeMounts"]
    text = to_yaml(manifests(gke_spec, dispatch_id="abc", meta={"run_id": "r1"}))
    assert "kind: Secret" not in text and "HF_TOKEN:" not in text


def test_dispatch_names_the_run_from_the_dispatch_id_within_dns_limits(gke_spec: FinetuneSpec) -> None:
    job = _job_for(gke_spec, "retry-me")
    again = _job_for(gke_spec, "retry-me")
    other = _job_for(gke_spec, "another")
    assert job["metadata"]["name"] == again["metadata"]["name"] != other["metadata"]["name"]
    assert job["metadata"]["annotations"]["gpufleet.dev/dispatch-id"] == "retry-me"
    longest = k8s_render.run_name("j" * 48, "x")
    assert len(longest) + len("-63") <= 63


def test_parse_run_id_reads_back_what_run_name_writes() -> None:
    """``gpufleet jobs status|stop`` find the job file from the run id dispatch printed."""
    run = k8s_render.run_name("finetune-llama-gke", "retry-me")
    assert k8s_render.parse_run_id(run) == (None, run, "finetune-llama-gke")
    assert k8s_render.parse_run_id(f"team-a/{run}") == ("team-a", run, "finetune-llama-gke")
    assert k8s_render.parse_run_id("finetune-llama-gke") is None
    assert k8s_render.parse_run_id("finetune-llama/dispatch-1733150000-1a2b3c4d") is None


def _job_for(spec: FinetuneSpec, dispatch_id: str) -> dict[str, Any]:
    return k8s_render.job_manifest(spec, dispatch_id=dispatch_id, meta={"run_id": "r"})


def test_dispatch_meta_reaches_the_task_as_gpufleet_meta_variables(gke_spec: FinetuneSpec) -> None:
    job = k8s_render.job_manifest(gke_spec, dispatch_id="d", meta={"run_id": "r1", "dataset_uri": "gs://a/b/v1/"})
    env = {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert (env["GPUFLEET_META_run_id"], env["GPUFLEET_META_dataset_uri"]) == ("r1", "gs://a/b/v1/")


def test_jobs_of_every_priority_get_a_class_that_never_preempts(single_spec: FinetuneSpec) -> None:
    from dataclasses import replace

    from constructs_lib.k8s_priority_classes import PRIORITY_CLASSES

    classes = {name: policy for name, _, policy, _ in PRIORITY_CLASSES}
    low = k8s_render.job_manifest(replace(single_spec, priority=50))["spec"]["template"]["spec"]["priorityClassName"]
    high = k8s_render.job_manifest(replace(single_spec, priority=70))["spec"]["template"]["spec"]["priorityClassName"]
    assert (low, high) == ("training-low", "training-high")
    assert (classes[low], classes[high]) == ("Never", "Never")  # preemption only through Kueue (issue 25)


def test_tolerations_are_the_ones_kueue_flavor_gives_the_pool(gke_spec: FinetuneSpec) -> None:
    from constructs_lib.kueue import resource_flavor

    assert _pod(gke_spec)["tolerations"] == resource_flavor(gke_spec.pool, gke_spec.cluster)["spec"]["tolerations"]
    assert _pod(gke_spec)["nodeSelector"].items() <= resource_flavor(gke_spec.pool, gke_spec.cluster)["spec"]["nodeLabels"].items()


# Pod Security Standards, "restricted" profile (kubernetes/kubernetes
# staging/src/k8s.io/pod-security-admission/policy: check_allowPrivilegeEscalation,
# check_capabilities_restricted, check_runAsNonRoot, check_runAsUser, check_seccompProfile_restricted,
# check_restrictedVolumes; baseline: check_privileged, check_hostNamespaces, check_hostPorts, check_hostPath).
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"}


def pod_security_restricted_violations(pod: dict[str, Any]) -> list[str]:
    found: list[str] = []
    pod_ctx = pod.get("securityContext") or {}
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            found.append(key)
    for volume in pod.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            found.append(f"volume {volume['name']}: {sorted(kinds)}")
    if pod_ctx.get("runAsUser") == 0:
        found.append("pod runAsUser 0")
    for c in pod.get("containers", []) + pod.get("initContainers", []):
        ctx = c.get("securityContext") or {}
        if ctx.get("privileged"):
            found.append(f"{c['name']}: privileged")
        if ctx.get("allowPrivilegeEscalation") is not False:
            found.append(f"{c['name']}: allowPrivilegeEscalation != false")
        caps = ctx.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []) or set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            found.append(f"{c['name']}: capabilities")
        if not (ctx.get("runAsNonRoot") or pod_ctx.get("runAsNonRoot")) or ctx.get("runAsNonRoot") is False:
            found.append(f"{c['name']}: runAsNonRoot")
        if ctx.get("runAsUser") == 0:
            found.append(f"{c['name']}: runAsUser 0")
        seccomp = (ctx.get("seccompProfile") or pod_ctx.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(f"{c['name']}: seccompProfile")
        if any(p.get("hostPort") for p in c.get("ports") or []):
            found.append(f"{c['name']}: hostPort")
    return found


def test_pods_pass_the_restricted_pod_security_profile(gke_spec: FinetuneSpec, single_spec: FinetuneSpec) -> None:
    assert pod_security_restricted_violations(_pod(single_spec)) == []
    # A multi-node run on a GPUDirect pool (h100 is a3-highgpu-8g, TCPX) adds Google's RxDM sidecar
    # and host mounts (jobs/k8s/gpudirect.py; its namespace enforces privileged): exactly these, and the
    # training container leaves restricted only by upstream's IPC_LOCK (gpudirect-tcpx/nccl-test-latest.yaml:103-106).
    assert pod_security_restricted_violations(_pod(gke_spec)) == [
        "volume tcpx-socket: ['hostPath']", "volume libraries: ['hostPath']", "volume sys: ['hostPath']", "volume proc: ['hostPath']",
        "train: capabilities", "tcpx-daemon: allowPrivilegeEscalation != false", "tcpx-daemon: capabilities", "tcpx-daemon: runAsNonRoot",
        "tcpx-daemon: runAsUser 0", "tcpx-daemon: seccompProfile"]


def test_fails_when_pod_security_context_is_dropped(single_spec: FinetuneSpec) -> None:
    pod = copy.deepcopy(_pod(single_spec))
    del pod["securityContext"]["runAsNonRoot"], pod["containers"][0]["securityContext"]["runAsNonRoot"]
    pod["containers"][0]["securityContext"]["capabilities"] = {}
    assert pod_security_restricted_violations(pod) == ["train: capabilities", "train: runAsNonRoot"]


def test_same_job_file_pointed_at_nomad_still_renders_nomad_json(job_file: Callable[..., Path], cluster_configs: Any, vault_view: Any) -> None:
    gke_text = find(EXAMPLE).read_text()

    def to_nomad(data: Any) -> None:
        for key in list(data):
            del data[key]
        from ruamel.yaml import YAML

        data.update(YAML(typ="rt").load(gke_text))
        data.update({"name": "finetune-llama", "cluster": "prod-nomad", "tenant": "finetune", "nodes": 1, "cpu_mhz": 8000,
                     "memory_mb": 32768, "disk_mb": 51200, "args": ["train.py"], "max_run_hours": 12})
        data["gpu"].update({"pool": "a100", "count": 1, "min_memory_gib": 40, "model": "A100"})
        del data["cpu_cores"]

    spec = load(job_file(to_nomad), cluster_configs=cluster_configs, vault=vault_view)
    job = render(spec)["Job"]
    assert (job["Namespace"], job["NodePool"], job["TaskGroups"][0]["Tasks"][0]["Config"]["image"]) == ("finetune", "a100", "ghcr.io/acme/gpufleet-train:2026.12")
    with pytest.raises(ValueError, match="targets a Nomad cluster"):
        manifests(spec)
