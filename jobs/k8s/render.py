"""FinetuneSpec -> Kubernetes manifests for a GKE cluster: what ``kubectl apply -f`` and dispatch create.

A run is a ``batch/v1`` Job in the tenant's namespace, created suspended with the
``kueue.x-k8s.io/queue-name`` label of the tenant's LocalQueue for the pool: Kueue admits it
against the tenant's per-pool quota and unsuspends it (all ranks or none). ``nodes > 1`` makes
it an Indexed Job (completions = parallelism = nodes) with a headless Service, so rank ``i``
is reachable as ``<run>-<i>.<run>`` and torchrun gets MASTER_ADDR / NODE_RANK / WORLD_SIZE.

No key is in any manifest. The pods read their AppRole role_id and their rank's *wrapped*
single-use secret_id from the Secret ``<run>-vault``, which only dispatch creates (see
``jobs.k8s.client.K8sClient.dispatch``); ``gpufleet-exec`` unwraps it at run time. Because the secret_id is
single-use, nothing may run a pod twice: ``backoffLimit: 0``, a pod failure policy that fails
the Job on any non-zero exit or disruption, and ``podReplacementPolicy: Failed``.

Field names are checked against Kubernetes' OpenAPI (``jobs/k8s/openapi``, via ``jobs.k8s.schemas``).
"""

from __future__ import annotations

import base64
import hashlib
import io
import re
from pathlib import Path
from typing import Any

from clusters.derive.pools import POOL_LABEL
from clusters.families import TOPOLOGY_LEVEL_NAMES
from jobs.durations import NS_PER_SECOND
from jobs.k8s.gpudirect import PodNetworking, pod_networking
from clusters.derive.checkpoints import ENV_CHECKPOINT_URI, checkpoint_uri, tenant_prefix
from jobs.spec import EXEC, EXPERIMENT_META, RUN_DEADLINE_META, TASK, FinetuneSpec
from vault_policies.layout import (ENV_ATTEMPT, ENV_KILL_GRACE_SECONDS, ENV_MAX_RUN_SECONDS, ENV_NO_VAULT, ENV_ROLE, ENV_ROLE_ID, ENV_RUN_DEADLINE_SECONDS, ENV_SECRETS,
                                   ENV_WRAPPED_SECRET_ID_FILE)

# kubernetes-sigs/kueue pkg/controller/constants/constants.go (v0.19.2): QueueLabel.
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# Kueue v0.19.2 apis/kueue/v1beta2/topology_types.go:28 and :39. Kueue's webhook refuses a pod
# template with more than one of them (pkg/controller/jobframework/tas_validation.go:50-58), so
# a run carries the required level when its job file names one and the preferred one otherwise.
REQUIRED_TOPOLOGY_ANNOTATION = "kueue.x-k8s.io/podset-required-topology"
PREFERRED_TOPOLOGY_ANNOTATION = "kueue.x-k8s.io/podset-preferred-topology"
DEFAULT_PREFERRED_LEVEL = "subblock"
# The GPU health pre-flight (jobs.schema.Preflight): a regular init container, so it runs after
# the native sidecars started and before the training container, on the GPUs the rank was given
# (kubelet hands an init container's devices on to the app containers). Its failure fails the Job
# through its own podFailurePolicy rule: the Job controller matches init containers' exit codes
# too (kubernetes pkg/controller/job/pod_failure_policy.go matchOnExitCodes, commit 2b02db1b) and
# writes "Container <name> for pod <ns>/<pod> failed with exit code N matching FailJob rule at
# index I", which jobs.k8s.status reads as an infrastructure failure.
PREFLIGHT_CONTAINER = "gpu-preflight"
# DWS (queued provisioning) pools: Kueue copies a Job's provreq.kueue.x-k8s.io/* annotations to
# its Workload (v0.19.2 pkg/controller/jobframework/utils.go:264) and from there into the
# ProvisioningRequest's parameters without the prefix (pkg/controller/admissionchecks/provisioning/
# provisioning.go:125-131; prefix: pkg/controller/constants/constants.go:56). GKE's parameter is
# maxRunDurationSeconds, as the toolkit's DWS sample sets it (cluster-toolkit
# examples/gke-dws-flex-start/sample-job.yaml, metadata.annotations): the nodes are provisioned
# for the run's max_run_hours, not GKE's 7-day default.
DWS_MAX_RUN_ANNOTATION = "provreq.kueue.x-k8s.io/maxRunDurationSeconds"
# Set by the Job controller on every pod of an Indexed Job (batch/v1 JobSpec.completionMode).
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
JOB_LABEL = "gpufleet.dev/job"
RUN_LABEL = "gpufleet.dev/run"
# The experiment a run belongs to (dispatch meta gpufleet_experiment), on the Job and its pods: the orphan
# scan (experiments.background.orphans) tells an attempt whose run id is not recorded yet from a stray.
EXPERIMENT_LABEL = "gpufleet.dev/experiment"
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")
DISPATCH_ANNOTATION = "gpufleet.dev/dispatch-id"
ROLE_ANNOTATION = "gpufleet.dev/vault-role"
GPU_RESOURCE = "nvidia.com/gpu"
# GoogleCloudPlatform/gcs-fuse-csi-driver v1.24.4: the webhook injects its sidecar into pods carrying
# this annotation set to "true" (pkg/webhook/mutatingwebhook.go:49 GcsFuseVolumeEnableAnnotation); the
# driver's name (pkg/csi_driver/gcs_fuse_driver.go:40 DefaultName); the inline volume's attributes
# (pkg/csi_driver/utils.go:81 bucketName, :55 mountOptions, split on ',' at :261).
GCSFUSE_ANNOTATION = "gke-gcsfuse/volumes"
GCSFUSE_DRIVER = "gcsfuse.csi.storage.gke.io"
CHECKPOINT_VOLUME = "checkpoints"
TAINT_EFFECTS = {"NO_SCHEDULE": "NoSchedule", "PREFER_NO_SCHEDULE": "PreferNoSchedule", "NO_EXECUTE": "NoExecute"}

# The Secret's mount; gpufleet-exec reads the rank's wrapping token from ENV_WRAPPED_SECRET_ID_FILE.
VAULT_DIR = "/var/run/gpufleet/vault"
ROLE_ID_KEY = "role-id"
SCRATCH_DIR = "/scratch"
RENDEZVOUS_PORT = 29500
META_ENV_PREFIX = "GPUFLEET_META_"
RUN_USER = 1000
# A finished Job (and, through owner references, its Secret and Service) stays a day for
# `gpufleet jobs status` and logs, then Kubernetes deletes it.
TTL_AFTER_FINISHED_SECONDS = 24 * 3600
# constructs_lib/k8s_priority_classes.py: priority >= this gets the class that may preempt.
HIGH_PRIORITY = 70
PRIORITY_CLASS_HIGH = "training-high"
PRIORITY_CLASS_LOW = "training-low"


def run_name(job: str, dispatch_id: str | None) -> str:
    """The Job's name: the job's own name for the rendered file, ``<job>-<10 hex>`` per dispatch.

    A hash of the dispatch id, so a retried dispatch with the same id names the same Job and
    the API server refuses the duplicate (409). At most 48 + 11 characters: an Indexed pod's
    hostname ``<run>-<index>`` stays within a 63-character DNS label.
    """
    if dispatch_id is None:
        return job
    return f"{job}-{hashlib.sha256(dispatch_id.encode()).hexdigest()[:10]}"


# `run_name`'s per-dispatch form, optionally after ``<namespace>/`` (what dispatch prints).
_RUN_ID = re.compile(r"^(?:(?P<namespace>[a-z0-9][a-z0-9-]*)/)?(?P<run>(?P<job>[a-z][a-z0-9-]*)-[0-9a-f]{10})$")


def parse_run_id(run_id: str) -> tuple[str | None, str, str] | None:
    """(namespace or None, run, job) of a ``[<namespace>/]<job>-<10 hex>`` id, or None when
    ``run_id`` is not in ``run_name``'s per-dispatch form."""
    match = _RUN_ID.match(run_id)
    if match is None:
        return None
    return match["namespace"], match["run"], match["job"]


def vault_secret_name(run: str) -> str:
    return f"{run}-vault"


def wrapped_key(rank: int) -> str:
    return f"wrapped-secret-id-{rank}"


def owner_reference(job: dict[str, Any]) -> dict[str, Any]:
    """The created Job as owner of what a run adds beside it (its Secret, its Service), so they are
    deleted with it; needs the uid the API server gave the Job."""
    return {"apiVersion": "batch/v1", "kind": "Job", "name": job["metadata"]["name"], "uid": job["metadata"]["uid"], "blockOwnerDeletion": False}


def vault_secret(spec: FinetuneSpec, job: dict[str, Any], role_id: str, tokens: list[str]) -> dict[str, Any]:
    """The only object that carries key material: the role_id and one single-use wrapping token
    per rank. Immutable, owned by the Job (deleted with it), never written to disk by gpufleet."""
    if len(tokens) != spec.nodes:
        raise ValueError(f"{len(tokens)} wrapping tokens for {spec.nodes} ranks")
    encode = lambda text: base64.b64encode(text.encode()).decode()  # noqa: E731
    run = job["metadata"]["name"]
    data = {ROLE_ID_KEY: encode(role_id), **{wrapped_key(rank): encode(token) for rank, token in enumerate(tokens)}}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "immutable": True,
        "metadata": {"name": vault_secret_name(run), "namespace": spec.namespace, "labels": {JOB_LABEL: spec.name, RUN_LABEL: run},
                     "ownerReferences": [owner_reference(job)]},
        "data": data,
    }


def priority_class(priority: int) -> str:
    return PRIORITY_CLASS_HIGH if priority >= HIGH_PRIORITY else PRIORITY_CLASS_LOW


def run_seconds(spec: FinetuneSpec, meta: dict[str, str]) -> int:
    """The run's limit: the job's max_run_hours, or less when the dispatch meta carries what is left of
    the experiment's deadline (jobs.spec.RUN_DEADLINE_META, set by the control plane at dispatch)."""
    limit = spec.max_run_ns // NS_PER_SECOND
    raw = meta.get(RUN_DEADLINE_META)
    if raw is None:
        return limit
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"dispatch meta {RUN_DEADLINE_META}={raw!r} is not a whole number of seconds >= 1")
    return min(limit, int(raw))


def _env(spec: FinetuneSpec, run: str, meta: dict[str, str], attempt: int) -> list[dict[str, Any]]:
    """Ordered: Kubernetes expands ``$(NODE_RANK)`` only from variables defined before it."""
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in spec.env]
    if spec.nodes > 1:
        index = {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']"}}
        env += [
            {"name": "NODE_RANK", "valueFrom": index},
            {"name": "NNODES", "value": str(spec.nodes)},
            {"name": "NPROC_PER_NODE", "value": str(spec.gpu.count)},
            {"name": "WORLD_SIZE", "value": str(spec.nodes * spec.gpu.count)},
            {"name": "MASTER_ADDR", "value": f"{run}-0.{run}.{spec.namespace}.svc"},
            {"name": "MASTER_PORT", "value": str(RENDEZVOUS_PORT)},
        ]
        wrapped_file = f"{VAULT_DIR}/{wrapped_key(0).removesuffix('0')}$(NODE_RANK)"
    else:
        wrapped_file = f"{VAULT_DIR}/{wrapped_key(0)}"
    if spec.vault_role is None:  # a job without secrets: no role, no run Secret, no Vault variables
        env += [{"name": ENV_NO_VAULT, "value": "1"}]
    else:
        env += [
            {"name": "VAULT_ADDR", "value": spec.vault_addr},
            {"name": ENV_ROLE, "value": spec.vault_role},
            {"name": ENV_ROLE_ID, "valueFrom": {"secretKeyRef": {"name": vault_secret_name(run), "key": ROLE_ID_KEY}}},
            {"name": ENV_WRAPPED_SECRET_ID_FILE, "value": wrapped_file},
            {"name": ENV_SECRETS, "value": spec.secrets_env},
        ]
    env += [
        {"name": ENV_MAX_RUN_SECONDS, "value": str(spec.max_run_ns // NS_PER_SECOND)},
        # The container's own bound too (gpufleet-exec takes the smaller), as on Nomad and locally.
        *([{"name": ENV_RUN_DEADLINE_SECONDS, "value": str(run_seconds(spec, meta))}] if RUN_DEADLINE_META in meta else []),
        {"name": ENV_KILL_GRACE_SECONDS, "value": str(_grace_seconds(spec))},
        {"name": "TMPDIR", "value": "/tmp"},
        {"name": "GPUFLEET_SCRATCH", "value": SCRATCH_DIR},
        {"name": ENV_ATTEMPT, "value": str(attempt)},
    ]
    if spec.checkpoint_bucket is not None:
        env.append({"name": ENV_CHECKPOINT_URI, "value": checkpoint_uri(spec.checkpoint_bucket, spec.tenant.name, checkpoint_run(run, meta))})
    env += [{"name": f"{META_ENV_PREFIX}{key}", "value": value} for key, value in sorted(meta.items())
            if key not in (EXPERIMENT_META, RUN_DEADLINE_META)]
    return env


def checkpoint_run(run: str, meta: dict[str, str]) -> str:
    """The directory name of a run's checkpoints: its experiment (dispatch meta ``gpufleet_experiment``,
    the same for every attempt), else the run's own name (a rendered file applied by hand)."""
    return meta.get(EXPERIMENT_META) or run


def checkpoint_volume(spec: FinetuneSpec, run: str, meta: dict[str, str]) -> dict[str, Any]:
    """The run's checkpoint directory as a GCS FUSE CSI inline volume: only ``<tenant>/<experiment>`` of
    the bucket (``only-dir``), with directories written by other clients visible (``implicit-dirs``).
    The driver sets ``gid`` to the pod's fsGroup and file/dir modes 664/775 (pkg/csi_driver/utils.go:373-377),
    so the run's uid 1000 (group 1000) can write. The sidecar authenticates as the pod's KSA: the same
    identity the bucket's IAM grants the tenant's prefix to."""
    assert spec.checkpoint_bucket is not None
    directory = f"{tenant_prefix(spec.tenant.name)}{checkpoint_run(run, meta)}"
    return {"name": CHECKPOINT_VOLUME, "csi": {"driver": GCSFUSE_DRIVER, "volumeAttributes": {
        "bucketName": spec.checkpoint_bucket, "mountOptions": f"implicit-dirs,only-dir={directory}"}}}


def _grace_seconds(spec: FinetuneSpec) -> int:
    return max(1, spec.kill_timeout_ns // NS_PER_SECOND)


def _container(spec: FinetuneSpec, run: str, meta: dict[str, str], attempt: int) -> dict[str, Any]:
    gpus = str(spec.gpu.count)
    memory, disk = f"{spec.memory_mb}Mi", f"{spec.disk_mb}Mi"
    return {
        "name": TASK,
        "image": spec.image,
        "imagePullPolicy": "IfNotPresent",
        "command": [EXEC, "--", spec.command],
        "args": list(spec.args),
        "env": _env(spec, run, meta, attempt),
        # No CPU limit (throttling slows data loading); memory and disk limits equal the
        # requests so a run cannot take what the scheduler gave another pod.
        "resources": {
            "requests": {"cpu": f"{spec.cpu_millicores}m", "memory": memory, "ephemeral-storage": disk, GPU_RESOURCE: gpus},
            "limits": {"memory": memory, "ephemeral-storage": disk, GPU_RESOURCE: gpus},
        },
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [
            *([{"name": "vault", "mountPath": VAULT_DIR, "readOnly": True}] if spec.vault_role else []),
            {"name": "scratch", "mountPath": SCRATCH_DIR},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "dshm", "mountPath": "/dev/shm"},
        ],
        **({"ports": [{"name": "rendezvous", "containerPort": RENDEZVOUS_PORT, "protocol": "TCP"}]} if spec.nodes > 1 else {}),
    }


# GKE's NVIDIA device plugin mounts the host's driver libraries here in every container that requests
# nvidia.com/gpu; DCGM loads libnvidia-ml from it (the toolkit's GKE NCCL examples set the same LD_LIBRARY_PATH).
GKE_DRIVER_LIB_DIR = "/usr/local/nvidia/lib64"
# nv-hostengine's pid file and log: its defaults (/var/run, /var/log) are not writable by the run user.
HOSTENGINE_PID = "/tmp/nv-hostengine.pid"
HOSTENGINE_LOG = "/tmp/nv-hostengine.log"


def preflight_command(level: int) -> list[str]:
    """Start a DCGM host engine, run ``dcgmi diag -r <level>`` against it, stop it, exit with the diag's code.

    dcgmi is only a client of ``nv-hostengine`` (NVIDIA DCGM reference, dcgmi: "sends management and
    monitoring requests to an NVIDIA DCGM host engine"); a pod has none, so the pre-flight starts its own
    exactly as cluster-toolkit v1.95.0 does in community/modules/scheduler/schedmd-slurm-gcp-v6-controller/
    modules/slurm_files/scripts/tools/gpu-test (:39-40 require ``nv-hostengine``; :80-83 start it and wait a
    second; :88 ``dcgmi diag -r 1``; :94-95 ``nv-hostengine -t``). The engine daemonizes (no ``-n``: in the foreground
    it would never return) with its pid file under /tmp, and is stopped even when the diag fails; an
    engine that does not start fails the check with its own exit code.
    """
    engine = f"nv-hostengine --pid {HOSTENGINE_PID} --log-filename {HOSTENGINE_LOG}"
    return ["sh", "-c", f"{engine} && sleep 1 && dcgmi diag -r {int(level)}; rc=$?; nv-hostengine --term --pid {HOSTENGINE_PID}; exit $rc"]


def preflight_container(spec: FinetuneSpec) -> dict[str, Any] | None:
    """The DCGM diagnostic on the rank's GPUs, as the training user with no privileges.

    Not root: NVIDIA's nv-hostengine reference says the binary "can run without root privileges" and only
    "configuration management and portions of diagnostics can require root" (docs.nvidia.com/datacenter/dcgm/
    latest/reference/command-line-reference/nv-hostengine.html, DESCRIPTION); the toolkit's gpu-test runs
    as root only because it is a Slurm prolog, not because diag asks for it. A root init container would
    widen every tenant's admission box for one check, so a root-only part of the diag is skipped instead
    (docs/large-runs.md says so).
    """
    if spec.preflight is None or spec.nodes < 2:
        return None
    image, level = spec.preflight
    gpus = str(spec.gpu.count)
    return {
        "name": PREFLIGHT_CONTAINER,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": preflight_command(level),
        "env": [{"name": "LD_LIBRARY_PATH", "value": GKE_DRIVER_LIB_DIR}],
        "resources": {"requests": {"cpu": "1", "memory": "2Gi", GPU_RESOURCE: gpus}, "limits": {"memory": "2Gi", GPU_RESOURCE: gpus}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }


def networking(spec: FinetuneSpec) -> PodNetworking | None:
    """GPUDirect wiring for a multi-node run on a GPUDirect pool (jobs.k8s.gpudirect); a single node needs no extra NIC."""
    if spec.gke is None or spec.nodes < 2 or not spec.gke.networks:
        return None
    return pod_networking(spec.pool.gpudirect, spec.gke.networks)


def _pod_spec(spec: FinetuneSpec, run: str, meta: dict[str, str], attempt: int) -> dict[str, Any]:
    assert spec.gke is not None
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "serviceAccountName": spec.gke.service_account,
        "automountServiceAccountToken": False,
        "priorityClassName": priority_class(spec.priority),
        "terminationGracePeriodSeconds": _grace_seconds(spec),
        "nodeSelector": {POOL_LABEL: spec.pool.name},
        "tolerations": [{"key": t.key, "operator": "Equal", "value": t.value, "effect": TAINT_EFFECTS[t.effect]} for t in spec.pool.taints],
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_USER,
            "runAsGroup": RUN_USER,
            "fsGroup": RUN_USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [_container(spec, run, meta, attempt)],
        # emptyDir lives on the node's ephemeral storage: the local SSDs on pools that have
        # them (GKE ephemeral-storage-local-ssd), else the boot disk; the container's
        # ephemeral-storage limit caps both. /dev/shm in memory for data-loader workers.
        "volumes": [
            *([{"name": "vault", "secret": {"secretName": vault_secret_name(run), "defaultMode": 0o440, "optional": False}}]
              if spec.vault_role else []),
            {"name": "scratch", "emptyDir": {}},
            {"name": "tmp", "emptyDir": {}},
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{max(64, spec.memory_mb // 4)}Mi"}},
        ],
    }
    if spec.nodes > 1:
        pod["subdomain"] = run
    wiring = networking(spec)
    if wiring is not None:
        container = pod["containers"][0]
        container["env"] += wiring.env
        container["volumeMounts"] += wiring.mounts
        if wiring.capabilities:
            container["securityContext"]["capabilities"]["add"] = list(wiring.capabilities)
        pod["volumes"] += wiring.volumes
        if wiring.sidecars:
            pod["initContainers"] = wiring.sidecars
    if (check := preflight_container(spec)) is not None:
        pod["initContainers"] = [*pod.get("initContainers", []), check]
    if spec.checkpoint_mount is not None and spec.checkpoint_bucket is not None:
        pod["containers"][0]["volumeMounts"].append({"name": CHECKPOINT_VOLUME, "mountPath": spec.checkpoint_mount})
        pod["volumes"].append(checkpoint_volume(spec, run, meta))
    return pod


def topology_annotations(spec: FinetuneSpec) -> dict[str, str]:
    """Where Kueue places the ranks of a multi-node run on a topology-aware pool: all in one domain of
    the job's required level, or preferably in one sub-block (Kueue climbs to the block and then
    spreads when no sub-block has room: topology_types.go:31-38). Nothing for single-node runs or
    pools without the topology labels (their flavor names no Topology; Kueue would reject it)."""
    if spec.nodes < 2 or not spec.pool.topology_aware:
        return {}
    if spec.topology is not None:
        return {REQUIRED_TOPOLOGY_ANNOTATION: TOPOLOGY_LEVEL_NAMES[spec.topology]}
    return {PREFERRED_TOPOLOGY_ANNOTATION: TOPOLOGY_LEVEL_NAMES[DEFAULT_PREFERRED_LEVEL]}


def _template_annotations(spec: FinetuneSpec) -> dict[str, str]:
    wiring = networking(spec)
    mount = {GCSFUSE_ANNOTATION: "true"} if spec.checkpoint_mount is not None and spec.checkpoint_bucket is not None else {}
    return {**(wiring.annotations if wiring else {}), **topology_annotations(spec), **mount}


def _labels(spec: FinetuneSpec, run: str) -> dict[str, str]:
    return {JOB_LABEL: spec.name, RUN_LABEL: run}


def _experiment_label(meta: dict[str, str]) -> dict[str, str]:
    experiment = meta.get(EXPERIMENT_META)
    return {EXPERIMENT_LABEL: experiment} if experiment and _LABEL_VALUE.match(experiment) else {}


def job_manifest(spec: FinetuneSpec, *, dispatch_id: str | None = None, meta: dict[str, str] | None = None, attempt: int = 1) -> dict[str, Any]:
    """The suspended, Kueue-labelled Job; a pure function of the spec, dispatch id, meta and attempt
    (GPUFLEET_ATTEMPT: each attempt of an experiment is its own Job, named from its own dispatch id)."""
    if spec.gke is None:
        raise ValueError(f"job {spec.name} targets a Nomad cluster; render it with jobs.nomad.render")
    run = run_name(spec.name, dispatch_id)
    annotations = {ROLE_ANNOTATION: spec.vault_role} if spec.vault_role else {}
    if dispatch_id is not None:
        annotations[DISPATCH_ANNOTATION] = dispatch_id
    if spec.pool.queued_provisioning:
        annotations[DWS_MAX_RUN_ANNOTATION] = str(run_seconds(spec, meta or {}))
    indexed = spec.nodes > 1
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": run,
            "namespace": spec.namespace,
            "labels": {**_labels(spec, run), **_experiment_label(meta or {}), QUEUE_LABEL: spec.gke.local_queue, "gpufleet.dev/cluster": spec.cluster},
            "annotations": annotations,
        },
        "spec": {
            "suspend": True,
            "completionMode": "Indexed" if indexed else "NonIndexed",
            "completions": spec.nodes,
            "parallelism": spec.nodes,
            "backoffLimit": 0,
            "podReplacementPolicy": "Failed",
            # The disruption rule first: the Job controller takes the first matching rule (kubernetes
            # pkg/controller/job/pod_failure_policy.go matchPodFailurePolicy), and a preempted or evicted
            # pod's container also exits non-zero on its SIGTERM; in the other order the fleet's eviction
            # would read as the command's own exit and never be retried (jobs.failures).
            "podFailurePolicy": {"rules": [
                {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                {"action": "FailJob", "onExitCodes": {"containerName": TASK, "operator": "NotIn", "values": [0]}},
                *([{"action": "FailJob", "onExitCodes": {"containerName": PREFLIGHT_CONTAINER, "operator": "NotIn", "values": [0]}}]
                  if preflight_container(spec) else []),
            ]},
            # The Job controller fails the Job (reason DeadlineExceeded) this long after status.startTime, which it
            # sets when Kueue unsuspends the Job and resets on each suspend (KEP-2232 Suspend Job): queueing does not count. The Job is
            # per dispatch, so this is the experiment's remaining deadline when the control plane dispatched it.
            "activeDeadlineSeconds": run_seconds(spec, meta or {}),
            "ttlSecondsAfterFinished": TTL_AFTER_FINISHED_SECONDS,
            "template": {
                "metadata": {"labels": {**_labels(spec, run), **_experiment_label(meta or {})}, **({"annotations": a} if (a := _template_annotations(spec)) else {})},
                "spec": _pod_spec(spec, run, meta or {}, attempt),
            },
        },
    }


def rendezvous_service(spec: FinetuneSpec, *, dispatch_id: str | None = None) -> dict[str, Any]:
    """Headless Service giving each rank the DNS name ``<run>-<index>.<run>`` before it is ready."""
    run = run_name(spec.name, dispatch_id)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": run, "namespace": spec.namespace, "labels": _labels(spec, run)},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {RUN_LABEL: run},
            "ports": [{"name": "rendezvous", "port": RENDEZVOUS_PORT, "targetPort": RENDEZVOUS_PORT, "protocol": "TCP"}],
        },
    }


def manifests(spec: FinetuneSpec, *, dispatch_id: str | None = None, meta: dict[str, str] | None = None, attempt: int = 1) -> list[dict[str, Any]]:
    """Service first (so rank DNS exists when pods start), then the Job."""
    out = [rendezvous_service(spec, dispatch_id=dispatch_id)] if spec.nodes > 1 else []
    return out + [job_manifest(spec, dispatch_id=dispatch_id, meta=meta, attempt=attempt)]


def _sorted(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _sorted(node[k]) for k in sorted(node)}
    if isinstance(node, list):
        return [_sorted(item) for item in node]
    return node


def to_yaml(docs: list[dict[str, Any]]) -> str:
    """Byte-stable multi-document YAML (sorted keys), as ``kubectl apply -f`` reads it."""
    from ruamel.yaml import YAML

    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = False
    yaml.explicit_start = True
    yaml.width = 4096
    buffer = io.StringIO()
    yaml.dump_all([_sorted(doc) for doc in docs], buffer)
    return buffer.getvalue()


def write_manifests(spec: FinetuneSpec, out_dir: Path | None = None) -> Path:
    """Validate against the vendored schemas, then write ``<out_dir>/<job>.yaml`` atomically
    (default: the repository's ``jobs/out``; only into a directory gpufleet made, as write_job)."""
    from clusters import repo
    from clusters import outputs
    from jobs.k8s.schemas import require_valid

    docs = manifests(spec)
    require_valid(docs)
    header = (f"# gpufleet: rendered from jobs/{spec.source.name}; the pods wait for the Secret {vault_secret_name(spec.name)}\n"
              f"# (role id + wrapped secret_id) that only `gpufleet jobs dispatch` creates. Nothing secret is in this file.\n"
              if spec.vault_role else
              f"# gpufleet: rendered from jobs/{spec.source.name}; a job without secrets: no Vault role, no wrapped secret_id.\n")
    directory = outputs.ensure_dir(out_dir or repo.jobs_out_dir(), option="--out-dir")
    return outputs.write_file(directory / f"{spec.name}.yaml", header + to_yaml(docs), option="--out-dir")
