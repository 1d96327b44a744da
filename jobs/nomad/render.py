"""FinetuneSpec -> Nomad API job JSON (``{"Job": {...}}``), as ``POST /v1/jobs`` and
``nomad job run -json`` take it.

The job is a parameterized batch job: registering it runs nothing; each dispatch creates a
child job with its own meta (dataset, run id, the role_id and the *wrapped* secret_id).
No key is in the JSON: the task command is wrapped in ``gpufleet-exec``, which unwraps the
secret_id at run time, logs in with AppRole and exports only the keys in GPUFLEET_SECRETS.
Durations are integer nanoseconds, as Nomad's API wants them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from clusters.families import LOCAL_SSD_MOUNT, LOCAL_SSD_VOLUME
from jobs.durations import NS_PER_SECOND
from clusters.derive.checkpoints import ENV_CHECKPOINT_URI, checkpoint_uri
from jobs.spec import EXPERIMENT_META, RUN_DEADLINE_META, TASK, FinetuneSpec, exec_argv
from vault_policies.layout import (
    ENV_ATTEMPT,
    ENV_KILL_GRACE_SECONDS,
    ENV_MAX_RUN_SECONDS,
    ENV_NO_VAULT,
    ENV_ROLE,
    ENV_ROLE_ID,
    ENV_RUN_DEADLINE_SECONDS,
    ENV_SECRETS,
    ENV_WRAPPED_SECRET_ID,
    META_ATTEMPT,
    META_ROLE_ID,
    META_WRAPPED_SECRET_ID,
)

# Dispatch meta the platform fills in; declared as required so a dispatch without them is refused by Nomad.
PLATFORM_META = (META_ATTEMPT, META_ROLE_ID, META_WRAPPED_SECRET_ID, EXPERIMENT_META)
# What every run gets, with or without secrets: its attempt and its experiment (the checkpoint prefix).
RUN_META = (META_ATTEMPT, EXPERIMENT_META)
# Optional platform meta: the control plane always passes the experiment's remaining deadline, an operator's
# dispatch (gpufleet jobs dispatch, nomad job dispatch) has none and gets the job's max_run_hours alone.
# Nomad refuses a dispatch with a key the parent declares neither required nor optional
# (nomad/job_endpoint.go validateDispatchRequest :2175-2194 at v1.10.5), so it must be declared here.
PLATFORM_META_OPTIONAL = (RUN_DEADLINE_META,)
# Static job meta: which role the dispatcher must mint for (a name, not a credential).
JOB_META_ROLE = "gpufleet_vault_role"
GPU_DEVICE = "nvidia/gpu"


def _constraint(ltarget: str, operand: str, rtarget: str) -> dict[str, str]:
    return {"LTarget": ltarget, "Operand": operand, "RTarget": rtarget}


def mib(gib: int) -> str:
    """A memory bound in the unit the NVIDIA device plugin reports (``device.attr.memory`` is NVML
    MiB, nomad-device-nvidia fingerprint.go), so the comparison is the one the checks made."""
    return f"{gib * 1024} MiB"


def _device(spec: FinetuneSpec) -> dict[str, Any]:
    """The GPU request: always the pool's model as NVML names it (so a device of another model on
    a mislabelled node never matches), then the job's own memory and model bounds."""
    gpu = spec.gpu
    constraints = [_constraint("${device.model}", "regexp", spec.pool.nvml.model_pattern)]
    if gpu.min_memory_gib is not None:
        constraints.append(_constraint("${device.attr.memory}", ">=", mib(gpu.min_memory_gib)))
    if gpu.model is not None:
        constraints.append(_constraint("${device.model}", "regexp", gpu.model))
    affinities = []
    if gpu.prefer_memory_gib is not None:
        affinities.append({**_constraint("${device.attr.memory}", ">=", mib(gpu.prefer_memory_gib)), "Weight": 50})
    device: dict[str, Any] = {"Name": GPU_DEVICE, "Count": gpu.count, "Constraints": constraints}
    if affinities:
        device["Affinities"] = affinities
    return device


def task_env(spec: FinetuneSpec) -> dict[str, str]:
    """The task's environment: user env, Vault address, the dispatch meta interpolated in, and
    the run limits gpufleet-exec enforces (the fleet's Nomad 1.10 has no MaxRunDuration): the job's
    max_run_hours, static, and the experiment's remaining deadline from the dispatch meta; exec takes
    the smaller, and the job's alone when the dispatch carried none (Nomad then leaves the
    ``${NOMAD_META_...}`` text as written, which exec reads as none)."""
    limits = {
        ENV_ATTEMPT: f"${{NOMAD_META_{META_ATTEMPT}}}",
        ENV_MAX_RUN_SECONDS: str(spec.max_run_ns // NS_PER_SECOND),
        ENV_RUN_DEADLINE_SECONDS: f"${{NOMAD_META_{RUN_DEADLINE_META}}}",
        ENV_KILL_GRACE_SECONDS: str(max(1, spec.kill_timeout_ns // NS_PER_SECOND)),
    }
    if spec.vault_role is None:  # a job without secrets: no Vault variables at all
        return {**dict(spec.env), ENV_NO_VAULT: "1", **limits}
    return {
        **dict(spec.env),
        "VAULT_ADDR": spec.vault_addr,
        ENV_ROLE: spec.vault_role,
        ENV_ROLE_ID: f"${{NOMAD_META_{META_ROLE_ID}}}",
        ENV_WRAPPED_SECRET_ID: f"${{NOMAD_META_{META_WRAPPED_SECRET_ID}}}",
        ENV_SECRETS: spec.secrets_env,
        **limits,
    }


def checkpoint_env(spec: FinetuneSpec) -> dict[str, str]:
    """``GPUFLEET_CHECKPOINT_URI``: the run's directory in the cluster's checkpoint bucket, named by the
    experiment (dispatch meta ``gpufleet_experiment``, interpolated by Nomad at run time), so every
    attempt of one experiment resumes from the same place. A task reads and writes it with a Cloud
    Storage client as the client VM's service account (clusters.derive.checkpoints)."""
    if spec.checkpoint_bucket is None:
        return {}
    return {ENV_CHECKPOINT_URI: checkpoint_uri(spec.checkpoint_bucket, spec.tenant.name, f"${{NOMAD_META_{EXPERIMENT_META}}}")}


def _task(spec: FinetuneSpec) -> dict[str, Any]:
    argv = exec_argv(spec)
    return {
        "Name": TASK,
        "Driver": "docker",
        "Config": {"image": spec.image, "command": argv[0], "args": argv[1:]},
        "Env": {**task_env(spec), **checkpoint_env(spec)},
        "Resources": {"CPU": spec.cpu_mhz, "MemoryMB": spec.memory_mb, "Devices": [_device(spec)]},
        "KillTimeout": spec.kill_timeout_ns,
        "KillSignal": "SIGTERM",
        **({"VolumeMounts": [{"Volume": LOCAL_SSD_VOLUME, "Destination": LOCAL_SSD_MOUNT, "ReadOnly": False}]}
           if spec.pool.local_ssd_count else {}),
    }


def _group(spec: FinetuneSpec) -> dict[str, Any]:
    restart, reschedule = spec.restart, spec.reschedule
    return {
        "Name": spec.task_group,
        "Count": 1,
        "Constraints": [_constraint("${node.class}", "=", spec.pool.name)],
        "RestartPolicy": {"Attempts": restart.attempts, "Delay": restart.delay, "Interval": restart.interval, "Mode": restart.mode.value},
        "ReschedulePolicy": {
            "Attempts": reschedule.attempts,
            "Interval": reschedule.interval,
            "Delay": reschedule.delay,
            "DelayFunction": reschedule.delay_function.value,
            "MaxDelay": reschedule.max_delay,
            "Unlimited": reschedule.unlimited,
        },
        "EphemeralDisk": {"SizeMB": spec.disk_mb, "Sticky": False, "Migrate": False},
        # Pools with local SSD (A3/A4): the client's host volume, read-write, mounted by the task
        # (api/tasks.go VolumeRequest :453-464, VolumeMount :474-480 at v1.10.5); registering it needs the
        # dispatcher's host_volume write grant (nomad/job_endpoint.go:163-176).
        **({"Volumes": {LOCAL_SSD_VOLUME: {"Name": LOCAL_SSD_VOLUME, "Type": "host", "Source": LOCAL_SSD_VOLUME, "ReadOnly": False}}}
           if spec.pool.local_ssd_count else {}),
        # No MaxRunDuration: api.TaskGroup has it only from Nomad 2.0.3 and the fleet runs 1.10,
        # which drops it; gpufleet-exec enforces max_run_hours (GPUFLEET_MAX_RUN_SECONDS) and the experiment's
        # remaining deadline (GPUFLEET_RUN_DEADLINE_SECONDS), whichever is smaller.
        "Tasks": [_task(spec)],
    }


def render(spec: FinetuneSpec) -> dict[str, Any]:
    """The parameterized batch job; a pure function of the spec."""
    return {
        "Job": {
            "ID": spec.name,
            "Name": spec.name,
            "Type": "batch",
            "Namespace": spec.namespace,
            "Region": spec.region,
            "Datacenters": [spec.datacenter],
            "NodePool": spec.pool.name,
            "Priority": spec.priority,
            "Meta": {**({JOB_META_ROLE: spec.vault_role} if spec.vault_role else {}),
                     "gpufleet_cluster": spec.cluster, "gpufleet_gpu_pool": spec.pool.name},
            "ParameterizedJob": {
                "Payload": "forbidden",
                # Every run names its experiment (its checkpoint prefix); only a job with secrets takes the Vault keys.
                "MetaRequired": sorted({*spec.meta_required, *(PLATFORM_META if spec.vault_role else RUN_META)}),
                "MetaOptional": [*spec.meta_optional, *PLATFORM_META_OPTIONAL],
            },
            "TaskGroups": [_group(spec)],
        }
    }


def placement_probe(job: dict[str, Any]) -> dict[str, Any]:
    """The job as one dispatched instance would be placed: a plan of the parameterized parent
    places nothing (it is a template), so the plan checks the same job without
    ParameterizedJob to learn whether a GPU client can take it."""
    inner = {k: v for k, v in job["Job"].items() if k != "ParameterizedJob"}
    return {"Job": inner}


def to_json(job: dict[str, Any]) -> str:
    """Byte-stable text: sorted keys, fixed indentation, trailing newline."""
    return json.dumps(job, indent=2, sort_keys=True) + "\n"


def write_job(spec: FinetuneSpec, out_dir: Path | None = None) -> Path:
    """Write ``<out_dir>/<job>.json`` atomically (default: the repository's ``jobs/out``).

    The directory must be one gpufleet made (or new, or empty): ``clusters.outputs`` refuses
    ``--out-dir jobs`` or a directory of someone else's files.
    """
    from clusters import repo
    from clusters import outputs

    directory = outputs.ensure_dir(out_dir or repo.jobs_out_dir(), option="--out-dir")
    return outputs.write_file(directory / f"{spec.name}.json", to_json(render(spec)), option="--out-dir")
