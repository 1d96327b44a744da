"""GPU health that keeps a bad node out (issue 26): the checker taints a failing node through the Kubernetes
API double, no run's pod tolerates that taint (so the scheduler's TaintToleration filter skips the node),
and the DaemonSet the scheduler stack ships validates against the vendored Kubernetes schema.

The checker's judgement is cluster-toolkit v1.95.0's gpu-healthcheck (GPU count, uncorrected volatile ECC;
examples/gke-consumption-options/dws-flex-start/nccl-jobset-example.yaml:96-111) plus the ``XidCriticalError``
condition of GKE's device plugin (container-engine-accelerators 992db812 pkg/gpu/nvidia/health_check/
health_checker.go:41), and it never taints a healthy node by accident: three consecutive failing samples,
only after the node advertised its GPUs in this boot, no verdict when nvidia-smi cannot run; the taint is
lifted when the boot ID changed and the checks pass, the device plugin's rule for its condition
(health_checker.go:126-143). The double speaks the Node GET / merge-PATCH the checker uses
(tests/jobs/k8s_double.py); ``status.nodeInfo.bootID`` and ``status.allocatable`` are the core/v1 Node
fields (kubernetes staging/src/k8s.io/api/core/v1/types.go NodeSystemInfo.BootID, NodeStatus.Allocatable).
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
HEALTHY_8 = "".join(f"{i}, Enabled, 0\n" for i in range(8))
ECC_ERRORS = HEALTHY_8.replace("5, Enabled, 0", "5, Enabled, 2")
EXPECTED = {"h100": 8}


@pytest.mark.parametrize(("csv", "found"), [
    (HEALTHY_8, []),
    ("".join(f"{i}, Enabled, 0\n" for i in range(7)), ["7 GPUs visible, the pool's machine has 8"]),
    (HEALTHY_8.replace("3, Enabled, 0", "3, Enabled, [N/A]"), ["GPU 3 has ECC enabled and reports its ECC count as [N/A] (an error state)"]),
    (ECC_ERRORS, ["GPU 5 has 2 uncorrected ECC errors"]),
    ("", ["0 GPUs visible, the pool's machine has 8"]),
])
def test_the_toolkits_two_checks(csv, found):
    assert checker.faults(csv, 8) == found


def test_an_ecc_count_of_na_is_no_fault_when_ecc_is_off():
    """With ECC disabled nvidia-smi has no count to give: [N/A] then is the mode, not an error state."""
    assert checker.faults("".join(f"{i}, Disabled, [N/A]\n" for i in range(8)), 8) == []


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


def node(name: str, pool: str = "h100", gpus: str = "8", boot: str = "boot-1", **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {checker.POOL_LABEL: pool}}, "spec": {"taints": [GPU_TAINT]},
            "status": {"allocatable": {"nvidia.com/gpu": gpus}, "nodeInfo": {"bootID": boot}, **status}}


def rounds(d: K8sDouble, name: str, csv: str, state: checker.NodeState, count: int = checker.FAILURES_TO_TAINT) -> list[str]:
    return [checker.check_once(api(d), name, csv, EXPECTED, state) for _ in range(count)]


def patches(d: K8sDouble) -> int:
    return len([r for r in d.requests if r.method == "PATCH"])


def reboot(d: K8sDouble, name: str, boot: str) -> None:
    """What the kubelet reports after a reboot: a new status.nodeInfo.bootID on the same Node."""
    api(d).patch_node(name, {"status": {"nodeInfo": {"bootID": boot}}})


def test_a_failing_node_is_tainted_once_and_a_multi_node_run_then_skips_it(double, example_configs):
    """Without the checker nothing taints the node and the run's pods fit it (the first assertion)."""
    docs = [d for s in load_all(cluster_configs=example_configs, vault=load_vault_view()) if s.gke is not None and s.nodes > 1 for d in manifests(s)]
    pods = [d["spec"]["template"]["spec"] for d in docs if d["kind"] == "Job"]
    assert pods, "the example fleet has multi-node GKE jobs"
    bad, good = double.add_node(node("gke-h100-a")), double.add_node(node("gke-h100-b"))
    assert all(schedulable(p, bad) for p in pods)

    state = checker.NodeState()
    said = rounds(double, "gke-h100-a", ECC_ERRORS, state)
    assert said[-1].startswith("tainted node gke-h100-a")
    tainted = double.node("gke-h100-a")
    assert tainted["spec"]["taints"] == [GPU_TAINT, UNHEALTHY]
    assert tainted["metadata"]["annotations"][checker.REASON_ANNOTATION] == "boot boot-1: GPU 5 has 2 uncorrected ECC errors"
    assert not any(schedulable(p, tainted) for p in pods) and all(schedulable(p, double.node("gke-h100-b")) for p in pods)

    before = patches(double)
    assert "already tainted" in checker.check_once(api(double), "gke-h100-a", "", EXPECTED, state)
    assert checker.check_once(api(double), "gke-h100-b", HEALTHY_8, EXPECTED, checker.NodeState()) == "node gke-h100-b: 8 GPUs healthy"
    assert patches(double) == before
    assert double.node("gke-h100-b")["spec"]["taints"] == [GPU_TAINT] and good["metadata"]["name"] == "gke-h100-b"


def test_one_or_two_failing_samples_do_not_taint(double):
    """Only FAILURES_TO_TAINT consecutive failing samples taint: a pass in between starts the count again."""
    double.add_node(node("n"))
    state = checker.NodeState()
    assert all("failing sample" in said for said in rounds(double, "n", ECC_ERRORS, state, 2))
    checker.check_once(api(double), "n", HEALTHY_8, EXPECTED, state)
    rounds(double, "n", ECC_ERRORS, state, 2)
    assert patches(double) == 0 and UNHEALTHY not in double.node("n")["spec"]["taints"]
    assert checker.check_once(api(double), "n", ECC_ERRORS, EXPECTED, state).startswith("tainted node n")


def test_a_new_node_is_not_judged_before_the_device_plugin_advertises_its_gpus(double):
    """A fresh node sees no GPU until the driver installer and device plugin ran: that is not a fault."""
    double.add_node(node("n", gpus="0"))
    state = checker.NodeState()
    said = rounds(double, "n", "", state, 5)
    assert all("not judged" in s for s in said) and patches(double) == 0
    api(double).patch_node("n", {"status": {"allocatable": {"nvidia.com/gpu": "8"}}})
    assert rounds(double, "n", "", state)[-1].startswith("tainted node n")  # from now on an empty answer is a fault


@pytest.fixture
def smi(tmp_path):
    """Stand-ins for nvidia-smi as real executables (the checker runs a subprocess; no GPU here)."""
    def make(name: str, body: str) -> str:
        path = tmp_path / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
        return str(path)
    return make


def test_nvidia_smi_that_cannot_run_is_no_verdict(double, smi, tmp_path):
    """A failing exit, a hang or a missing binary says nothing about the GPUs: no taint, no count, a log line."""
    double.add_node(node("n"))
    state = checker.NodeState(boot_id="boot-1", ready=True, failing=checker.FAILURES_TO_TAINT - 1)
    broken = smi("broken", "echo 'Failed to initialize NVML: Driver/library version mismatch' >&2; exit 18")
    for binary, why in ((broken, "exited 18: Failed to initialize NVML"), (smi("hangs", "exec sleep 30"), "did not answer within 0.5 s"),
                        (str(tmp_path / "missing"), "could not start")):
        said = checker.run_round(api(double), "n", binary, EXPECTED, state, timeout_seconds=0.5)
        assert said.startswith("node n: not judged this round, nvidia-smi could not run") and why in said, said
    assert patches(double) == 0 and state.failing == checker.FAILURES_TO_TAINT - 1
    healthy = smi("ok", "printf '" + HEALTHY_8.replace("\n", "\\n") + "'")
    assert checker.run_round(api(double), "n", healthy, EXPECTED, state) == "node n: 8 GPUs healthy" and state.failing == 0


def test_the_taint_stays_when_the_gpus_pass_again_in_the_same_boot(double):
    double.add_node(node("n"))
    state = checker.NodeState()
    rounds(double, "n", "", state)
    assert "still tainted" in checker.check_once(api(double), "n", HEALTHY_8, EXPECTED, state)
    assert UNHEALTHY in double.node("n")["spec"]["taints"]


def test_the_taint_is_lifted_after_a_reboot_when_the_checks_pass(double):
    """The device plugin's rule for its condition (health_checker.go:126-143): a new boot ID is a repaired node."""
    double.add_node(node("n"))
    state = checker.NodeState()
    rounds(double, "n", ECC_ERRORS, state)
    reboot(double, "n", "boot-2")
    said = checker.check_once(api(double), "n", HEALTHY_8, EXPECTED, state)
    assert said == "untainted node n: boot boot-2 differs from the tainted boot boot-1 and 8 GPUs pass"
    after = double.node("n")
    assert after["spec"]["taints"] == [GPU_TAINT] and checker.REASON_ANNOTATION not in after["metadata"].get("annotations", {})


def test_a_rebooted_node_that_still_fails_stays_tainted_and_is_dated_to_its_new_boot(double):
    double.add_node(node("n"))
    state = checker.NodeState()
    rounds(double, "n", ECC_ERRORS, state)
    reboot(double, "n", "boot-2")
    rounds(double, "n", ECC_ERRORS, state)
    after = double.node("n")
    assert after["spec"]["taints"] == [GPU_TAINT, UNHEALTHY]
    assert after["metadata"]["annotations"][checker.REASON_ANNOTATION] == "boot boot-2: GPU 5 has 2 uncorrected ECC errors"


def test_a_taint_with_no_boot_recorded_is_not_lifted(double):
    """A taint written before boot IDs were recorded (or by hand) shows no reboot since: it stays."""
    double.add_node({**node("n"), "spec": {"taints": [GPU_TAINT, UNHEALTHY]}, "metadata": {
        "name": "n", "labels": {checker.POOL_LABEL: "h100"}, "annotations": {checker.REASON_ANNOTATION: "GPU 5 has 2 uncorrected ECC errors"}}})
    assert "still tainted" in checker.check_once(api(double), "n", HEALTHY_8, EXPECTED, checker.NodeState())
    assert patches(double) == 0


def test_the_device_plugins_xid_condition_taints_the_node(double):
    xid = {"type": checker.XID_CONDITION, "status": "True", "reason": '{"79":1}'}
    double.add_node(node("n", conditions=[{"type": "Ready", "status": "True"}, xid]))
    assert rounds(double, "n", HEALTHY_8, checker.NodeState())[-1].startswith("tainted node n")
    assert double.node("n")["metadata"]["annotations"][checker.REASON_ANNOTATION] == 'boot boot-1: node condition XidCriticalError: {"79":1}'


def test_a_concurrent_taint_writer_is_not_overwritten(double, monkeypatch):
    """Merge patch replaces the whole taint list: the resourceVersion read makes a stale write a 409."""
    double.add_node(node("n"))
    client = api(double)
    stale = client.node("n")
    other = {"key": "example.com/maintenance", "value": "true", "effect": "NoSchedule"}
    client.patch_node("n", {"spec": {"taints": [GPU_TAINT, other]}})
    monkeypatch.setattr(client, "node", lambda name: stale)
    state = checker.NodeState(boot_id="boot-1", ready=True, failing=checker.FAILURES_TO_TAINT - 1)
    assert "409" in checker.check_once(client, "n", "", EXPECTED, state)
    assert double.node("n")["spec"]["taints"] == [GPU_TAINT, other]


def test_nodes_outside_the_watched_pools_are_left_alone(double):
    double.add_node(node("cpu", pool="system"))
    assert "no checked pool" in checker.check_once(api(double), "cpu", "", EXPECTED, checker.NodeState())
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
