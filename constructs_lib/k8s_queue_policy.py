"""Admission policies that make every GPU workload in a tenant namespace go through Kueue.

Tenants hold ``edit`` in their namespace and Kueue ignores Jobs without a queue-name label
(unless its install-time ``manageJobsWithoutQueueName`` says otherwise), so without these a
tenant could run GPU pods on any pool, capped only by the namespace-wide ResourceQuota, and the
file's per-pool quota would not hold (review B9). Two ValidatingAdmissionPolicies
(``admissionregistration.k8s.io/v1``, GA since Kubernetes 1.30), bound to every namespace
labelled ``gpufleet.dev/tenant``:

- a ``batch/v1`` Job whose pod template asks for ``nvidia.com/gpu`` must name a LocalQueue
  (``kueue.x-k8s.io/queue-name``): tenants cannot create LocalQueues (``edit`` only aggregates
  Kueue's viewer role), so every such queue is one of gpufleet's per-pool queues;
- a Pod that asks for ``nvidia.com/gpu`` must be controlled by a Job (``ownerReferences`` with
  ``controller: true``): bare GPU pods, Deployments and other controllers never reach a GPU.

Residual risk, stated: a tenant can hand-write a Pod whose controller reference names one of its
own Jobs; that pod still counts against the namespace ResourceQuota (the sum of the tenant's
per-pool quotas), it only escapes the per-pool split. Other job frameworks (JobSet, RayJob,
...) are refused for GPU workloads until they are added here.

A third policy keeps the one exception GPUDirect needs from becoming a way onto the node. A
tenant namespace that can run on a GPUDirect pool is enforced at the ``privileged`` Pod Security
level (the RxDM sidecar adds NET_ADMIN and mounts ``/sys`` and ``/proc/sys``) and its members hold
``edit``; every other tenant namespace keeps Pod Security Admission's ``enforce: baseline`` and
this policy is bound only to the privileged ones. There it replaces baseline, check by check as
kubernetes' pod-security-admission implements it (``privilege_rules``, one validation each): no
privileged container, host namespaces, host ports, unsafe sysctls, ``procMount`` other than
Default, SELinux type/user/role or AppArmor ``Unconfined`` outside baseline, no Windows HostProcess;
capabilities beyond baseline and no seccomp filter only on a container that is exactly a vendored
RxDM daemon (image, command, args and env as ``clusters/gpudirect_upstream``), plus the one capability
upstream gives its own workload container (``IPC_LOCK``, TCPX only) on the container ``train`` of a pod
that runs the exact TCPX daemon, under a seccomp filter. Every other
container runs as non-root. hostPath volumes only at the paths Google's NCCL tests mount, each
mounted only by the container kind and at the mount path upstream uses: ``/sys`` and ``/proc/sys``
only in that exact sidecar (which mounts nothing else), every other container only the socket
directory, the aperture devices and the driver/NCCL library directories, those read-only (GKE
mounts them into the next tenant's GPU containers). A pod with a hostPath or the sidecar's
privileges must request GPUs and be controlled by a Job, so it lands only on a GPU node of the
tenant's own admitted run, never on the system pool. The sidecar is recognised by its upstream
name, image, command, args and env, and may carry no lifecycle hook, probe or volume device (each
would run the tenant's command as root beside ``/proc/sys``); GKE's device-injection annotation
is allowed only as upstream writes it for that daemon. A fourth policy refuses ``CONNECT`` on
``pods/exec`` and ``pods/attach`` into a container of an RxDM daemon's name (``edit`` grants
exec; the object a CONNECT request is evaluated on is its PodExecOptions/PodAttachOptions). Not
checked here: the API server's own CEL type checker and cost estimate (no API server runs here).

Pure builders return the manifests (the CEL is tested by evaluating it); ``TenantQueuePolicy``
declares them as ``kubernetes_manifest``.
"""

from __future__ import annotations

import json
from functools import cache

from constructs import Construct

from clusters.derive.tenants import TENANT_LABEL
from constructs_lib.naming import pin
from constructs_lib.providers import kubernetes

API_VERSION = "admissionregistration.k8s.io/v1"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOB_POLICY = "gpufleet-gpu-jobs-name-a-queue"
POD_POLICY = "gpufleet-gpu-pods-belong-to-a-job"
PRIVILEGE_POLICY = "gpufleet-beyond-baseline-only-as-gpudirect"
# Pod Security Standards, baseline profile, "Capabilities": what may be added without leaving it.
BASELINE_CAPABILITIES = ("AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
                         "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT")


def _literal(value: object) -> str:
    """A CEL literal (CEL string escapes are JSON's)."""
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    return json.dumps(value)


# A quantity that is zero in any spelling ("0", "00", "+0", "0k", "0e3"): nvidia.com/gpu is an
# extended resource, whole numbers only (k8s.io/kubernetes pkg/apis/core/validation
# ValidateResourceQuantityValue + the extended-resource integer check), so anything else is at least one GPU.
ZERO_QUANTITY = r"^[+-]?0+(\.0*)?([eE][+-]?[0-9]+|[a-zA-Z]+)?$"


def _asks_gpu(c: str) -> str:
    """CEL: container ``c`` requests or limits a non-zero count of nvidia.com/gpu (a "0" limit asks
    for none and schedules anywhere, the system pool included)."""
    return " || ".join(
        f"(has({c}.resources.{kind}) && 'nvidia.com/gpu' in {c}.resources.{kind}"
        f" && !string({c}.resources.{kind}['nvidia.com/gpu']).matches({_literal(ZERO_QUANTITY)}))"
        for kind in ("limits", "requests"))


def requests_gpu(pod_spec: str) -> str:
    """CEL: some container or init container of ``pod_spec`` requests or limits nvidia.com/gpu."""
    containers = f"({pod_spec}.containers + (has({pod_spec}.initContainers) ? {pod_spec}.initContainers : []))"
    return f"{containers}.exists(c, has(c.resources) && ({_asks_gpu('c')}))"


JOB_RULE = (f"!({requests_gpu('object.spec.template.spec')}) || "
            f"(has(object.metadata.labels) && '{QUEUE_LABEL}' in object.metadata.labels && object.metadata.labels['{QUEUE_LABEL}'] != '')")
JOB_OWNED = ("(has(object.metadata.ownerReferences) && object.metadata.ownerReferences.exists(r, "
             "r.apiVersion == 'batch/v1' && r.kind == 'Job' && has(r.controller) && r.controller))")
POD_RULE = f"!({requests_gpu('object.spec')}) || {JOB_OWNED}"


def _field(obj: str, *path: str) -> str:
    """CEL: every step of ``obj.path`` is present (parenthesized, so ``!`` negates all of it)."""
    return "(" + " && ".join(f"has({obj}.{'.'.join(path[:i + 1])})" for i in range(len(path))) + ")"


def _elevated(c: str) -> str:
    adds = f"{c}.securityContext.capabilities.add"
    return (f"(({_field(c, 'securityContext', 'capabilities', 'add')} && {adds}.exists(x, !(x in {_literal(BASELINE_CAPABILITIES)}))) || "
            f"({_field(c, 'securityContext', 'seccompProfile')} && {c}.securityContext.seccompProfile.type == 'Unconfined'))")


def _is_rxdm(c: str, daemons: tuple[dict, ...] | None = None) -> str:
    """CEL: ``c`` is exactly one of upstream's RxDM daemons (all of them unless ``daemons`` narrows
    it): image, command, args and environment as vendored, no envFrom, no capability beyond upstream's."""
    from clusters.gpudirect_upstream import rxdm_sidecars

    options = []
    # Only as a native sidecar (an init container with restartPolicy Always, which the API server
    # allows on init containers alone) and asking no GPU: as a pod's sole regular container it is the
    # one an exec without a container name reaches (red team 22).
    placed = f"has({c}.restartPolicy) && {c}.restartPolicy == 'Always' && !(has({c}.resources) && ({_asks_gpu(c)}))"
    for daemon in rxdm_sidecars() if daemons is None else daemons:
        caps = (daemon.get("securityContext") or {}).get("capabilities", {}).get("add", [])
        options.append(
            f"({placed} && {c}.name == {_literal(daemon['name'])} && {c}.image == {_literal(daemon['image'])}"
            f" && has({c}.command) && {c}.command == {_literal(daemon.get('command', []))}"
            # No hook, probe or device of the tenant's: each would run or reach the tenant's choice as root
            # in the container that mounts /proc/sys (a postStart exec is a root shell there).
            f" && !has({c}.lifecycle) && !has({c}.livenessProbe) && !has({c}.readinessProbe) && !has({c}.startupProbe)"
            f" && !has({c}.volumeDevices)"
            f" && (has({c}.args) ? {c}.args : []) == {_literal(daemon.get('args', []))}"
            f" && (has({c}.env) ? {c}.env : []) == {_literal(daemon.get('env', []))} && !has({c}.envFrom)"
            f" && (!{_field(c, 'securityContext', 'capabilities', 'add')} || {c}.securityContext.capabilities.add.all(x, x in {_literal([*caps, *BASELINE_CAPABILITIES])})))")
    return "(" + " || ".join(options) + ")"


def _upstream_workload(c: str, containers: str) -> str:
    """CEL: ``c`` is the training container of a pod that runs a transport's exact RxDM daemon, and adds
    only the capabilities upstream's NCCL test gives that transport's workload container
    (clusters.gpudirect_upstream.workload_capabilities: IPC_LOCK for TCPX, nothing for TCPXO), still
    under a seccomp filter. False when no transport grants its workload anything."""
    from clusters.gpudirect_upstream import WORKLOAD_CONTAINER, daemon_of, workload_capabilities

    adds = f"{c}.securityContext.capabilities.add"
    options = [
        f"({c}.name == {_literal(WORKLOAD_CONTAINER)}"
        f" && (!{_field(c, 'securityContext', 'capabilities', 'add')} || {adds}.all(x, x in {_literal([*caps, *BASELINE_CAPABILITIES])}))"
        f" && !({_field(c, 'securityContext', 'seccompProfile')} && {c}.securityContext.seccompProfile.type == 'Unconfined')"
        f" && {containers}.exists(d, {_is_rxdm('d', (daemon,))}))"
        for transport, caps in sorted(workload_capabilities().items())
        if caps and (daemon := daemon_of(transport)) is not None
    ]
    return "(" + (" || ".join(options) or "false") + ")"


def _plain(c: str) -> str:
    """CEL: container ``c`` is not privileged and binds no host port."""
    return (f"!({_field(c, 'securityContext', 'privileged')} && {c}.securityContext.privileged)"
            f" && (!has({c}.ports) || {c}.ports.all(p, !has(p.hostPort) || p.hostPort == 0))")


# Pod Security Standards, baseline profile, as kubernetes/kubernetes implements it in
# staging/src/k8s.io/pod-security-admission/policy/ (each check_*.go file named below).
# check_seLinuxOptions.go: type only one of these (or unset); user and role unset.
BASELINE_SELINUX_TYPES = ("", "container_t", "container_init_t", "container_kvm_t", "container_engine_t")
# check_sysctls.go (sysctls_allowed_1_0; later releases allow a few more, this is the strictest set).
BASELINE_SYSCTLS = ("kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.tcp_syncookies",
                    "net.ipv4.ping_group_range", "net.ipv4.ip_unprivileged_port_start")
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
DEVICES_ANNOTATION = "devices.gke.io/container."


def _context_baseline(ctx: str, where: str) -> str:
    """CEL: the securityContext at ``where`` (a pod's or a container's) keeps SELinux, AppArmor and
    Windows HostProcess within baseline (check_seLinuxOptions.go, check_appArmorProfile.go,
    check_windowsHostProcess.go); the container-only fields are checked in ``_container_baseline``."""
    se = f"{where}.{ctx}.seLinuxOptions"
    return " && ".join(f"({part})" for part in [
        f"!({_field(where, ctx, 'seLinuxOptions')}) || ((!has({se}.type) || {se}.type in {_literal(BASELINE_SELINUX_TYPES)})"
        f" && (!has({se}.user) || {se}.user == '') && (!has({se}.role) || {se}.role == ''))",
        f"!({_field(where, ctx, 'appArmorProfile')}) || {where}.{ctx}.appArmorProfile.type in ['RuntimeDefault', 'Localhost']",
        f"!({_field(where, ctx, 'windowsOptions', 'hostProcess')} && {where}.{ctx}.windowsOptions.hostProcess)",
    ])


def _container_baseline(c: str) -> str:
    """CEL: a container within baseline apart from capabilities/seccomp (RxDM's exception):
    not privileged, no host port (check_privileged.go, check_hostPorts.go), ``procMount`` Default
    (check_procMount.go), and its security context as ``_context_baseline``."""
    return (f"{_plain(c)} && (!{_field(c, 'securityContext', 'procMount')} || {c}.securityContext.procMount == 'Default')"
            f" && (!has({c}.securityContext) || ({_context_baseline('securityContext', c)}))")


def _non_root(c: str, spec: str) -> str:
    """CEL: ``c`` runs as non-root and stays so: runAsNonRoot true and runAsUser not 0, the container's
    own value winning over the pod's, as the kubelet resolves them, and allowPrivilegeEscalation false."""
    own = lambda f: f"{_field(c, 'securityContext', f)}"  # noqa: E731
    pod = lambda f: f"{_field(spec, 'securityContext', f)}"  # noqa: E731
    # allowPrivilegeEscalation false (no_new_privs): otherwise a setuid-root binary in the tenant's own
    # image makes uid 0 again, beside the host's socket directory (red team 22; restricted profile's
    # check_allowPrivilegeEscalation.go asks the same).
    return (f"{own('allowPrivilegeEscalation')} && {c}.securityContext.allowPrivilegeEscalation == false"
            f" && ({own('runAsNonRoot')} ? {c}.securityContext.runAsNonRoot : ({pod('runAsNonRoot')} && {spec}.securityContext.runAsNonRoot))"
            f" && ({own('runAsUser')} ? {c}.securityContext.runAsUser != 0 : !({pod('runAsUser')} && {spec}.securityContext.runAsUser == 0))")


def _mounts(c: str, spec: str) -> str:
    """CEL: every hostPath volume ``c`` mounts is one upstream's NCCL tests mount, at upstream's
    mount path, for this kind of container (clusters.gpudirect_upstream): the exact RxDM daemon
    mounts only its own upstream pairs (``/sys``, ``/proc/sys`` among them) and nothing but them;
    any other container only the workload pairs (socket directory, driver/NCCL libraries, aperture
    devices), the library directories read-only."""
    from clusters.gpudirect_upstream import LIBRARY_DIRS, sidecar_host_mounts, workload_host_mounts

    volumes = f"(has({spec}.volumes) ? {spec}.volumes : [])"
    pair = "v.hostPath.path + ' -> ' + m.mountPath"
    sidecar = " || ".join(f"({c}.image == {_literal(image)} && {pair} in {_literal([f'{h} -> {m}' for h, m in pairs])})"
                          for image, pairs in sidecar_host_mounts().items())
    workload = _literal([f"{h} -> {m}" for h, m in workload_host_mounts()])
    library = " || ".join(f"v.hostPath.path == {_literal(d)} || v.hostPath.path.startsWith({_literal(d + '/')})" for d in LIBRARY_DIRS)
    return (f"!has({c}.volumeMounts) || {c}.volumeMounts.all(m, {_is_rxdm(c)}"
            f" ? (!has(m.subPath) && !has(m.subPathExpr) && {volumes}.exists(v, v.name == m.name && has(v.hostPath) && ({sidecar})))"
            f" : {volumes}.all(v, v.name != m.name || !has(v.hostPath) || ({pair} in {workload}"
            f" && (!({library}) || (has(m.readOnly) && m.readOnly)))))")


PRIVILEGE_CHECKS = (
    "host_namespaces", "pod_context", "host_path_volumes", "containers_baseline", "capabilities_only_rxdm", "non_root",
    "host_mounts", "ephemeral", "only_in_admitted_gpu_pods",
)


def privilege_rules() -> dict[str, str]:
    """One CEL expression per part of the box a tenant GPU pod stays in (each a validation with
    its own message): the whole baseline profile, plus non-root and the hostPath mount table.

    Built once per process and copied per call: they read only this module's constants and the
    vendored manifests, which ``clusters.gpudirect_upstream`` parses once (``_documents`` is cached)
    and hands out as copies; rebuilding them cost about 5 ms of every cluster's synthesis."""
    return dict(_privilege_rules())


@cache
def _privilege_rules() -> tuple[tuple[str, str], ...]:
    from clusters.gpudirect_upstream import device_annotations, host_paths

    spec = "object.spec"
    containers = f"({spec}.containers + (has({spec}.initContainers) ? {spec}.initContainers : []))"
    host_path = f"(has({spec}.volumes) && {spec}.volumes.exists(v, has(v.hostPath)))"
    annotations = "object.metadata.annotations"
    rules = {
        # check_hostNamespaces.go
        "host_namespaces": " && ".join(f"!(has({spec}.{flag}) && {spec}.{flag})" for flag in ("hostNetwork", "hostPID", "hostIPC")),
        # check_seccompProfile_baseline.go, check_sysctls.go, check_appArmorProfile.go (annotations), and the pod's context
        "pod_context": " && ".join(f"({part})" for part in [
            f"!({_field(spec, 'securityContext', 'seccompProfile')} && {spec}.securityContext.seccompProfile.type == 'Unconfined')",
            f"(!{_field(spec, 'securityContext', 'sysctls')} || {spec}.securityContext.sysctls.all(x, x.name in {_literal(BASELINE_SYSCTLS)}))",
            f"(!has({spec}.securityContext) || ({_context_baseline('securityContext', spec)}))",
            f"(!has({annotations}) || {annotations}.all(k, !k.startsWith({_literal(APPARMOR_ANNOTATION)})"
            f" || {annotations}[k] == 'runtime/default' || {annotations}[k].startsWith('localhost/')))",
            # GKE's NRI device injector adds the host devices this annotation lists: only upstream's
            # own annotation for its RxDM daemon, value for value (clusters/gpudirect_upstream).
            f"(!has({annotations}) || {annotations}.all(k, !k.startsWith({_literal(DEVICES_ANNOTATION)})"
            f" || (k + ' = ' + {annotations}[k]) in {_literal([f'{k} = {v}' for k, v in device_annotations().items()])}))",
        ]),
        # check_hostPathVolumes.go: baseline allows none; these are the NCCL tests' own.
        "host_path_volumes": f"!has({spec}.volumes) || {spec}.volumes.all(v, !has(v.hostPath) || v.hostPath.path in {_literal(host_paths())})",
        "containers_baseline": f"{containers}.all(c, {_container_baseline('c')})",
        # check_capabilities_baseline.go, check_seccompProfile_baseline.go: only the exact RxDM daemon exceeds
        # them, and the training container beside it by upstream's workload capabilities (IPC_LOCK on TCPX).
        "capabilities_only_rxdm": f"{containers}.all(c, !{_elevated('c')} || {_is_rxdm('c')} || {_upstream_workload('c', containers)})",
        "non_root": f"{containers}.all(c, {_is_rxdm('c')} || ({_non_root('c', spec)}))",
        "host_mounts": f"{containers}.all(c, {_mounts('c', spec)})",
        "ephemeral": (f"!has({spec}.ephemeralContainers) || {spec}.ephemeralContainers.all(c, {_container_baseline('c')} && !{_elevated('c')}"
                      f" && {_non_root('c', spec)} && (!has(c.volumeMounts) || c.volumeMounts.all(m, (has({spec}.volumes) ? {spec}.volumes : [])"
                      f".all(v, v.name != m.name || !has(v.hostPath)))))"),
        "only_in_admitted_gpu_pods": f"!({host_path} || {containers}.exists(c, {_elevated('c')})) || ({requests_gpu(spec)} && {JOB_OWNED})",
    }
    assert tuple(rules) == PRIVILEGE_CHECKS
    return tuple(rules.items())


PRIVILEGE_MESSAGES = {
    "host_namespaces": "tenant pods may not use the host's network, PID or IPC namespace",
    "pod_context": "the pod's securityContext/annotations leave the baseline Pod Security Standard (seccomp Unconfined, an unsafe sysctl,"
                   " SELinux type/user/role, AppArmor Unconfined or Windows HostProcess)",
    "host_path_volumes": "hostPath volumes are allowed only at the paths Google's GPUDirect NCCL tests mount",
    "containers_baseline": "a container leaves the baseline Pod Security Standard (privileged, a host port, procMount Unmasked,"
                           " SELinux type/user/role, AppArmor Unconfined or Windows HostProcess)",
    "capabilities_only_rxdm": "only Google's GPUDirect RxDM sidecar (its exact image, command, args and env) may add capabilities beyond"
                              " baseline or run without a seccomp filter; beside the TCPX sidecar the container 'train' may add IPC_LOCK",
    "non_root": "every container except Google's GPUDirect RxDM sidecar must run as non-root (runAsNonRoot: true, runAsUser not 0)"
                " with allowPrivilegeEscalation: false",
    "host_mounts": "a hostPath may be mounted only where upstream's NCCL tests mount it: /sys and /proc/sys only in the exact RxDM"
                   " sidecar; other containers only the socket directory, the aperture devices and the driver libraries, read-only",
    "ephemeral": "ephemeral (debug) containers stay within baseline, run as non-root and mount no hostPath",
    "only_in_admitted_gpu_pods": "hostPath volumes and the RxDM sidecar's privileges only in a GPU pod controlled by a Kueue-admitted Job",
}


def privilege_rule() -> str:
    """All of ``privilege_rules`` as one expression (what a pod must pass)."""
    return " && ".join(f"({rule})" for rule in privilege_rules().values())


def policy(name: str, group: str, resource: str | list[str], operations: list[str], rule: str | dict[str, str], message: str | dict[str, str]) -> dict:
    validations = ([{"expression": rule[k], "message": message[k]} for k in rule] if isinstance(rule, dict)
                   else [{"expression": rule, "message": message}])
    return {
        "apiVersion": API_VERSION, "kind": "ValidatingAdmissionPolicy", "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": [group], "apiVersions": ["v1"], "operations": operations,
                                                    "resources": [resource] if isinstance(resource, str) else resource}]},
            "validations": validations,
        },
    }


# The privilege policy replaces Pod Security's baseline only where the namespace enforces
# ``privileged`` (tenants that can run on a GPUDirect pool, k8s_tenancy.pod_security); every other
# tenant namespace keeps Pod Security Admission's own ``enforce: baseline``.
PRIVILEGED_NAMESPACES = {"key": "pod-security.kubernetes.io/enforce", "operator": "In", "values": ["privileged"]}


def binding(policy_name: str) -> dict:
    match = [{"key": TENANT_LABEL, "operator": "Exists"}] + ([PRIVILEGED_NAMESPACES] if policy_name in (PRIVILEGE_POLICY, EXEC_POLICY) else [])
    return {
        "apiVersion": API_VERSION, "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": policy_name},
        "spec": {"policyName": policy_name, "validationActions": ["Deny"],
                 "matchResources": {"namespaceSelector": {"matchExpressions": match}}},
    }


EXEC_POLICY = "gpufleet-no-shell-in-the-gpudirect-sidecar"


@cache
def exec_rule() -> str:
    """CEL on ``PodExecOptions``/``PodAttachOptions`` (CONNECT pods/exec, pods/attach): not into an
    RxDM daemon. ``edit`` grants exec; a shell in the container that runs as root with NET_ADMIN and
    mounts /proc/sys would undo the rest. Only a container that is exactly the daemon (its upstream
    name among the rest, ``_is_rxdm``) carries that name, so refusing the name is enough, provided the
    name is given: without one the API server picks the pod's only container, which these options do
    not show, so an exec must name its container (kubectl always sends ``-c`` or the default one)."""
    from clusters.gpudirect_upstream import rxdm_sidecars

    return (f"has(object.container) && object.container != ''"
            f" && !(object.container in {_literal(sorted(d['name'] for d in rxdm_sidecars()))})")


def policies() -> tuple[dict, ...]:
    job = policy(JOB_POLICY, "batch", "jobs", ["CREATE", "UPDATE"], JOB_RULE,
                 f"a Job that requests nvidia.com/gpu must set the label {QUEUE_LABEL} to one of the namespace's LocalQueues"
                 " (gpu-<pool>), so Kueue admits it within the tenant's quota on that pool")
    pod = policy(POD_POLICY, "", "pods", ["CREATE"], POD_RULE,
                 "GPU pods in tenant namespaces come only from Kueue-admitted Jobs; submit a batch/v1 Job with a queue-name label")
    privilege = policy(PRIVILEGE_POLICY, "", ["pods", "pods/ephemeralcontainers"], ["CREATE", "UPDATE"], privilege_rules(),
                       PRIVILEGE_MESSAGES)
    shell = policy(EXEC_POLICY, "", ["pods/exec", "pods/attach"], ["CONNECT"], exec_rule(),
                   "no exec or attach into Google's GPUDirect RxDM sidecar (it runs as root with the host's /proc/sys),"
                   " and name the container: exec into the training container instead (-c train)")
    return job, pod, privilege, shell


class TenantQueuePolicy(Construct):
    """The two policies and their bindings; a binding depends on its policy."""

    def __init__(self, scope: Construct, id_: str) -> None:
        super().__init__(scope, id_)
        manifest = kubernetes.manifest.Manifest
        self.policies = {}
        self.bindings = {}
        for p in policies():
            key = p["metadata"]["name"].removeprefix("gpufleet-").replace("-", "_")
            self.policies[key] = pin(manifest(self, f"policy_{key}", manifest=p), f"vap_{key}")
            self.bindings[key] = pin(manifest(self, f"binding_{key}", manifest=binding(p["metadata"]["name"]),
                                              depends_on=[self.policies[key]]), f"vap_binding_{key}")
