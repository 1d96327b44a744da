"""The derived, frozen form of a checked job file: everything rendering and dispatch need.

Derivation (namespace from tenant, region/datacenter/Vault address from the cluster, the
pool's GPU facts) happens once here, so the renderer is a pure function of the spec.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from clusters.derive import GpuPoolSpec, TenantSpec, derive_gpu_pools, derive_tenants, nomad_task_group_name
from clusters.schema import ClusterConfig
from jobs.durations import NS_PER_SECOND
from jobs.schema import JobFile, Reschedule, Restart

TASK = "train"


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
class FinetuneSpec:
    name: str
    source: Path
    cluster: str
    namespace: str
    # The tenant's quotas, for the dispatch-time check (Nomad CE enforces none itself).
    tenant: TenantSpec
    region: str
    datacenter: str
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
    vault_role: str
    secrets: tuple[tuple[str, str], ...]
    max_run_ns: int
    kill_timeout_ns: int
    restart: Restart
    reschedule: Reschedule
    priority: int

    @property
    def task_group(self) -> str:
        return nomad_task_group_name(self.pool.name, self.gpu.count)

    @property
    def secrets_env(self) -> str:
        """GPUFLEET_SECRETS as gpufleet-exec reads it: ENV=path#key, comma-separated, sorted."""
        return ",".join(f"{name}={ref}" for name, ref in self.secrets)


def derive_spec(job: JobFile, config: ClusterConfig, *, source: Path) -> FinetuneSpec:
    if config.nomad is None:
        raise ValueError(f"cluster {config.name} has no nomad section; run cross-checks first")
    pool = next(p for p in derive_gpu_pools(config) if p.name == job.gpu.pool)
    return FinetuneSpec(
        name=job.name,
        source=source,
        cluster=config.name,
        namespace=job.tenant,
        tenant=next(t for t in derive_tenants(config) if t.name == job.tenant),
        region=config.nomad.region,
        datacenter=config.nomad.datacenter,
        vault_addr=config.nomad.vault_addr,
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
        vault_role=job.secrets.role,
        secrets=tuple(sorted(job.secrets.env.items())),
        max_run_ns=int(job.max_run_hours * 3600) * NS_PER_SECOND,
        kill_timeout_ns=job.kill_timeout,
        restart=job.restart,
        reschedule=job.reschedule,
        priority=job.priority,
    )
