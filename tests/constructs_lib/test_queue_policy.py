"""GPU workloads in tenant namespaces go through Kueue (review B9): the admission policies, and their CEL evaluated.

The CEL is evaluated with cel-python (a CEL implementation, not Kubernetes): it checks the logic
of each rule on Job and Pod objects shaped like the API server's. Kubernetes' own type checker is
not run here.
"""

from __future__ import annotations

import celpy
import pytest

from clusters.gpudirect_upstream import rxdm_sidecars
from constructs_lib.k8s_queue_policy import JOB_RULE, POD_RULE, policies, privilege_rule

GPU = {"name": "train", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "8"}}}
CPU = {"name": "prep", "image": "i", "resources": {"requests": {"cpu": "1"}}}
JOB_OWNER = {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "u", "controller": True}


def evaluate(rule: str, obj: dict) -> bool:
    env = celpy.Environment()
    return bool(env.program(env.compile(rule)).evaluate({"object": celpy.json_to_cel(obj)}))


def job(containers: list[dict], labels: dict | None = None, init: list[dict] | None = None) -> dict:
    spec = {"containers": containers, **({"initContainers": init} if init else {})}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", **({"labels": labels} if labels is not None else {})},
            "spec": {"template": {"spec": spec}}}


def pod(containers: list[dict], owners: list[dict] | None = None, init: list[dict] | None = None) -> dict:
    spec = {"containers": containers, **({"initContainers": init} if init else {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", **({"ownerReferences": owners} if owners is not None else {})},
            "spec": spec}


@pytest.mark.parametrize(("obj", "admitted"), [
    (job([GPU]), False),
    (job([GPU], {"kueue.x-k8s.io/queue-name": ""}), False),
    (job([CPU], init=[GPU]), False),
    (job([GPU], {"kueue.x-k8s.io/queue-name": "gpu-h100"}), True),
    (job([CPU]), True),
])
def test_gpu_jobs_must_name_a_local_queue(obj, admitted):
    assert evaluate(JOB_RULE, obj) is admitted


@pytest.mark.parametrize(("obj", "admitted"), [
    (pod([GPU]), False),
    (pod([GPU], [{**JOB_OWNER, "controller": False}]), False),
    (pod([GPU], [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "r", "uid": "u", "controller": True}]), False),
    (pod([CPU], init=[GPU]), False),
    (pod([GPU], [JOB_OWNER]), True),
    (pod([CPU]), True),
])
def test_gpu_pods_must_be_controlled_by_a_job(obj, admitted):
    assert evaluate(POD_RULE, obj) is admitted


@pytest.mark.parametrize("stack", ["prod-gke-scheduler", "dev-gke-scheduler"])
def test_policies_deny_in_every_tenant_namespace(stack_json, stack):
    manifests = {k: v for k, v in stack_json(stack)["resource"]["kubernetes_manifest"].items() if k.startswith("vap_")}
    kinds = sorted(v["manifest"]["kind"] for v in manifests.values())
    assert kinds == ["ValidatingAdmissionPolicy"] * 3 + ["ValidatingAdmissionPolicyBinding"] * 3
    for v in manifests.values():
        m = v["manifest"]
        assert m["apiVersion"] == "admissionregistration.k8s.io/v1"
        if m["kind"] == "ValidatingAdmissionPolicyBinding":
            assert m["spec"]["validationActions"] == ["Deny"]
            assert m["spec"]["matchResources"]["namespaceSelector"] == {"matchExpressions": [{"key": "gpufleet.dev/tenant", "operator": "Exists"}]}
            assert any(d.startswith("kubernetes_manifest.vap_") for d in v["depends_on"])
        else:
            assert m["spec"]["failurePolicy"] == "Fail"
    rules = {tuple(m["manifest"]["spec"]["matchConstraints"]["resourceRules"][0]["resources"]): m["manifest"]["spec"]["validations"][0]["expression"]
             for m in manifests.values() if m["manifest"]["kind"] == "ValidatingAdmissionPolicy"}
    assert rules == {("jobs",): JOB_RULE, ("pods",): POD_RULE, ("pods", "pods/ephemeralcontainers"): privilege_rule()}


def test_builders_are_pure():
    assert policies() == policies()



def _rxdm(index: int = 1, **changes) -> dict:
    """Upstream's RxDM daemon as gpufleet renders it: a native sidecar, root, unconfined."""
    daemon = {**rxdm_sidecars()[index], "restartPolicy": "Always"}
    context = {**daemon.get("securityContext", {}), "runAsUser": 0, "seccompProfile": {"type": "Unconfined"}}
    return {**daemon, "securityContext": context, **changes}


HOST_LIB = {"name": "nvidia", "hostPath": {"path": "/home/kubernetes/bin/nvidia/lib64"}}


def gpudirect_pod(containers=None, init=None, volumes=None, owners=None, **spec) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "ownerReferences": [JOB_OWNER] if owners is None else owners},
            "spec": {"containers": containers or [GPU], "initContainers": [_rxdm()] if init is None else init,
                     "volumes": [HOST_LIB] if volumes is None else volumes, **spec}}


ROOT_SHELL = {"name": "x", "image": "busybox", "securityContext": {"privileged": True}}
PRIVILEGE_CASES = {
    "the rendered GPUDirect pod": (gpudirect_pod(), True),
    "a plain baseline pod": (pod([CPU]), True),
    "a privileged container": (pod([CPU, ROOT_SHELL]), False),
    "hostNetwork": ({**pod([CPU]), "spec": {**pod([CPU])["spec"], "hostNetwork": True}}, False),
    "hostPID in a GPU pod": (gpudirect_pod(hostPID=True), False),
    "a host port": (pod([{**CPU, "ports": [{"containerPort": 22, "hostPort": 22}]}]), False),
    "hostPath without a GPU (lands on the system pool)": (gpudirect_pod(containers=[CPU], init=[]), False),
    "hostPath in a bare GPU pod": (gpudirect_pod(init=[], owners=[]), False),
    "hostPath outside the NCCL paths": (gpudirect_pod(volumes=[{"name": "root", "hostPath": {"path": "/"}}]), False),
    "the RxDM image with another command": (gpudirect_pod(init=[_rxdm(command=["/bin/sh", "-c", "id"])]), False),
    "the RxDM image with other args": (gpudirect_pod(init=[_rxdm(args=["sleep 1d"])]), False),
    "NET_ADMIN on another image": (gpudirect_pod(containers=[{**GPU, "securityContext": {"capabilities": {"add": ["NET_ADMIN"]}}}]), False),
    "SYS_ADMIN on the RxDM sidecar": (gpudirect_pod(init=[_rxdm(securityContext={"capabilities": {"add": ["NET_ADMIN", "SYS_ADMIN"]}})]), False),
    "unconfined seccomp on the training container": (gpudirect_pod(containers=[{**GPU, "securityContext": {"seccompProfile": {"type": "Unconfined"}}}]), False),
    "an ephemeral debug container with NET_ADMIN": (gpudirect_pod(ephemeralContainers=[{"name": "d", "image": "busybox", "securityContext": {"capabilities": {"add": ["NET_ADMIN"]}}}]), False),
    "the RxDM sidecar in a CPU pod": (gpudirect_pod(containers=[CPU], volumes=[]), False),
    "baseline capabilities on any image": (pod([{**CPU, "securityContext": {"capabilities": {"add": ["CHOWN"]}}}]), True),
}


@pytest.mark.parametrize("case", sorted(PRIVILEGE_CASES))
def test_only_the_gpudirect_sidecar_exceeds_baseline_and_only_in_an_admitted_gpu_pod(case):
    """Review follow-up: GPUDirect tenants' namespaces enforce PSA privileged and tenants hold edit;
    without this policy any member could start a privileged pod on the system pool."""
    obj, admitted = PRIVILEGE_CASES[case]
    assert evaluate(privilege_rule(), obj) is admitted
