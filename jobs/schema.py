"""The job file schema: what an ML engineer may write in ``jobs/<job>.yaml``.

Field-level rules live here (types, ranges, shapes). Rules on names and values (secret-looking
env, platform prefixes) and rules that relate a job to the rest of the repo (the cluster, its
tenants and pools, the Vault role and what its policies may read) live in ``jobs.checks``,
so each failure points at the exact YAML key and line.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from jobs.durations import parse_duration_ns

JOB_NAME = re.compile(r"^[a-z]([a-z0-9-]{0,46}[a-z0-9])?$")
ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
META_KEY = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
# Relative to the KV v2 mount ``secret``, as GPUFLEET_SECRETS wants it: ``ml-api-keys/huggingface#token``.
SECRET_REF = re.compile(r"^[a-z0-9][a-z0-9_.-]*(/[a-z0-9][a-z0-9_.-]*)+#[A-Za-z0-9_]+$")
# Variables the platform sets; a job must not shadow them.
RESERVED_ENV_PREFIXES = ("GPUFLEET_", "NOMAD_", "VAULT_")
# torchrun's rendezvous environment; the platform sets it for GKE runs (jobs.k8s.render), job files may not.
PLATFORM_ENV = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "NNODES", "NPROC_PER_NODE", "WORLD_SIZE")
# Variables gpufleet-exec (a Python program holding the Vault token) would itself honour before
# login: proxies and CA bundles redirect or intercept its Vault traffic, PYTHON*/LD_* load code
# into it. The platform sets them if a node needs them; a job file never does.
WRAPPER_ENV_NAMES = frozenset({"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE", "SSL_CERT_DIR", "NETRC", "PATH"})
WRAPPER_ENV_PREFIXES = ("PYTHON", "LD_")
# A name is secret-looking if one of its _-separated words is here, or it contains a *_KEY pair below.
SECRET_NAME_WORDS = frozenset({"TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "CREDENTIALS", "APIKEY"})
SECRET_NAME_PAIRS = ("API_KEY", "ACCESS_KEY", "PRIVATE_KEY", "SECRET_KEY")
def _job_name(value: str) -> str:
    if not JOB_NAME.match(value):
        raise ValueError(f"{value!r} is not a job name; use 1-48 lowercase letters, digits or '-', starting with a letter, e.g. 'finetune-llama'")
    return value


def secret_like_name(name: str) -> bool:
    return bool(SECRET_NAME_WORDS & set(name.split("_"))) or any(pair in name for pair in SECRET_NAME_PAIRS)


DurationNs = Annotated[int, BeforeValidator(parse_duration_ns)]


class Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RestartMode(StrEnum):
    FAIL = "fail"
    DELAY = "delay"


class DelayFunction(StrEnum):
    CONSTANT = "constant"
    EXPONENTIAL = "exponential"
    FIBONACCI = "fibonacci"


class Gpu(Model):
    # A GPU pool of the job's cluster on which its tenant has gpu_quota.
    pool: Annotated[str, Field(min_length=1)]
    # GPUs per node of one run; at most the pool's gpus_per_node.
    count: Annotated[int, Field(ge=1, le=16)] = 1
    # Nomad: a device constraint on GPU memory as NVML reports it; checked against the pool's GPU.
    min_memory_gib: Annotated[int, Field(ge=1, le=1024)] | None = None
    # Nomad: a device affinity (preferred, not required); checked against the pool's GPU.
    prefer_memory_gib: Annotated[int, Field(ge=1, le=1024)] | None = None
    # Nomad: a regular expression on the GPU model as NVML names it, e.g. 'A100'; checked against the pool's GPU.
    model: Annotated[str, Field(min_length=1, max_length=64)] | None = None

    @field_validator("model")
    @classmethod
    def _model_regex(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"{value!r} is not a regular expression ({exc}); write e.g. 'A100' or 'A100-SXM4-(40|80)GB'") from None
        return value


class Restart(Model):
    """Restarts on the same client. Off: a restarted task would present the same wrapped,
    single-use secret_id again and fail as if it had been stolen (``jobs.checks`` refuses > 0)."""

    attempts: Annotated[int, Field(ge=0, le=10)] = 0
    delay: DurationNs = parse_duration_ns("30s")
    interval: DurationNs = parse_duration_ns("24h")
    mode: RestartMode = RestartMode.FAIL


class Reschedule(Model):
    """Moving to another client. Off for the same reason as restarts: a failed run is
    re-dispatched, which mints a fresh secret_id."""

    attempts: Annotated[int, Field(ge=0, le=10)] = 0
    interval: DurationNs = parse_duration_ns("24h")
    delay: DurationNs = parse_duration_ns("5m")
    delay_function: DelayFunction = DelayFunction.CONSTANT
    max_delay: DurationNs = parse_duration_ns("1h")
    unlimited: bool = False


class Retries(Model):
    """What the control plane does when a run fails (issue 25). Infrastructure failures (a lost node,
    a spot reclaim, an eviction or preemption, a GPU fault: ``jobs.failures``) are retried, and so are
    the listed exit codes of the training command; its other exits are not. Each retry is a new
    attempt with new single-use secret_ids; ``max_attempts`` is how many retries after the first
    attempt (0: never retry)."""

    max_attempts: Annotated[int, Field(ge=0, le=20, description="retries after the first attempt, 0-20 (0: never retry)")] = 3
    on_exit_codes: tuple[Annotated[int, Field(ge=1, le=255)], ...] = ()


class Secrets(Model):
    # An AppRole role of vault_policies/roles.yaml that names the job's cluster.
    role: Annotated[str, Field(min_length=1)]
    # Environment variable: `<path under secret/>#<field>`, e.g. `HF_TOKEN: ml-api-keys/huggingface#token`; read from Vault at start.
    env: Annotated[dict[str, str], Field(min_length=1)]

# Lengths from distribution/reference: a name is at most 255 characters, a tag 128 (plus ':' and '@sha256:<64>').
IMAGE_PATTERN = r"^[a-z0-9][a-z0-9._/-]{0,254}(:[A-Za-z0-9_][A-Za-z0-9._-]{0,127})?(@sha256:[0-9a-f]{64})?$"


class Preflight(Model):
    """GPU health gate before a multi-node GKE run's training command (jobs.k8s.render): every rank
    first starts a DCGM host engine and runs ``dcgmi diag -r <level>`` against it on its node's GPUs in
    ``image`` (one with ``nv-hostengine``, ``dcgmi``, DCGM's validation suite and ``sh``, e.g. NVIDIA's
    DCGM image), as the run's non-root user; a failing rank fails the run at once, counted as
    an infrastructure failure, before any rank starts training."""

    image: Annotated[str, Field(pattern=IMAGE_PATTERN, description="an image reference with DCGM's nv-hostengine, dcgmi and validation suite (NVVS), and sh")]
    # dcgmi diag run levels: 1 quick (seconds), 2 medium (about 2 minutes), 3 long (about 15 minutes).
    dcgm_diag_level: Literal[1, 2, 3] = 1


class Checkpoint(Model):
    """GKE: mount the run's checkpoint directory (``GPUFLEET_CHECKPOINT_URI``) at ``mount`` through the
    GCS FUSE CSI driver (docs/checkpoints.md). Every run gets the URI; the mount is optional."""

    mount: Annotated[str, Field(pattern=r"^/[A-Za-z0-9._/-]{1,200}$",
                                description="an absolute path inside the container, e.g. '/ckpt'")]


class JobFile(Model):
    # The file's own name: `jobs/<name>.yaml`.
    name: Annotated[str, AfterValidator(_job_name)]
    # A cluster of clusters/ (its file name).
    cluster: Annotated[str, Field(min_length=1)]
    # A tenant of that cluster: the job runs in its namespace and counts against its gpu_quota.
    tenant: Annotated[str, Field(min_length=1)]
    gpu: Gpu
    image: Annotated[str, Field(pattern=IMAGE_PATTERN,
                                description="an image reference: a lowercase registry/path of at most 255 characters, optional"
                                            " ':tag' (at most 128) and '@sha256:<64 hex>', e.g. 'ghcr.io/acme/train:1.4'")]
    # Run in the image as `gpufleet-exec -- <command> <args>` (gpufleet-exec logs in to Vault and sets secrets.env first).
    command: Annotated[str, Field(min_length=1)]
    args: tuple[str, ...] = ()
    # Plain settings only: a value or name that looks like a credential is refused; keys go in secrets.env.
    env: dict[str, str] = {}
    # Nodes of one run (multi-node fine-tunes; GKE only for now): each gets gpu.count GPUs.
    nodes: Annotated[int, Field(ge=1, le=64)] = 1
    # GKE, nodes > 1: the topology level all ranks must share (Kueue's podset-required-topology).
    # Unset, ranks are preferred within one sub-block and spill over only when none has room.
    topology: Literal["block", "subblock", "host"] | None = None
    # GKE, nodes > 1: a GPU health pre-flight on every node before the training command starts.
    preflight: Preflight | None = None
    checkpoint: Checkpoint | None = None
    cpu_mhz: Annotated[int, Field(ge=100, le=512_000)] = 4000
    # GKE requests CPU in cores; unset, it is cpu_mhz / 1000 (one core per GHz of the Nomad share).
    cpu_cores: Annotated[float, Field(ge=0.1, le=512)] | None = None
    memory_mb: Annotated[int, Field(ge=128, le=4_194_304)] = 16384
    disk_mb: Annotated[int, Field(ge=100, le=16_777_216)] = 20480
    # Keys every run must give (`--meta key=value`); the task reads them as `NOMAD_META_<key>` (GKE: `GPUFLEET_META_<key>`).
    # In either list, `dataset_uri` must be gs://, s3:// or hf:// with a version, e.g. `hf://datasets/acme/chat@v3`;
    # `run_id` is 1-63 lowercase letters, digits, '.', '_' or '-'.
    meta_required: tuple[str, ...] = ()
    # Keys a run may give.
    meta_optional: tuple[str, ...] = ()
    # Optional: a job that needs no API keys gets no Vault role, no wrapped secret_id and no login.
    secrets: Secrets | None = None
    # A run is stopped after this long and marked expired; `exp submit --deadline-hours` may only shorten it.
    max_run_hours: Annotated[float, Field(gt=0, le=168)]
    kill_timeout: DurationNs = parse_duration_ns("2m")
    restart: Restart = Restart()
    reschedule: Reschedule = Reschedule()
    retries: Retries = Retries()
    # Nomad job priority; GKE: 70 and above gets the priority class that may preempt lower ones.
    priority: Annotated[int, Field(ge=1, le=100)] = 50
