"""Job commands: ``gpufleet jobs render | plan | submit | dispatch | status | cancel | run-local`` (``stop``: the old name of cancel).

Job files live in ``jobs/<job>.yaml``; a job is named by its file stem. This module parses the
arguments and routes each command to the scheduler the job file (or run id) names:
``gpufleet.jobs_nomad_cmd`` or ``gpufleet.jobs_k8s_cmd``, which call ``jobs.nomad`` and
``jobs.k8s`` and print. ``render`` and ``run-local`` are scheduler-neutral and stay here.
Heavy imports (python-nomad, kubernetes, hvac) happen inside the commands so ``gpufleet --help``
stays fast.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from gpufleet.console import make_console
from rich.table import Table

if TYPE_CHECKING:
    from jobs.spec import FinetuneSpec

console = make_console()
err = make_console(stderr=True)

MetaOption = typer.Option(None, "--meta", help="Dispatch parameter key=value; repeat for each key the job declares.")
NamespaceOption = typer.Option(None, "--namespace", help="Nomad or Kubernetes namespace; default: the job file's tenant, else NOMAD_NAMESPACE.")


def _spec(job: str) -> FinetuneSpec:
    from jobs.loader import find, load

    return load(find(job))


def _is_gke(spec: FinetuneSpec) -> bool:
    from clusters.schema import SchedulerKind

    return spec.scheduler == SchedulerKind.GKE


def cmd_render(
    jobs: list[str] | None = typer.Argument(None, help="Job names (default: every jobs/*.yaml)."),
    out_dir: Path | None = typer.Option(None, "--out-dir", help="Where to write <job>.json / <job>.yaml (default jobs/out)."),
) -> None:
    """Check job files and write Nomad API JSON (`nomad job run -json`) or Kubernetes YAML (`kubectl apply -f`)."""
    from jobs.loader import find, load, load_all
    from jobs.outputs import write_rendered

    specs = [load(find(j)) for j in jobs] if jobs else list(load_all())
    table = Table(title="rendered jobs")
    for column in ("job", "cluster", "scheduler", "namespace", "pool", "GPUs", "role", "file"):
        table.add_column(column, overflow="fold")
    for spec in specs:
        path = write_rendered(spec, out_dir)
        gpus = spec.gpu.describe(free=False) + (f" x {spec.nodes} nodes" if spec.nodes > 1 else "")
        table.add_row(spec.name, spec.cluster, spec.scheduler.value, spec.namespace, spec.pool.name, gpus, spec.vault_role or "- (no secrets)", os.path.relpath(path))
    console.print(table)


def cmd_plan(job: str = typer.Argument(..., help="Job name (jobs/<job>.yaml).")) -> None:
    """Ask Nomad whether one dispatched run would be placed now; exit 1 if not."""
    spec = _spec(job)
    if _is_gke(spec):
        from gpufleet import jobs_k8s_cmd

        raise jobs_k8s_cmd.refuse_nomad_only("plan", spec)
    from gpufleet import jobs_nomad_cmd

    jobs_nomad_cmd.plan(spec)


AllowUnplaceable = typer.Option(False, "--allow-unplaceable", help="Register even if no client fits now (e.g. the pool scales up from zero).")


def cmd_register(job: str = typer.Argument(..., help="Job name (jobs/<job>.yaml)."), allow_unplaceable: bool = AllowUnplaceable) -> None:
    """Plan, then register the parameterized job (runs nothing until a dispatch; GKE: a server-side dry run)."""
    spec = _spec(job)
    if _is_gke(spec):
        from gpufleet import jobs_k8s_cmd

        return jobs_k8s_cmd.register(spec)
    from gpufleet import jobs_nomad_cmd

    jobs_nomad_cmd.register(spec, allow_unplaceable=allow_unplaceable)


def cmd_dispatch(
    job: str = typer.Argument(..., help="Job name (jobs/<job>.yaml)."),
    meta: list[str] | None = MetaOption,
    idempotency_token: str | None = typer.Option(None, "--idempotency-token", help="Reuse a token to make a retried dispatch a no-op (default: a new one)."),
    expected_queue_minutes: int | None = typer.Option(None, "--expected-queue-minutes", min=0, help="How long the run may wait for a GPU; sizes the wrap TTL (default: 20 for a pool that scales from zero, else 5)."),
) -> None:
    """Mint a wrapped secret_id (one per rank on GKE) for the job's role and dispatch one run."""
    from jobs.meta import parse_pairs, validate_meta

    spec = _spec(job)
    checked = validate_meta(spec, parse_pairs(meta or []))
    token = idempotency_token or str(uuid.uuid4())
    if _is_gke(spec):
        from gpufleet import jobs_k8s_cmd

        return jobs_k8s_cmd.dispatch(spec, checked, token, expected_queue_minutes)
    from gpufleet import jobs_nomad_cmd

    jobs_nomad_cmd.dispatch(spec, checked, token, expected_queue_minutes)


def cmd_status(
    job_id: str = typer.Argument(..., help="Dispatched job id, e.g. finetune-llama/dispatch-1733150000-1a2b3c4d."),
    namespace: str | None = NamespaceOption,
    watch: bool = typer.Option(False, "--watch", help="Refresh until the run completes, fails or is lost."),
    interval: float = typer.Option(2.0, "--interval", min=0.2, help="Seconds between refreshes with --watch."),
) -> None:
    """pending / running / complete / failed / lost, with the failing task's last event."""
    from gpufleet import jobs_k8s_cmd, jobs_nomad_cmd
    from jobs.k8s.dispatch import resolve

    gke = resolve(job_id, namespace)
    if gke is not None:
        return jobs_k8s_cmd.status(gke[0], gke[1], watch=watch, interval=interval)
    jobs_nomad_cmd.status(job_id, namespace, watch=watch, interval=interval)


JobIdArgument = typer.Argument(..., help="Job or dispatched job id.")
PurgeOption = typer.Option(False, "--purge", help="Also purge it now instead of leaving it to garbage collection.")


def cmd_cancel(job_id: str = JobIdArgument, namespace: str | None = NamespaceOption, purge: bool = PurgeOption) -> None:
    """Cancel a run (or the parameterized job); --purge removes it from Nomad at once. Same verb as `gpufleet exp cancel`."""
    from gpufleet import jobs_k8s_cmd, jobs_nomad_cmd
    from jobs.k8s.dispatch import resolve

    gke = resolve(job_id, namespace)
    if gke is not None:
        return jobs_k8s_cmd.cancel(gke[0], gke[1])
    jobs_nomad_cmd.cancel(job_id, namespace, purge=purge)


def cmd_submit_deprecated(job: str = typer.Argument(..., help="Job name (jobs/<job>.yaml)."), allow_unplaceable: bool = AllowUnplaceable) -> None:
    """The old name of `jobs register`: `submit` is the verb that runs a job (`gpufleet exp submit`), which this does not."""
    err.print("note: `gpufleet jobs submit` is now `gpufleet jobs register` (it runs nothing; `gpufleet exp submit` runs a job); `submit` still works for now")
    cmd_register(job, allow_unplaceable)


def cmd_stop_deprecated(job_id: str = JobIdArgument, namespace: str | None = NamespaceOption, purge: bool = PurgeOption) -> None:
    """The old name of `jobs cancel`, kept so scripts keep working; hidden from --help (one verb per action)."""
    err.print("note: `gpufleet jobs stop` is now `gpufleet jobs cancel` (the verb of `gpufleet exp cancel`); `stop` still works for now")
    cmd_cancel(job_id, namespace, purge)


def cmd_run_local(
    job: str = typer.Argument(..., help="Job name (jobs/<job>.yaml)."),
    meta: list[str] | None = MetaOption,
    keep_alloc_dir: bool = typer.Option(False, "--keep-alloc-dir", help="Keep the temporary alloc dir (checkpoints, logs) after the run."),
) -> None:
    """Run the task here with a Nomad-shaped env and its keys from Vault (VAULT_ADDR/VAULT_TOKEN)."""
    from jobs.local import run_local
    from jobs.meta import parse_pairs

    spec = _spec(job)
    job_id, code = run_local(spec, parse_pairs(meta or []), keep_alloc_dir=keep_alloc_dir)
    kept = "" if keep_alloc_dir else " (alloc dir removed; --keep-alloc-dir keeps it)"
    (console.print if code == 0 else err.print)(f"run-local {job_id} exited {code}{kept}")
    if code:
        raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    jobs = typer.Typer(help="The low-level path: fine-tune jobs from jobs/*.yaml straight to Nomad or GKE (render, plan, register, dispatch,"
                            " status, cancel, run-local). Day to day use `gpufleet exp`, through the control plane.", no_args_is_help=True)
    jobs.command("render")(cmd_render)
    jobs.command("plan")(cmd_plan)
    jobs.command("register")(cmd_register)
    jobs.command("submit", hidden=True)(cmd_submit_deprecated)
    jobs.command("dispatch")(cmd_dispatch)
    jobs.command("status")(cmd_status)
    jobs.command("cancel")(cmd_cancel)
    jobs.command("stop", hidden=True)(cmd_stop_deprecated)
    jobs.command("run-local")(cmd_run_local)
    app.add_typer(jobs, name="jobs")
