"""The derived, frozen form of a checked job file: everything rendering and dispatch need.

Derivation (namespace from tenant, region/datacenter/Vault address from the cluster, the
pool's GPU facts) happens once here, so the renderer is a pure function of the spec.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from clusters.derive.checkpoints import bucket_name
from clusters.derive.gpudirect import derive_gpudirect
from clusters.derive.nomad import nomad_task_group_name
from clusters.derive.pools import GpuPoolSpec, derive_gpu_pools, kueue_local_queue_name
from clusters.derive.tenants import WORKLOAD_KSA, TenantSpec, derive_tenants
from clusters.schema import ClusterConfig, SchedulerKind
from jobs.durations import NS_PER_SECOND
from jobs.schema import JobFile, Reschedule, Restart, Retries

TASK = "train"
# Every task command runs behind this wrapper on both schedulers (and run-local), so keys arrive
# only at run time: it unwraps the secret_id, logs in with AppRole and exports GPUFLEET_SECRETS.
EXEC = "gpufleet-exec"
# Dispatch meta naming the experiment a run belongs to (the control plane's id; an operator dispatch
# uses its idempotency token). Every attempt of one experiment carries the same value, so its
# GPUFLEET_CHECKPOINT_URI is the same directory (jobs.nomad.render, jobs.k8s.render).
EXPERIMENT_META = "gpufleet_experiment"
# Dispatch meta with the seconds left of the experiment's deadline when the run was dispatched (the
# control plane's experiments.deadline; an operator dispatch passes none and the job's max_run_hours
# alone binds): the scheduler side enforces it (Nomad: gpufleet-exec via GPUFLEET_RUN_DEADLINE_SECONDS;
# GKE: the Job's activeDeadlineSeconds too), so a run bills no longer than admission priced it even
# when the control plane is down.
RUN_DEADLINE_META = "gpufleet_run_deadline_seconds"


@dataclass(frozen=True)
class GpuRequest:
    count: int
    min_memory_gib: int | None
    prefer_memory_gib: int | None
    model: str | None

    def describe(self, *, free: bool = True) -> str:
        """'2 free GPUs with >= 40 GiB': the words placement failures are reported in."""
        text = f"{self.count}{' free' if free else ''} GPU{'s' if self.count != 1 else ''}"
        if self.min_memory_gib is not None:
            text += f" with >= {self.min_memory_gib} GiB"
        if self.model is not None:
            text += f" matching model {self.model!r}"
        return text


@dataclass(frozen=True)
class GkeTarget:
    """Where a GKE run goes: the tenant's LocalQueue for the pool and its workload service account."""

    local_queue: str
    service_account: str
    # The pool's GPUDirect node networks as (GKE Network object name, device mode), in NIC order:
    # clusters.derive.gpudirect.derive_gpudirect, the same derivation the scheduler stack's Network objects use.
    networks: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class FinetuneSpec:
    name: str
    source: Path
    cluster: str
    scheduler: SchedulerKind
    namespace: str
    # The tenant's quotas, for the dispatch-time check (Nomad CE enforces none itself).
    tenant: TenantSpec
    # Nomad only (None on GKE).
    region: str | None
    datacenter: str | None
    vault_addr: str
    pool: GpuPoolSpec
    gpu: GpuRequest
    image: str
    command: str
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    cpu_mhz: int
    memory_mb: int
    disk_mb: int
    meta_required: tuple[str, ...]
    meta_optional: tuple[str, ...]
    # None for a job without ``secrets:``: no role, no wrap minted, gpufleet-exec skips Vault.
    vault_role: str | None
    secrets: tuple[tuple[str, str], ...]
    max_run_ns: int
    kill_timeout_ns: int
    restart: Restart
    reschedule: Reschedule
    priority: int
    # jobs.schema.Retries: what the control plane retries and how often (issue 25).
    retries: Retries = Retries()
    nodes: int = 1
    cpu_millicores: int = 4000
    gke: GkeTarget | None = None
    # jobs.schema.JobFile.topology: the level every rank must share, or None (preferred sub-block).
    topology: str | None = None
    # jobs.schema.Preflight as (image, dcgm diag level), or None.
    preflight: tuple[str, int] | None = None
    # The cluster's checkpoint bucket (clusters.derive.checkpoints); runs write under <tenant>/<experiment>/.
    checkpoint_bucket: str | None = None
    # jobs.schema.Checkpoint.mount (GKE): where the run's checkpoint directory is mounted, or None.
    checkpoint_mount: str | None = None

    @property
    def total_gpus(self) -> int:
        """GPUs one run holds: every node (rank) of a multi-node run gets ``gpu.count``. Quota,
        GPU-hours and cost count this, never ``gpu.count`` alone."""
        return self.gpu.count * self.nodes

    @property
    def task_group(self) -> str:
        return nomad_task_group_name(self.pool.name, self.gpu.count)

    @property
    def secrets_env(self) -> str:
        """GPUFLEET_SECRETS as gpufleet-exec reads it: ENV=path#key, comma-separated, sorted."""
        return ",".join(f"{name}={ref}" for name, ref in self.secrets)


def cpu_millicores(job: JobFile) -> int:
    """GKE's CPU request: cpu_cores if set, else one core per 1000 MHz of the Nomad share."""
    return int(round(job.cpu_cores * 1000)) if job.cpu_cores is not None else job.cpu_mhz


def derive_spec(job: JobFile, config: ClusterConfig, *, source: Path) -> FinetuneSpec:
    pool = next(p for p in derive_gpu_pools(config) if p.name == job.gpu.pool)
    if config.scheduler == SchedulerKind.GKE:
        if config.gke is None or config.gke.vault_addr is None:
            raise ValueError(f"cluster {config.name} has no gke.vault_addr; run cross-checks first")
        region, datacenter, vault_addr = None, None, config.gke.vault_addr
        gke = GkeTarget(local_queue=kueue_local_queue_name(pool.name), service_account=WORKLOAD_KSA,
                        networks=tuple((n.k8s_name, n.device_mode) for n in derive_gpudirect(config).for_pool(pool.name)))
    else:
        if config.nomad is None:
            raise ValueError(f"cluster {config.name} has no nomad section; run cross-checks first")
        region, datacenter, vault_addr, gke = config.nomad.region, config.nomad.datacenter, config.nomad.vault_addr, None
    return FinetuneSpec(
        name=job.name,
        source=source,
        cluster=config.name,
        scheduler=config.scheduler,
        namespace=job.tenant,
        tenant=next(t for t in derive_tenants(config) if t.name == job.tenant),
        region=region,
        datacenter=datacenter,
        vault_addr=vault_addr,
        pool=pool,
        gpu=GpuRequest(job.gpu.count, job.gpu.min_memory_gib, job.gpu.prefer_memory_gib, job.gpu.model),
        image=job.image,
        command=job.command,
        args=tuple(job.args),
        env=tuple(sorted(job.env.items())),
        cpu_mhz=job.cpu_mhz,
        memory_mb=job.memory_mb,
        disk_mb=job.disk_mb,
        meta_required=tuple(sorted(job.meta_required)),
        meta_optional=tuple(sorted(job.meta_optional)),
        vault_role=job.secrets.role if job.secrets else None,
        secrets=tuple(sorted(job.secrets.env.items())) if job.secrets else (),
        max_run_ns=int(job.max_run_hours * 3600) * NS_PER_SECOND,
        kill_timeout_ns=job.kill_timeout,
        restart=job.restart,
        reschedule=job.reschedule,
        retries=job.retries,
        priority=job.priority,
        nodes=job.nodes,
        cpu_millicores=cpu_millicores(job),
        gke=gke,
        topology=job.topology,
        preflight=(job.preflight.image, job.preflight.dcgm_diag_level) if job.preflight else None,
        checkpoint_bucket=bucket_name(config),
        checkpoint_mount=job.checkpoint.mount if job.checkpoint else None,
    )


def exec_argv(spec: FinetuneSpec) -> list[str]:
    """The task command, behind gpufleet-exec so keys arrive only at run time."""
    return [EXEC, "--", spec.command, *spec.args]
