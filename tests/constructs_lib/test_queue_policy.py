"""GPU workloads in tenant namespaces go through Kueue (review B9): the admission policies, and their CEL evaluated.

The CEL is evaluated with cel-python (a CEL implementation, not Kubernetes): it checks the logic
of each rule on Job and Pod objects shaped like the API server's. Kubernetes' own type checker is
not run here.
"""

from __future__ import annotations

import celpy
import pytest

from constructs_lib.k8s_queue_policy import JOB_RULE, POD_RULE, policies

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
    assert kinds == ["ValidatingAdmissionPolicy"] * 2 + ["ValidatingAdmissionPolicyBinding"] * 2
    for v in manifests.values():
        m = v["manifest"]
        assert m["apiVersion"] == "admissionregistration.k8s.io/v1"
        if m["kind"] == "ValidatingAdmissionPolicyBinding":
            assert m["spec"]["validationActions"] == ["Deny"]
            assert m["spec"]["matchResources"]["namespaceSelector"] == {"matchExpressions": [{"key": "gpufleet.dev/tenant", "operator": "Exists"}]}
            assert any(d.startswith("kubernetes_manifest.vap_") for d in v["depends_on"])
        else:
            assert m["spec"]["failurePolicy"] == "Fail"
    rules = {m["manifest"]["spec"]["matchConstraints"]["resourceRules"][0]["resources"][0]: m["manifest"]["spec"]["validations"][0]["expression"]
             for m in manifests.values() if m["manifest"]["kind"] == "ValidatingAdmissionPolicy"}
    assert rules == {"jobs": JOB_RULE, "pods": POD_RULE}


def test_builders_are_pure():
    assert policies() == policies()
