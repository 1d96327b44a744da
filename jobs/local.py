"""``gpufleet jobs run-local``: run a job's task on this machine the way a Nomad client would.

Same command line (``gpufleet-exec -- <command> <args>``), same environment shape (the
task env with ``${NOMAD_META_*}`` interpolated, NOMAD_* runtime variables, an alloc dir
laid out like Nomad's) and the same Vault flow: the orchestrator mints a wrapped single-use
secret_id with VAULT_TOKEN from this shell, and gpufleet-exec in the child unwraps it, logs
in and exports the keys. VAULT_TOKEN itself never reaches the task.

Container -> local mapping: the image is built from this repository (WORKDIR = repo root),
so the task runs from the repo root with the same relative paths; ``python``/``python3``
is this interpreter (the one gpufleet runs in) and ``gpufleet-exec`` is the one installed
beside it. VAULT_ADDR (and VAULT_CACERT / VAULT_NAMESPACE) come from this shell, not from the
cluster file, so the key is read from the local OpenBao.

It picks the Nomad side by design: the environment it builds is the one a Nomad client derives
from ``jobs.nomad.render`` (job meta, ``${NOMAD_META_*}`` interpolation), so it reads that module.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from clusters.errors import UserError
from clusters.termination import run_to_end
from jobs.meta import validate_meta
from jobs.nomad.render import JOB_META_ROLE, render, task_env
from jobs.spec import TASK, FinetuneSpec, exec_argv
from jobs.vault_mint import mint_wrapped_secret_id, platform_meta
from vault_policies.layout import META_ATTEMPT

REPO_ROOT = Path(__file__).resolve().parent.parent
# What a container would inherit from its image; everything else comes from the task.
PASSTHROUGH = ("PATH", "HOME", "LANG", "LC_ALL", "TERM", "USER")
LOCAL_VAULT = ("VAULT_CACERT", "VAULT_NAMESPACE")
_INTERPOLATION = re.compile(r"\$\{([A-Za-z0-9_.]+)\}")
# Where a task writes the checkpoints it resumes from (issue 25); on this machine a directory under
# .gpufleet/checkpoints/, on the clusters a bucket prefix (the renderers set it there).
ENV_CHECKPOINT_URI = "GPUFLEET_CHECKPOINT_URI"
CHECKPOINTS_DIR = REPO_ROOT / ".gpufleet" / "checkpoints"


def _alloc_dirs(root: Path) -> dict[str, Path]:
    """Nomad's layout: <alloc>/alloc/{data,logs,tmp} shared, <alloc>/<task>/{local,secrets,tmp}."""
    dirs = {
        "alloc": root / "alloc",
        "task": root / TASK / "local",
        "secrets": root / TASK / "secrets",
        "tmp": root / TASK / "tmp",
    }
    for sub in ("data", "logs", "tmp"):
        (dirs["alloc"] / sub).mkdir(parents=True, exist_ok=True)
    for path in dirs.values():
        path.mkdir(parents=True, exist_ok=True)
    os.chmod(dirs["secrets"], 0o700)
    return dirs


def _interpolate(value: str, env: Mapping[str, str], meta: Mapping[str, str]) -> str:
    """Nomad-style ``${NOMAD_META_x}`` / ``${meta.x}`` / ``${VAR}``; unknown names stay literal, as in Nomad."""

    def sub(match: re.Match[str]) -> str:
        name = match.group(1)
        if name.startswith("meta."):
            return meta.get(name.removeprefix("meta."), match.group(0))
        return env.get(name, match.group(0))

    return _INTERPOLATION.sub(sub, value)


def task_environment(
    spec: FinetuneSpec,
    meta: Mapping[str, str],
    *,
    job_id: str,
    alloc_id: str,
    alloc_root: Path,
    environ: Mapping[str, str],
    checkpoint_dir: Path | None = None,
) -> dict[str, str]:
    """The environment a Nomad client would give the task, with this shell's Vault address, and
    GPUFLEET_CHECKPOINT_URI when ``checkpoint_dir`` is given (created here)."""
    dirs = _alloc_dirs(alloc_root)
    job_meta = {**render(spec)["Job"]["Meta"], **meta}
    env = {k: environ[k] for k in PASSTHROUGH if k in environ}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", os.defpath)])
    env.update(
        {
            "NOMAD_JOB_ID": job_id,
            "NOMAD_JOB_NAME": job_id,
            "NOMAD_JOB_PARENT_ID": spec.name,
            "NOMAD_NAMESPACE": spec.namespace,
            "NOMAD_REGION": spec.region,
            "NOMAD_DC": spec.datacenter,
            "NOMAD_GROUP_NAME": spec.task_group,
            "NOMAD_TASK_NAME": TASK,
            "NOMAD_ALLOC_ID": alloc_id,
            "NOMAD_SHORT_ALLOC_ID": alloc_id[:8],
            "NOMAD_ALLOC_NAME": f"{job_id}.{spec.task_group}[0]",
            "NOMAD_ALLOC_INDEX": "0",
            "NOMAD_ALLOC_DIR": str(dirs["alloc"]),
            "NOMAD_TASK_DIR": str(dirs["task"]),
            "NOMAD_SECRETS_DIR": str(dirs["secrets"]),
            "NOMAD_CPU_LIMIT": str(spec.cpu_mhz),
            "NOMAD_MEMORY_LIMIT": str(spec.memory_mb),
            "TMPDIR": str(dirs["tmp"]),
        }
    )
    # Nomad exposes each meta key as given and upper-cased.
    for key, value in sorted(job_meta.items()):
        env[f"NOMAD_META_{key}"] = value
        env[f"NOMAD_META_{key.upper()}"] = value
    for name, value in task_env(spec).items():
        env[name] = _interpolate(value, env, job_meta)
    if checkpoint_dir is not None:
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        env[ENV_CHECKPOINT_URI] = str(checkpoint_dir)
    if spec.vault_role is None:  # a job without secrets: the task gets no Vault variable at all
        return env
    env["VAULT_ADDR"] = environ["VAULT_ADDR"]
    for name in LOCAL_VAULT:
        if environ.get(name):
            env[name] = environ[name]
    return env


def local_argv(spec: FinetuneSpec) -> list[str]:
    """The container command with this machine's python and gpufleet-exec."""
    exec_name, dashdash, command, *args = exec_argv(spec)
    beside = Path(sys.executable).parent / exec_name
    wrapper = str(beside) if beside.exists() else shutil.which(exec_name)
    if wrapper is None:
        raise UserError(f"{exec_name} is not installed; run: pip install -e . (it is a console script of this repo)")
    if command in ("python", "python3"):
        command = sys.executable
    return [wrapper, dashdash, command, *args]


def run_local(spec: FinetuneSpec, meta: Mapping[str, str], *, environ: Mapping[str, str] = os.environ, keep_alloc_dir: bool = False) -> tuple[str, int]:
    """Run the task to completion; returns (the local dispatched job id, its exit code)."""
    checked = validate_meta(spec, dict(meta))
    wrapped = mint_wrapped_secret_id(spec, environ, expected_queue_seconds=0)
    job_id = f"{spec.name}/dispatch-{int(time.time())}-{secrets.token_hex(4)}"
    platform = {**platform_meta(wrapped), META_ATTEMPT: "1"}
    root = Path(tempfile.mkdtemp(prefix=f"gpufleet-{spec.name}-"))
    try:
        env = task_environment(spec, {**checked, **platform}, job_id=job_id, alloc_id=str(uuid.uuid4()), alloc_root=root, environ=environ,
                               checkpoint_dir=CHECKPOINTS_DIR / "run-local" / job_id.replace("/", "-"))
        argv = local_argv(spec)
        role = render(spec)["Job"]["Meta"].get(JOB_META_ROLE, "none: a job without secrets")
        print(f"run-local {job_id} (role {role}, alloc dir {root})", file=sys.stderr, flush=True)
        # Not subprocess.run: a SIGTERM would SIGKILL gpufleet-exec before it revokes the task's token (termination.run_to_end).
        code = run_to_end(argv, cwd=REPO_ROOT, env=env).returncode
    finally:
        if not keep_alloc_dir:
            shutil.rmtree(root, ignore_errors=True)
    return job_id, code
