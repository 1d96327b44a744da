"""GPU health that keeps a bad node out (issue 26): the checker taints a failing node through the Kubernetes
API double, no run's pod tolerates that taint (so the scheduler's TaintToleration filter skips the node),
and the DaemonSet the scheduler stack ships validates against the vendored Kubernetes schema.

The checker's judgement is cluster-toolkit's gpu-healthcheck (GPU count, uncorrected volatile ECC;
examples/gke-consumption-options/dws-flex-start/nccl-jobset-example.yaml) plus the ``XidCriticalError``
condition of GKE's device plugin (container-engine-accelerators pkg/gpu/nvidia/health_check/
health_checker.go:41). The double speaks the Node GET / merge-PATCH the checker uses (tests/jobs/k8s_double.py).
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from clusters.derive.gpu_health import derive_gpu_health
from clusters.derive.pools import derive_gpu_pools
from constructs_lib import gpu_health_check as checker
from constructs_lib.gpu_health import NAME, checker_source, daemonset
from jobs.k8s.render import manifests
from jobs.k8s.schemas import errors
from jobs.loader import load_all
from jobs.vault_refs import load_vault_view
from tests.jobs.k8s_double import K8sDouble

UNHEALTHY = {"key": checker.TAINT_KEY, "value": checker.TAINT_VALUE, "effect": checker.TAINT_EFFECT}
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
HEALTHY_8 = "".join(f"{i}, 0\n" for i in range(8))


@pytest.mark.parametrize(("csv", "found"), [
    (HEALTHY_8, []),
    ("".join(f"{i}, 0\n" for i in range(7)), ["7 GPUs visible, the pool's machine has 8"]),
    (HEALTHY_8.replace("3, 0", "3, [N/A]"), ["GPU 3 reports its ECC count as [N/A] (an error state)"]),
    (HEALTHY_8.replace("5, 0", "5, 2"), ["GPU 5 has 2 uncorrected ECC errors"]),
    ("", ["0 GPUs visible, the pool's machine has 8"]),
])
def test_the_toolkits_two_checks(csv, found):
    assert checker.faults(csv, 8) == found


def tolerates(tolerations: list[dict[str, Any]], taint: dict[str, str]) -> bool:
    """kubernetes staging/src/k8s.io/api/core/v1/toleration.go ToleratesTaint: effect empty or equal, key
    empty with Exists or equal, then Exists matches any value and Equal (the default) needs the value."""
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint["effect"]:
            continue
        if t.get("key") and t["key"] != taint["key"]:
            continue
        if not t.get("key") and t.get("operator") != "Exists":
            continue
        if t.get("operator") == "Exists" or t.get("value", "") == taint.get("value", ""):
            return True
    return False


def schedulable(pod_spec: dict[str, Any], node: dict[str, Any]) -> bool:
    """The scheduler's TaintToleration filter (pkg/scheduler/framework/plugins/tainttoleration): a node is
    filtered out by a NoSchedule or NoExecute taint the pod does not tolerate."""
    taints = [t for t in (node.get("spec") or {}).get("taints") or [] if t["effect"] in ("NoSchedule", "NoExecute")]
    return all(tolerates(pod_spec.get("tolerations") or [], t) for t in taints)


@pytest.fixture
def double():
    d = K8sDouble(namespaces={}).start()
    yield d
    d.stop()


def api(d: K8sDouble) -> checker.Api:
    return checker.Api(d.address, d.token, None)


def node(name: str, pool: str = "h100", **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {checker.POOL_LABEL: pool}}, "spec": {"taints": [GPU_TAINT]}, "status": status}


def test_a_failing_node_is_tainted_once_and_a_multi_node_run_then_skips_it(double, example_configs):
    """Without the checker nothing taints the node and the run's pods fit it (the first assertion)."""
    docs = [d for s in load_all(cluster_configs=example_configs, vault=load_vault_view()) if s.gke is not None and s.nodes > 1 for d in manifests(s)]
    pods = [d["spec"]["template"]["spec"] for d in docs if d["kind"] == "Job"]
    assert pods, "the example fleet has multi-node GKE jobs"
    bad, good = double.add_node(node("gke-h100-a")), double.add_node(node("gke-h100-b"))
    assert all(schedulable(p, bad) for p in pods)

    said = checker.check_once(api(double), "gke-h100-a", HEALTHY_8.replace("5, 0", "5, 2"), {"h100": 8})
    assert said.startswith("tainted node gke-h100-a")
    tainted = double.node("gke-h100-a")
    assert tainted["spec"]["taints"] == [GPU_TAINT, UNHEALTHY]
    assert tainted["metadata"]["annotations"][checker.REASON_ANNOTATION] == "GPU 5 has 2 uncorrected ECC errors"
    assert not any(schedulable(p, tainted) for p in pods) and all(schedulable(p, double.node("gke-h100-b")) for p in pods)

    patches = len([r for r in double.requests if r.method == "PATCH"])
    assert "already tainted" in checker.check_once(api(double), "gke-h100-a", "", {"h100": 8})
    assert checker.check_once(api(double), "gke-h100-b", HEALTHY_8, {"h100": 8}) == "node gke-h100-b: 8 GPUs healthy"
    assert len([r for r in double.requests if r.method == "PATCH"]) == patches
    assert double.node("gke-h100-b")["spec"]["taints"] == [GPU_TAINT] and good["metadata"]["name"] == "gke-h100-b"


def test_the_taint_stays_when_the_gpus_pass_again(double):
    double.add_node(node("n"))
    checker.check_once(api(double), "n", "", {"h100": 8})
    assert checker.check_once(api(double), "n", HEALTHY_8, {"h100": 8}) == "node n: 8 GPUs healthy"
    assert UNHEALTHY in double.node("n")["spec"]["taints"]


def test_the_device_plugins_xid_condition_taints_the_node(double):
    xid = {"type": checker.XID_CONDITION, "status": "True", "reason": '{"79":1}'}
    double.add_node(node("n", conditions=[{"type": "Ready", "status": "True"}, xid]))
    assert checker.check_once(api(double), "n", HEALTHY_8, {"h100": 8}).startswith("tainted node n")
    assert double.node("n")["metadata"]["annotations"][checker.REASON_ANNOTATION] == 'node condition XidCriticalError: {"79":1}'


def test_a_concurrent_taint_writer_is_not_overwritten(double, monkeypatch):
    """Merge patch replaces the whole taint list: the resourceVersion read makes a stale write a 409."""
    double.add_node(node("n"))
    client = api(double)
    stale = client.node("n")
    other = {"key": "example.com/maintenance", "value": "true", "effect": "NoSchedule"}
    client.patch_node("n", {"spec": {"taints": [GPU_TAINT, other]}})
    monkeypatch.setattr(client, "node", lambda name: stale)
    assert "409" in checker.check_once(client, "n", "", {"h100": 8})
    assert double.node("n")["spec"]["taints"] == [GPU_TAINT, other]


def test_nodes_outside_the_watched_pools_are_left_alone(double):
    double.add_node(node("cpu", pool="system"))
    assert "no checked pool" in checker.check_once(api(double), "cpu", "", {"h100": 8})
    assert not [r for r in double.requests if r.method == "PATCH"]


@pytest.mark.parametrize("cluster", ["prod-gke", "dev-gke", "train-a3mega"])
def test_the_daemonset_is_valid_and_tolerates_what_it_must(example_configs, cluster):
    config = next(c for c in example_configs if c.name == cluster)
    pools = derive_gpu_pools(config)
    spec = derive_gpu_health(pools)
    manifest = daemonset(spec)
    assert errors(manifest) == []
    pod = manifest["spec"]["template"]["spec"]
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"][0]["values"] == sorted(p.name for p in pools)
    tainted = {"spec": {"taints": [UNHEALTHY, *({"key": t.key, "value": t.value, "effect": "NoSchedule"} for p in pools for t in p.taints)]}}
    assert schedulable(pod, tainted), "the checker must keep running on a node it tainted"
    assert json.loads(pod["containers"][0]["env"][1]["value"]) == {p.name: p.gpus_per_node for p in pools}


def test_the_scheduler_stack_ships_the_checker_with_nodes_get_and_patch_only(stack_json):
    resources = stack_json("prod-gke-scheduler")["resource"]
    (role,) = [r for r in resources["kubernetes_cluster_role_v1"].values() if r["metadata"]["name"] == NAME]
    assert role["rule"] == [{"api_groups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]
    manifests = resources["kubernetes_manifest"]
    assert manifests["cm_gpu_health"]["manifest"]["data"]["gpu_health_check.py"] == checker_source()
    assert manifests["crb_gpu_health"]["manifest"]["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME}
    assert manifests["crb_gpu_health"]["manifest"]["subjects"] == [{"kind": "ServiceAccount", "name": NAME, "namespace": "kube-system"}]
    manifest = manifests["ds_gpu_health"]["manifest"]
    assert manifest["metadata"]["namespace"] == "kube-system"
    # Pinned to a full release (Python 3.12.8, Debian slim variant), never a moving minor tag.
    assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim", manifest["spec"]["template"]["spec"]["containers"][0]["image"])


def test_fails_when_a_pool_taint_takes_the_health_taints_key():
    """Runs tolerate their pool's taints: a pool taint of the checker's key would let them onto failing nodes."""
    from pydantic import ValidationError

    from clusters.schema import HEALTH_TAINT_KEY, Taint

    assert HEALTH_TAINT_KEY == checker.TAINT_KEY
    with pytest.raises(ValidationError, match="is the GPU health checker's taint; a pool taint of that key lets every run onto failing nodes"):
        Taint(key=checker.TAINT_KEY, value="true")
    assert Taint(key="workload", value="pretrain").key == "workload"
