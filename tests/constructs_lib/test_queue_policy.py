"""GPU workloads in tenant namespaces go through Kueue (review B9): the admission policies, and their CEL evaluated.

The CEL is evaluated with cel-python (a CEL implementation, not Kubernetes): it checks the logic
of each rule on Job and Pod objects shaped like the API server's. Kubernetes' own type checker is
not run here.
"""

from __future__ import annotations

import celpy
import pytest

from clusters.gpudirect_upstream import first, rxdm_sidecars
from constructs_lib.k8s_queue_policy import JOB_RULE, POD_RULE, exec_rule, policies, privilege_rule, privilege_rules

# Containers as a tenant in a GPUDirect namespace must write them: no privilege escalation (no_new_privs).
NO_ESCALATION = {"allowPrivilegeEscalation": False}
GPU = {"name": "train", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "8"}}, "securityContext": NO_ESCALATION}
CPU = {"name": "prep", "image": "i", "resources": {"requests": {"cpu": "1"}}, "securityContext": NO_ESCALATION}
JOB_OWNER = {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "u", "controller": True}


def evaluate(rule: str, obj: dict) -> bool:
    env = celpy.Environment()
    return bool(env.program(env.compile(rule)).evaluate({"object": celpy.json_to_cel(obj)}))


def job(containers: list[dict], labels: dict | None = None, init: list[dict] | None = None) -> dict:
    spec = {"containers": containers, **({"initContainers": init} if init else {})}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", **({"labels": labels} if labels is not None else {})},
            "spec": {"template": {"spec": spec}}}


NON_ROOT = {"runAsNonRoot": True, "runAsUser": 1000}


def pod(containers: list[dict], owners: list[dict] | None = None, init: list[dict] | None = None) -> dict:
    spec = {"containers": containers, "securityContext": dict(NON_ROOT), **({"initContainers": init} if init else {})}
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
    assert kinds == ["ValidatingAdmissionPolicy"] * 4 + ["ValidatingAdmissionPolicyBinding"] * 4
    for v in manifests.values():
        m = v["manifest"]
        assert m["apiVersion"] == "admissionregistration.k8s.io/v1"
        if m["kind"] == "ValidatingAdmissionPolicyBinding":
            assert m["spec"]["validationActions"] == ["Deny"]
            tenant = [{"key": "gpufleet.dev/tenant", "operator": "Exists"}]
            privileged = [{"key": "pod-security.kubernetes.io/enforce", "operator": "In", "values": ["privileged"]}]
            expected = tenant + (privileged if m["spec"]["policyName"] in ("gpufleet-beyond-baseline-only-as-gpudirect", "gpufleet-no-shell-in-the-gpudirect-sidecar") else [])
            assert m["spec"]["matchResources"]["namespaceSelector"] == {"matchExpressions": expected}
            assert any(d.startswith("kubernetes_manifest.vap_") for d in v["depends_on"])
        else:
            assert m["spec"]["failurePolicy"] == "Fail"
    rules = {tuple(m["manifest"]["spec"]["matchConstraints"]["resourceRules"][0]["resources"]): [v["expression"] for v in m["manifest"]["spec"]["validations"]]
             for m in manifests.values() if m["manifest"]["kind"] == "ValidatingAdmissionPolicy"}
    assert rules == {("jobs",): [JOB_RULE], ("pods",): [POD_RULE], ("pods", "pods/ephemeralcontainers"): list(privilege_rules().values()),
                     ("pods/exec", "pods/attach"): [exec_rule()]}


def test_builders_are_pure():
    assert policies() == policies()


def test_rules_built_once_equal_a_fresh_build_and_are_not_shared():
    """privilege_rules and exec_rule are built once per process (each cluster used to rebuild them):
    the remembered ones equal a build from scratch, and a caller changing its dict changes no one else's."""
    from constructs_lib import k8s_queue_policy

    assert privilege_rules() == dict(k8s_queue_policy._privilege_rules.__wrapped__())
    assert exec_rule() == k8s_queue_policy.exec_rule.__wrapped__()
    mine = privilege_rules()
    mine["non_root"] = "true"
    del mine["ephemeral"]
    assert privilege_rules() == dict(k8s_queue_policy._privilege_rules.__wrapped__())



def _rxdm(index: int = 1, **changes) -> dict:
    """Upstream's RxDM daemon as gpufleet renders it: a native sidecar, root, unconfined."""
    daemon = {**rxdm_sidecars()[index], "restartPolicy": "Always"}
    context = {**daemon.get("securityContext", {}), "runAsUser": 0, "seccompProfile": {"type": "Unconfined"}}
    return {**daemon, "securityContext": context, **changes}


HOST_LIB = {"name": "nvidia", "hostPath": {"path": "/home/kubernetes/bin/nvidia/lib64"}}
SYS = {"name": "sys", "hostPath": {"path": "/sys"}}
PROC_SYS = {"name": "proc-sys", "hostPath": {"path": "/proc/sys"}}
LIB_MOUNT = {"name": "nvidia", "mountPath": "/usr/local/nvidia/lib64", "readOnly": True}
TRAIN = {**GPU, "volumeMounts": [LIB_MOUNT]}


def gpudirect_pod(containers=None, init=None, volumes=None, owners=None, annotations=None, **spec) -> dict:
    """A TCPXO run's pod as gpufleet renders it: the training container (uid 1000 from the pod's
    context, the library directory read-only) and upstream's RxDM daemon as a native sidecar."""
    metadata = {"name": "p", "ownerReferences": [JOB_OWNER] if owners is None else owners, **({"annotations": annotations} if annotations else {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
            "spec": {"securityContext": dict(NON_ROOT), "containers": containers or [TRAIN],
                     "initContainers": [_rxdm()] if init is None else init,
                     "volumes": [HOST_LIB, SYS, PROC_SYS] if volumes is None else volumes, **spec}}


def with_context(container: dict, **context) -> dict:
    return {**container, "securityContext": {**container.get("securityContext", {}), **context}}


# Each escape a tenant with `edit` tried (issue: root on a GPU node), as a pod of an admitted GPU Job.
ESCAPES = {
    "/proc/sys read-write in the training container (kernel.core_pattern)":
        gpudirect_pod(containers=[{**TRAIN, "volumeMounts": [LIB_MOUNT, {"name": "proc-sys", "mountPath": "/hostprocsysfs"}]}]),
    "/proc/sys read-only in the training container":
        gpudirect_pod(containers=[{**TRAIN, "volumeMounts": [LIB_MOUNT, {"name": "proc-sys", "mountPath": "/hostprocsysfs", "readOnly": True}]}]),
    "/sys in the training container": gpudirect_pod(containers=[{**TRAIN, "volumeMounts": [LIB_MOUNT, {"name": "sys", "mountPath": "/hostsysfs"}]}]),
    "the host NVIDIA/NCCL library directory read-write":
        gpudirect_pod(containers=[{**TRAIN, "volumeMounts": [{"name": "nvidia", "mountPath": "/usr/local/nvidia/lib64"}]}]),
    "the library directory read-only at another path":
        gpudirect_pod(containers=[{**TRAIN, "volumeMounts": [{**LIB_MOUNT, "mountPath": "/opt/lib"}]}]),
    "uid 0 in the training container": gpudirect_pod(containers=[with_context(TRAIN, runAsUser=0)]),
    "runAsNonRoot false in the training container": gpudirect_pod(containers=[with_context(TRAIN, runAsNonRoot=False)]),
    "no runAsNonRoot anywhere": {**gpudirect_pod(), "spec": {**gpudirect_pod()["spec"], "securityContext": {}}},
    "AppArmor unconfined (annotation)": gpudirect_pod(annotations={"container.apparmor.security.beta.kubernetes.io/train": "unconfined"}),
    "AppArmor unconfined (container field)": gpudirect_pod(containers=[with_context(TRAIN, appArmorProfile={"type": "Unconfined"})]),
    "AppArmor unconfined (pod field)": gpudirect_pod(securityContext={**NON_ROOT, "appArmorProfile": {"type": "Unconfined"}}),
    "procMount Unmasked": gpudirect_pod(containers=[with_context(TRAIN, procMount="Unmasked")]),
    "SELinux type spc_t": gpudirect_pod(containers=[with_context(TRAIN, seLinuxOptions={"type": "spc_t"})]),
    "SELinux user on the pod": gpudirect_pod(securityContext={**NON_ROOT, "seLinuxOptions": {"user": "system_u"}}),
    "an unsafe sysctl": gpudirect_pod(securityContext={**NON_ROOT, "sysctls": [{"name": "kernel.core_pattern", "value": "|/tmp/x"}]}),
    "Windows HostProcess": gpudirect_pod(containers=[with_context(TRAIN, windowsOptions={"hostProcess": True})]),
    "SYS_ADMIN on the training container": gpudirect_pod(containers=[with_context(TRAIN, capabilities={"add": ["SYS_ADMIN"]})]),
    "hostPID": gpudirect_pod(hostPID=True),
    "a host port": gpudirect_pod(containers=[{**TRAIN, "ports": [{"containerPort": 22, "hostPort": 22}]}]),
    "a fake RxDM: right name, another image": gpudirect_pod(init=[_rxdm(image="busybox")]),
    "a fake RxDM: right image, a shell command": gpudirect_pod(init=[_rxdm(command=["/bin/sh", "-c", "echo x > /hostprocsysfs/kernel/core_pattern"])]),
    "the RxDM sidecar with LD_PRELOAD": gpudirect_pod(init=[_rxdm(env=[*_rxdm()["env"], {"name": "LD_PRELOAD", "value": "/tmp/x.so"}])]),
    "the RxDM sidecar with a tenant volume over its scripts":
        gpudirect_pod(init=[_rxdm(volumeMounts=[*_rxdm()["volumeMounts"], {"name": "scratch", "mountPath": "/fts"}])],
                      volumes=[HOST_LIB, SYS, PROC_SYS, {"name": "scratch", "emptyDir": {}}]),
    "the RxDM sidecar mounting / ": gpudirect_pod(init=[_rxdm(volumeMounts=[{"name": "root", "mountPath": "/hostsysfs"}])],
                                                  volumes=[HOST_LIB, {"name": "root", "hostPath": {"path": "/"}}]),
    "an ephemeral container mounting /proc/sys":
        gpudirect_pod(ephemeralContainers=[{"name": "d", "image": "busybox", "volumeMounts": [{"name": "proc-sys", "mountPath": "/p"}]}]),
    "a postStart hook on the RxDM sidecar (a root shell beside /proc/sys)":
        gpudirect_pod(init=[_rxdm(lifecycle={"postStart": {"exec": {"command": ["/bin/sh", "-c", "echo x > /hostprocsysfs/kernel/core_pattern"]}}})]),
    "an exec probe on the RxDM sidecar": gpudirect_pod(init=[_rxdm(livenessProbe={"exec": {"command": ["/bin/sh", "-c", "id"]}})]),
    "the RxDM image under another container name": gpudirect_pod(init=[_rxdm(name="helper")]),
    "host devices injected into the training container":
        gpudirect_pod(annotations={"devices.gke.io/container.train": "- path: /dev/sda\n"}),
    "more host devices for the RxDM sidecar":
        gpudirect_pod(annotations={"devices.gke.io/container.tcpxo-daemon": "- path: /dev/nvidia0\n- path: /dev/mem\n"}),
    "an ephemeral container as root": gpudirect_pod(ephemeralContainers=[{"name": "d", "image": "busybox", "securityContext": {"runAsUser": 0}}]),
    # Red team 22: the exact daemon as the pod's only regular container (exec without -c lands in it).
    "the RxDM daemon as the sole regular container":
        gpudirect_pod(containers=[{k: v for k, v in {**_rxdm(), "resources": {"limits": {"nvidia.com/gpu": "8"}}}.items() if k != "restartPolicy"}],
                      init=[]),
    "the RxDM daemon asking for the GPUs": gpudirect_pod(init=[_rxdm(resources={"limits": {"nvidia.com/gpu": "8"}})]),
    "setuid back to root (allowPrivilegeEscalation unset)":
        gpudirect_pod(containers=[{**TRAIN, "securityContext": {"runAsNonRoot": True}}]),
    "setuid back to root (allowPrivilegeEscalation true)": gpudirect_pod(containers=[with_context(TRAIN, allowPrivilegeEscalation=True)]),
    "an ephemeral container that may escalate":
        gpudirect_pod(ephemeralContainers=[{"name": "d", "image": "busybox", "securityContext": {"allowPrivilegeEscalation": True}}]),
}


@pytest.mark.parametrize("case", sorted(ESCAPES))
def test_every_escape_from_a_gpu_pod_is_refused(case):
    """Each attack from the issue, evaluated with a CEL implementation against the generated rule;
    the policy on the previous main admitted the /proc/sys, /sys, library, root, AppArmor, procMount,
    SELinux and sidecar-env/volume cases."""
    assert evaluate(privilege_rule(), ESCAPES[case]) is False


def test_the_legitimate_gpudirect_pod_is_admitted_and_each_rule_has_a_message():
    assert evaluate(privilege_rule(), gpudirect_pod()) is True
    (privilege,) = [p for p in policies() if p["metadata"]["name"] == "gpufleet-beyond-baseline-only-as-gpudirect"]
    assert [v["expression"] for v in privilege["spec"]["validations"]] == list(privilege_rules().values())
    assert all(v["message"] for v in privilege["spec"]["validations"])


ROOT_SHELL = {"name": "x", "image": "busybox", "securityContext": {"privileged": True}}
PRIVILEGE_CASES = {
    "the GPUDirect pod": (gpudirect_pod(), True),
    "a plain baseline pod": (pod([CPU]), True),
    "a privileged container": (pod([CPU, ROOT_SHELL]), False),
    "hostNetwork": ({**pod([CPU]), "spec": {**pod([CPU])["spec"], "hostNetwork": True}}, False),
    "hostPID in a GPU pod": (gpudirect_pod(hostPID=True), False),
    "a host port": (pod([{**CPU, "ports": [{"containerPort": 22, "hostPort": 22}]}]), False),
    "hostPath without a GPU (lands on the system pool)": (gpudirect_pod(containers=[{**CPU, "volumeMounts": [LIB_MOUNT]}], init=[]), False),
    "hostPath in a bare GPU pod": (gpudirect_pod(init=[], owners=[]), False),
    "hostPath outside the NCCL paths": (gpudirect_pod(volumes=[{"name": "root", "hostPath": {"path": "/"}}]), False),
    "the RxDM image with another command": (gpudirect_pod(init=[_rxdm(command=["/bin/sh", "-c", "id"])]), False),
    "the RxDM image with other args": (gpudirect_pod(init=[_rxdm(args=["sleep 1d"])]), False),
    "NET_ADMIN on another image": (gpudirect_pod(containers=[{**GPU, "securityContext": {"capabilities": {"add": ["NET_ADMIN"]}}}]), False),
    "SYS_ADMIN on the RxDM sidecar": (gpudirect_pod(init=[_rxdm(securityContext={"capabilities": {"add": ["NET_ADMIN", "SYS_ADMIN"]}})]), False),
    "unconfined seccomp on the training container": (gpudirect_pod(containers=[{**GPU, "securityContext": {"seccompProfile": {"type": "Unconfined"}}}]), False),
    "an ephemeral debug container with NET_ADMIN": (gpudirect_pod(ephemeralContainers=[{"name": "d", "image": "busybox", "securityContext": {"capabilities": {"add": ["NET_ADMIN"]}}}]), False),
    "the RxDM sidecar in a CPU pod": (gpudirect_pod(containers=[CPU], volumes=[]), False),
    "baseline capabilities on any image": (pod([{**CPU, "securityContext": {**NO_ESCALATION, "capabilities": {"add": ["CHOWN"]}}}]), True),
    # Red team 22: a "0" GPU limit asked for no GPU, yet counted as a GPU pod for hostPaths and the RxDM.
    "hostPath and the RxDM with a zero GPU limit": (gpudirect_pod(containers=[{**TRAIN, "resources": {"limits": {"nvidia.com/gpu": "0"}}}]), False),
    "hostPath and the RxDM with a zero GPU limit spelled 00": (gpudirect_pod(containers=[{**TRAIN, "resources": {"limits": {"nvidia.com/gpu": "00"}}}]), False),
}


@pytest.mark.parametrize("case", sorted(PRIVILEGE_CASES))
def test_only_the_gpudirect_sidecar_exceeds_baseline_and_only_in_an_admitted_gpu_pod(case):
    """Review follow-up: GPUDirect tenants' namespaces enforce PSA privileged and tenants hold edit;
    without this policy any member could start a privileged pod on the system pool."""
    obj, admitted = PRIVILEGE_CASES[case]
    assert evaluate(privilege_rule(), obj) is admitted


@pytest.mark.parametrize(("container", "allowed"), [("tcpx-daemon", False), ("tcpxo-daemon", False), ("train", True), (None, False), ("", False)])
def test_no_exec_or_attach_into_the_rxdm_sidecar(container, allowed):
    """`edit` grants pods/exec: a shell in the root, NET_ADMIN, /proc/sys-mounting sidecar would undo the box.
    Red team 22: an exec naming no container reached a pod's only container, the RxDM daemon (the raw API
    leaves the name out; kubectl always sends one), so the name is required."""
    options = {"kind": "PodExecOptions", "apiVersion": "v1", "command": ["sh"], **({"container": container} if container else {})}
    assert evaluate(exec_rule(), options) is allowed


TCPX_TRAIN = with_context({**TRAIN, "volumeMounts": [LIB_MOUNT]}, capabilities={"drop": ["ALL"], "add": ["IPC_LOCK"]})
# The TCPX daemon's own host volumes as upstream names them (libraries, tcpx-socket, sys, proc).
ON_TCPX = {"init": [_rxdm(0)], "volumes": [HOST_LIB, *(v for v in first("nccl-test-tcpx", "Pod")["spec"]["volumes"] if "hostPath" in v)]}
# IPC_LOCK is upstream's one capability for a workload container (TCPX's nccl-test container,
# container-engine-accelerators gpudirect-tcpx/nccl-test-latest.yaml:103-106): only there, only that one.
IPC_LOCK_CASES = {
    "IPC_LOCK on train beside the exact TCPX daemon": (gpudirect_pod(containers=[TCPX_TRAIN], **ON_TCPX), True),
    "IPC_LOCK on train beside the TCPXO daemon (upstream adds none there)": (gpudirect_pod(containers=[TCPX_TRAIN]), False),
    "IPC_LOCK on train with no daemon at all": (gpudirect_pod(containers=[TCPX_TRAIN], init=[], volumes=[HOST_LIB]), False),
    "IPC_LOCK on train beside a fake TCPX daemon": (gpudirect_pod(containers=[TCPX_TRAIN], init=[_rxdm(0, image="busybox")],
                                                                  volumes=ON_TCPX["volumes"]), False),
    "IPC_LOCK on another container beside the TCPX daemon":
        (gpudirect_pod(containers=[TRAIN, {**TCPX_TRAIN, "name": "helper", "volumeMounts": []}], **ON_TCPX), False),
    "IPC_LOCK on an init container beside the TCPX daemon":
        (gpudirect_pod(init=[_rxdm(0), {**TCPX_TRAIN, "name": "gpu-preflight", "volumeMounts": []}], volumes=ON_TCPX["volumes"]), False),
    "IPC_LOCK and SYS_ADMIN on train beside the TCPX daemon":
        (gpudirect_pod(containers=[with_context(TCPX_TRAIN, capabilities={"add": ["IPC_LOCK", "SYS_ADMIN"]})], **ON_TCPX), False),
    "NET_ADMIN on train beside the TCPX daemon":
        (gpudirect_pod(containers=[with_context(TCPX_TRAIN, capabilities={"add": ["NET_ADMIN"]})], **ON_TCPX), False),
    "IPC_LOCK on train without a seccomp filter":
        (gpudirect_pod(containers=[with_context(TCPX_TRAIN, seccompProfile={"type": "Unconfined"})], **ON_TCPX), False),
    "IPC_LOCK on train as root": (gpudirect_pod(containers=[with_context(TCPX_TRAIN, runAsUser=0)], **ON_TCPX), False),
    "IPC_LOCK in an ephemeral container":
        (gpudirect_pod(containers=[TCPX_TRAIN], ephemeralContainers=[{"name": "train", "image": "busybox",
                                                                      "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}}}], **ON_TCPX), False),
    "IPC_LOCK on train in a pod no Job controls": (gpudirect_pod(containers=[TCPX_TRAIN], owners=[], **ON_TCPX), False),
}


@pytest.mark.parametrize("case", sorted(IPC_LOCK_CASES))
def test_ipc_lock_only_on_the_training_container_of_a_tcpx_pod(case):
    """The policy before IPC_LOCK was rendered refused the first case (the rendered TCPX pod) and
    admitted none of the rest; now it admits exactly the first."""
    obj, admitted = IPC_LOCK_CASES[case]
    assert evaluate(privilege_rule(), obj) is admitted
