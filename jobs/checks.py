"""Cross-references of a job file, as pure functions returning (field path, message) pairs.

A job may only name things that exist and fit: a cluster from ``clusters/`` (Nomad or GKE), one
of its tenants (the Nomad or Kubernetes namespace) with quota on one of its GPU pools, a GPU
request one node of that pool can satisfy, a pinned image, and a Vault role whose policies can
read every key the job asks for.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from clusters.derive.pools import GpuPoolSpec, derive_gpu_pools
from clusters.derive.tenants import DEFAULT_CONTAINER_CPU_MILLICORES, DEFAULT_CONTAINER_MEMORY_MIB
from clusters.families import TOPOLOGY_FAMILIES, GpuDirect, topology_family
from clusters.machines import gke_allocatable, machine_shape
from clusters.schema import ClusterConfig, SchedulerKind
from clusters.secrets import detect
from clusters.source import FieldPath, did_you_mean
from jobs.durations import NS_PER_SECOND
from jobs.nccl import reserved_env
from jobs.schema import ENV_NAME, META_KEY, PLATFORM_ENV, RESERVED_ENV_PREFIXES, SECRET_REF, WRAPPER_ENV_NAMES, WRAPPER_ENV_PREFIXES, JobFile, RestartMode, secret_like_name
from jobs.spec import cpu_millicores
from jobs.vault_refs import VaultView, readable_paths
from vault_policies.exec import EXIT_INTERCEPTED, EXIT_REVOKED

# What the GKE renderer mounts in the training container (jobs.k8s.render): a checkpoint mount may not overlap them.
RESERVED_MOUNTS = ("/tmp", "/scratch", "/dev/shm", "/var/run/gpufleet")

Finding = tuple[FieldPath, str]


def cross_check(job: JobFile, clusters: dict[str, ClusterConfig], vault: VaultView, *, file_stem: str | None) -> list[Finding]:
    findings: list[Finding] = []
    if file_stem is not None and job.name != file_stem:
        findings.append((("name",), f"{job.name!r} must equal the file name {file_stem!r}; rename the file or set name: {file_stem}"))
    findings += _hygiene(job)
    findings += _collisions(job)
    findings += _retries(job)
    findings += _vault(job, vault)
    config = clusters.get(job.cluster)
    if config is None:
        names = sorted(clusters)
        findings.append((("cluster",), f"cluster {job.cluster!r} does not exist{did_you_mean(job.cluster, names)}; allowed: {', '.join(names) or '(no cluster)'}; name a file in clusters/"))
        return findings
    findings += _placement(job, config)
    findings += _gke(job, config) if config.scheduler == SchedulerKind.GKE else _nomad_only(job, clusters)
    return findings


def _hygiene(job: JobFile) -> Iterator[Finding]:
    """No credential in the file, no shadowing of platform variables, names Nomad accepts."""
    for name, value in sorted(job.env.items()):
        at = ("env", name)
        if not ENV_NAME.match(name):
            yield (at, f"env name {name!r} is not allowed; use upper-case letters, digits and '_', e.g. 'HF_HOME'")
        elif name.startswith(RESERVED_ENV_PREFIXES):
            yield (at, f"{name} is set by the platform (prefixes {', '.join(RESERVED_ENV_PREFIXES)}); remove it or rename it")
        elif name in WRAPPER_ENV_NAMES or name.startswith(WRAPPER_ENV_PREFIXES):
            yield (at, f"{name} would be honoured by gpufleet-exec itself before its Vault login (proxies, CA bundles, PATH, PYTHON*, LD_*); not allowed in a job's env; remove it (the platform sets these on the node if needed)")
        elif detect(str(value), name):
            yield (at, f"the value of {name} looks like a credential (not shown); delete it from this file, rotate it, and add {name} to secrets.env as a Vault path")
        elif secret_like_name(name):
            yield (at, f"{name} looks like a secret name; move it to secrets.env as {name}: ml-api-keys/<name>#<key> so it comes from Vault, or rename it")
    tag = job.image.split("@", 1)[0].rpartition("/")[2].partition(":")[2]
    if "@sha256:" not in job.image and tag in ("", "latest"):
        yield (("image",), f"{job.image!r} is not pinned: a rerun could train with another image; add a version tag or a digest, e.g. {job.image.split(':')[0]}:2026.12 or ...@sha256:<digest>")
    previous = ""
    for index, arg in enumerate(job.args):
        if detect(arg, previous):  # '--wandb-key', '<hex>': the flag before a value names it
            yield (("args", index), "this argument looks like a credential (not shown); delete it, rotate it, and read it from a variable listed in secrets.env")
        previous = arg if arg.startswith("-") else ""
    for field, value in (("command", job.command), ("image", job.image), ("gpu", job.gpu.model)):
        if value is not None and detect(value, field):
            yield ((field, "model") if field == "gpu" else (field,), "this looks like a credential (not shown); delete it, rotate it, and read it from a variable listed in secrets.env")
    for name, ref in sorted(_secret_env(job).items()):
        at = ("secrets", "env", name)
        if not ENV_NAME.match(name) or name.startswith(RESERVED_ENV_PREFIXES) or name in WRAPPER_ENV_NAMES or name.startswith(WRAPPER_ENV_PREFIXES):
            yield (at, f"secret env name {name!r} is not allowed; use upper-case letters, digits and '_' without the prefixes {', '.join(RESERVED_ENV_PREFIXES)}, e.g. 'HF_TOKEN'")
        elif not SECRET_REF.match(ref):
            hint = " and looks like the secret itself (not shown): delete it, rotate it" if detect(ref, name) else f" ({ref!r})"
            yield (at, f"value is not a Vault reference{hint}; write <path under the secret/ mount>#<key>, e.g. ml-api-keys/huggingface#token")
    for field in ("meta_required", "meta_optional"):
        keys = getattr(job, field)
        for index, key in enumerate(keys):
            if not META_KEY.match(key):
                yield ((field, index), f"meta key {key!r} is not allowed; use lowercase letters, digits and '_', starting with a letter, e.g. 'dataset_uri'")
            elif key.startswith("gpufleet_"):
                yield ((field, index), f"meta key {key!r} uses the platform prefix 'gpufleet_'; rename it")
            elif key in keys[:index]:
                yield ((field, index), f"{key!r} is listed twice; list each key once")


def _collisions(job: JobFile) -> Iterator[Finding]:
    for name in sorted(set(job.env) & set(_secret_env(job))):
        yield (("secrets", "env", name), f"{name} is also set under env; a variable has one source: delete env.{name} and keep it here")
    for key in sorted(set(job.meta_required) & set(job.meta_optional)):
        yield (("meta_optional",), f"{key!r} is also in meta_required; keep each key in one list")
    if job.kill_timeout >= job.max_run_hours * 3600 * NS_PER_SECOND:
        yield (("kill_timeout",), f"{job.kill_timeout // NS_PER_SECOND}s is not shorter than max_run_hours ({job.max_run_hours:g}h); write e.g. '2m'")


RETRY_FIX = "a retried task would reuse the spent single-use secret_id; set attempts: 0 and re-dispatch a failed run with gpufleet jobs dispatch"


def _retries(job: JobFile) -> Iterator[Finding]:
    """Nomad retries reuse the dispatch meta, so the task would unwrap a spent token and exit
    78 with a false compromise alarm; retrying is the dispatcher's job, with a new secret_id."""
    if job.restart.attempts > 0:
        yield (("restart", "attempts"), f"{job.restart.attempts} is not allowed; allowed: 0; {RETRY_FIX}")
    if job.restart.mode != RestartMode.FAIL:
        yield (("restart", "mode"), f"{job.restart.mode.value!r} restarts the task after each interval; allowed: 'fail'; {RETRY_FIX.replace('set attempts: 0', 'set mode: fail')}")
    if job.reschedule.attempts > 0:
        yield (("reschedule", "attempts"), f"{job.reschedule.attempts} is not allowed; allowed: 0; {RETRY_FIX}")
    if job.reschedule.unlimited:
        yield (("reschedule", "unlimited"), f"true is not allowed; allowed: false; {RETRY_FIX.replace('set attempts: 0', 'set unlimited: false')}")
    for index, code in enumerate(job.retries.on_exit_codes):
        if code in SECURITY_EXITS:
            yield (("retries", "on_exit_codes", index), f"{code} is gpufleet-exec's {SECURITY_EXITS[code]} exit: a retry would give that run a fresh "
                                                         "secret_id and hide the alarm; allowed: any other code 1-255; remove it")


# gpufleet-exec's exits that are security alarms (vault_policies/exec.py EXIT_INTERCEPTED, EXIT_REVOKED):
# a run whose wrap was used by someone else, or whose token an operator revoked, must stay ended.
SECURITY_EXITS = {EXIT_INTERCEPTED: "possible-interception", EXIT_REVOKED: "token-revoked"}


def _placement(job: JobFile, config: ClusterConfig) -> Iterator[Finding]:
    tenants = {t.name: t for t in config.tenants}
    tenant = tenants.get(job.tenant)
    if tenant is None:
        yield (("tenant",), f"tenant {job.tenant!r} does not exist in cluster {config.name}{did_you_mean(job.tenant, tenants)}; allowed: {', '.join(sorted(tenants))}; add it to clusters/{config.name}.yaml or pick one")
    pools = {p.name: p for p in derive_gpu_pools(config)}
    pool = pools.get(job.gpu.pool)
    if pool is None:
        yield (("gpu", "pool"), f"GPU pool {job.gpu.pool!r} does not exist in cluster {config.name}{did_you_mean(job.gpu.pool, pools)}; allowed: {', '.join(sorted(pools))}; pick one")
        return
    yield from _gpu_fit(job, pool)
    if config.scheduler != SchedulerKind.GKE:  # GKE's stricter node-allocatable checks are in _gke
        yield from _resources_fit(job, pool)
    # Kueue gives a tenant 0 GPUs on every pool its quota does not name, so on GKE an empty quota is a quota.
    if tenant is not None and (tenant.gpu_quota or config.scheduler == SchedulerKind.GKE):
        quota = tenant.gpu_quota.get(pool.name, 0)
        wanted = job.gpu.count * job.nodes
        if wanted > quota:
            what = f"{job.gpu.count} GPUs" if job.nodes == 1 else f"{job.nodes} nodes x {job.gpu.count} GPUs = {wanted}"
            yield (("gpu", "count"), f"{what} exceed tenant {tenant.name}'s quota of {quota} on pool {pool.name} in clusters/{config.name}.yaml; the run could never be admitted; ask for at most {quota} or raise the quota")


def _nomad_only(job: JobFile, clusters: dict[str, ClusterConfig]) -> Iterator[Finding]:
    gke = ", ".join(sorted(n for n, c in clusters.items() if c.scheduler == SchedulerKind.GKE)) or "(none)"
    if job.nodes > 1:
        yield (("nodes",), f"{job.nodes} nodes: multi-node runs are built on GKE only (an Indexed Job with a rendezvous Service), not on Nomad yet; set nodes: 1 or pick a GKE cluster: {gke}")
    elif job.preflight is not None:
        yield (("preflight",), f"preflight gates multi-node GKE runs; Nomad runs one node: remove preflight or pick a GKE cluster: {gke}")
    if job.nodes == 1 and job.topology is not None:
        yield (("topology",), f"topology places the ranks of a multi-node GKE run; Nomad runs one node: remove topology or pick a GKE cluster: {gke}")
    if job.checkpoint is not None:
        yield (("checkpoint", "mount"), f"checkpoint.mount uses GKE's GCS FUSE CSI driver; Nomad tasks read and write GPUFLEET_CHECKPOINT_URI"
               f" with a Cloud Storage client: remove checkpoint or pick a GKE cluster: {gke}")
    if job.cpu_cores is not None:
        yield (("cpu_cores",), f"cpu_cores is read on GKE only; Nomad reserves CPU in MHz: delete cpu_cores and set cpu_mhz, or pick a GKE cluster: {gke}")


def _gke(job: JobFile, config: ClusterConfig) -> Iterator[Finding]:
    """What a GKE node and the cluster file must offer for this Job to be admitted and scheduled."""
    for name in sorted(set(job.env) & set(PLATFORM_ENV)):
        yield (("env", name), f"{name} is set by the platform on GKE (rendezvous and rank for torchrun); remove it")
    if job.checkpoint is not None and any(job.checkpoint.mount.rstrip("/") == d or job.checkpoint.mount.startswith(d + "/") or d.startswith(job.checkpoint.mount.rstrip("/") + "/")
                                          for d in RESERVED_MOUNTS):
        yield (("checkpoint", "mount"), f"{job.checkpoint.mount} overlaps a directory the platform mounts ({', '.join(RESERVED_MOUNTS)}); pick another path, e.g. /ckpt")
    if config.gke is None or config.gke.vault_addr is None:
        yield (("cluster",), f"cluster {config.name} has no gke.vault_addr, so its pods cannot reach Vault for their keys; add gke: {{vault_addr: https://vault.example.com:8200}} to clusters/{config.name}.yaml")
    pool = next((p for p in derive_gpu_pools(config) if p.name == job.gpu.pool), None)
    if pool is None:
        return
    if job.nodes > 1 and pool.gpudirect != GpuDirect.NONE:
        for name in sorted(set(job.env) & set(reserved_env(pool.gpudirect))):
            yield (("env", name), f"{name} is set by the platform for multi-node runs on GPUDirect pool {pool.name} (NCCL over the pool's extra NICs); remove it")
        if job.gpu.count != pool.gpus_per_node:
            yield (("gpu", "count"), f"{job.gpu.count} GPUs per node: a multi-node run on GPUDirect pool {pool.name} takes whole nodes "
                   f"(one receive-datapath sidecar per node serves all its GPUs); set gpu.count: {pool.gpus_per_node}")
    yield from _topology(job, pool, config)
    if job.preflight is not None and job.nodes < 2:
        yield (("preflight",), "preflight gates the nodes of a multi-node run before its ranks start; this job has nodes: 1; remove preflight or set nodes >= 2")
    if job.nodes > pool.max_total_nodes:
        yield (("nodes",), f"{job.nodes} nodes exceed pool {pool.name}'s maximum of {pool.max_total_nodes} in clusters/{config.name}.yaml; Kueue admits all ranks or none, so the run would never start; allowed: 1..{pool.max_total_nodes}")
    allocatable = gke_allocatable(pool.machine_type)
    if allocatable is not None:
        millicores, mib = allocatable
        # A multi-node TCPX/TCPXO run's RxDM sidecar gets the namespace's default request (jobs/k8s/gpudirect.py).
        beside = ""
        if job.nodes > 1 and pool.gpudirect in (GpuDirect.TCPX, GpuDirect.TCPXO):
            millicores, mib = millicores - DEFAULT_CONTAINER_CPU_MILLICORES, mib - DEFAULT_CONTAINER_MEMORY_MIB
            beside = " and beside the GPUDirect sidecar's default request"
        if cpu_millicores(job) > millicores:
            field = "cpu_cores" if job.cpu_cores is not None else "cpu_mhz"
            yield ((field,), f"{cpu_millicores(job) / 1000:g} cores do not fit one {pool.machine_type} node (about {millicores / 1000:g} allocatable after GKE's reservation{beside}); set cpu_cores to at most {millicores // 1000}")
        if job.memory_mb > mib:
            yield (("memory_mb",), f"{job.memory_mb} MiB does not fit one {pool.machine_type} node (about {mib} MiB allocatable after GKE's reservation{beside}); allowed: <= {mib}")
    disk_mib = int(pool.boot_disk_gb * 1024 * 0.9)
    if job.disk_mb > disk_mib:
        yield (("disk_mb",), f"{job.disk_mb} MiB of ephemeral storage does not fit pool {pool.name}'s {pool.boot_disk_gb} GB boot disk (kubelet evicts below 10% free); allowed: <= {disk_mib}; lower it or raise boot_disk_gb")


def _topology(job: JobFile, pool: GpuPoolSpec, config: ClusterConfig) -> Iterator[Finding]:
    """A required topology level the pool cannot give: Kueue would hold the run pending forever."""
    if job.topology is None:
        return
    if job.nodes < 2:
        yield (("topology",), f"topology: {job.topology} places the ranks of a multi-node run; this job has nodes: 1; remove topology or set nodes >= 2")
        return
    family = topology_family(pool.machine_type)
    if family is None or not pool.topology_aware:
        families = ", ".join(p for f in TOPOLOGY_FAMILIES for p in f.prefixes)
        yield (("topology",), f"pool {pool.name} ({pool.machine_type}) has no GCE topology labels, so Kueue cannot place ranks by {job.topology}; "
               f"remove topology or pick a pool of a block-placed machine type ({families})")
        return
    per_domain = family.nodes_per(job.topology)
    if per_domain is not None and job.nodes > per_domain:
        wider = "block" if job.topology != "block" else None
        fix = f"set topology: {wider} or remove it (prefer one sub-block)" if wider else "remove topology (prefer one sub-block)"
        yield (("topology",), f"{job.nodes} nodes cannot share one {job.topology}: a {pool.machine_type} {job.topology} holds {per_domain} node"
               f"{'s' if per_domain != 1 else ''}, so Kueue would never admit the run; {fix}, or lower nodes to {per_domain}")


def _gpu_fit(job: JobFile, pool: GpuPoolSpec) -> Iterator[Finding]:
    gpu = job.gpu
    if gpu.count > pool.gpus_per_node:
        yield (("gpu", "count"), f"{gpu.count} GPUs do not fit one node of pool {pool.name} ({pool.machine_type} has {pool.gpus_per_node}); allowed: 1..{pool.gpus_per_node}; lower count or pick a bigger pool")
    nvml = pool.nvml
    reported = f"{nvml.nvml_name} reports {nvml.memory_mib} MiB = {nvml.memory_mib / 1024:.2f} GiB to Nomad"
    top = nvml.memory_mib // 1024
    for field in ("min_memory_gib", "prefer_memory_gib"):
        value = getattr(gpu, field)
        if value is not None and not nvml.memory_confirmed:
            yield (("gpu", field), f"pool {pool.name}'s {nvml.nvml_name} memory as NVML reports it is not confirmed ({nvml.source});"
                   f" remove {field} (the pool already selects the GPU model) or confirm the value in clusters/machines.py")
            return
    if gpu.min_memory_gib is not None and gpu.min_memory_gib * 1024 > nvml.memory_mib:
        yield (("gpu", "min_memory_gib"), f"{gpu.min_memory_gib} GiB is more than pool {pool.name}'s GPU has: {reported} (marketed as"
               f" {pool.gpu_memory_gib} GB), so the job could never be placed; allowed: <= {top}; lower it or pick a pool with bigger GPUs")
    if gpu.prefer_memory_gib is not None:
        low = gpu.min_memory_gib or 1
        if not low <= gpu.prefer_memory_gib <= top:
            yield (("gpu", "prefer_memory_gib"), f"{gpu.prefer_memory_gib} GiB can never be preferred on pool {pool.name} ({reported}); allowed: {low}..{top}; change it or remove it")
    if gpu.model is not None and not re.search(gpu.model, nvml.nvml_name):
        yield (("gpu", "model"), f"pattern {gpu.model!r} does not match pool {pool.name}'s GPU model as NVML names it ({nvml.nvml_name!r}); the job could never be placed; write a pattern matching it, e.g. {nvml.nvml_name.split()[-1]!r}")


# Nomad counts CPU in MHz; no Compute Engine vCPU offers more than this per core, so a request above
# vCPUs x this can never be placed (an upper bound: the real fingerprint is lower).
MAX_MHZ_PER_VCPU = 4000


def _resources_fit(job: JobFile, pool: GpuPoolSpec) -> Iterator[Finding]:
    """One dispatched run lands on one node: it cannot ask for more than the pool's machine and boot disk have."""
    shape = machine_shape(pool.machine_type)
    if shape is not None:
        memory_mb = int(shape.memory_gib * 1024)
        if job.memory_mb > memory_mb:
            yield (("memory_mb",), f"{job.memory_mb} MB is more than a {pool.machine_type} node of pool {pool.name} has ({shape.memory_gib:g} GiB"
                   f" = {memory_mb} MB); allowed: <= {memory_mb}; lower memory_mb or pick a pool with a bigger machine")
        cpu_mhz = shape.vcpus * MAX_MHZ_PER_VCPU
        if job.cpu_mhz > cpu_mhz:
            yield (("cpu_mhz",), f"{job.cpu_mhz} MHz is more than a {pool.machine_type} node of pool {pool.name} can offer ({shape.vcpus} vCPUs"
                   f" x at most {MAX_MHZ_PER_VCPU} MHz = {cpu_mhz}); allowed: <= {cpu_mhz}; lower cpu_mhz or pick a bigger machine")
    disk_mb = pool.boot_disk_gb * 1024
    if job.disk_mb > disk_mb:
        yield (("disk_mb",), f"{job.disk_mb} MB is more than pool {pool.name}'s boot disk ({pool.boot_disk_gb} GB = {disk_mb} MB);"
               f" allowed: <= {disk_mb}; lower disk_mb or raise boot_disk_gb on the pool")


def _secret_env(job: JobFile) -> dict[str, str]:
    """The job's Vault-backed variables; none for a job without ``secrets:``."""
    return dict(job.secrets.env) if job.secrets else {}


def _vault(job: JobFile, vault: VaultView) -> Iterator[Finding]:
    """A job without ``secrets:`` has no role to check: it is dispatched with no wrap and no login."""
    if job.secrets is None:
        return
    role = vault.roles.get(job.secrets.role)
    if role is None:
        yield (("secrets", "role"), f"Vault role {job.secrets.role!r} does not exist in vault_policies/roles.yaml{did_you_mean(job.secrets.role, vault.roles)}; allowed: {', '.join(sorted(vault.roles))}; add the role or pick one")
        return
    if job.cluster not in role.clusters:
        yield (("secrets", "role"), f"role {role.name} is bound to the task addresses of clusters {', '.join(role.clusters)}, not {job.cluster}: its tasks could not log in to Vault; add {job.cluster} to the role's clusters in vault_policies/roles.yaml (then gpufleet vault render) or pick another role")
    readable = readable_paths(role, vault)
    for name, ref in sorted(job.secrets.env.items()):
        if not SECRET_REF.match(ref):
            continue  # reported by _hygiene, without echoing what may be a credential
        path = ref.split("#", 1)[0]
        if not any(pattern.fullmatch(path) for pattern in readable.values()):
            allowed = ", ".join(sorted(readable)) or "(nothing)"
            yield (("secrets", "env", name), f"{path} is not readable by role {role.name} (policies {', '.join(role.policies)}); readable: {allowed}; pick one of those or add a read rule to vault_policies/policies/{role.policies[0]}.hcl")
    max_run_s = int(job.max_run_hours * 3600)
    if role.token_period_seconds is None and max_run_s > role.token_max_ttl_seconds:
        yield (("max_run_hours",), f"{job.max_run_hours:g}h outlives role {role.name}'s token_max_ttl ({role.token_max_ttl_seconds // 3600}h): the run would lose its Vault token; allowed: <= {role.token_max_ttl_seconds / 3600:g}; lower it or raise token_max_ttl in vault_policies/roles.yaml")
