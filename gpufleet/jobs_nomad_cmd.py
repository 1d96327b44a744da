"""Nomad job commands: ``gpufleet jobs render | plan | submit | dispatch | status | stop | run-local``.

Job files live in ``jobs/<job>.yaml``; a job is named by its file stem. Nomad is reached
through NOMAD_ADDR / NOMAD_TOKEN / NOMAD_NAMESPACE / NOMAD_REGION / NOMAD_CACERT, Vault
(for dispatch and run-local) through VAULT_ADDR / VAULT_TOKEN. Heavy imports (python-nomad,
hvac) happen inside the commands so ``gpufleet --help`` stays fast.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from gpufleet.console import make_console
from rich.table import Table

from clusters.errors import UserError

if TYPE_CHECKING:
    from jobs.nomad.client import NomadClient
    from jobs.spec import FinetuneSpec
    from jobs.nomad.status import RunStatus

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


def _client() -> NomadClient:
    from jobs.nomad.client import NomadClient, NomadSettings

    return NomadClient(NomadSettings.from_env())


def _resolve(job_id: str, namespace: str | None) -> tuple[str, FinetuneSpec | None]:
    """Namespace and spec of a (dispatched) job id: its parent's job file if there is one."""
    from clusters import repo
    from jobs.loader import load

    parent = job_id.split("/", 1)[0]
    found = repo.root_or_none()
    path = found / "jobs" / f"{parent}.yaml" if found else None
    spec = load(path) if path is not None and path.exists() else None
    chosen = namespace or (spec.namespace if spec else None) or os.environ.get("NOMAD_NAMESPACE") or "default"
    return chosen, spec


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
        table.add_row(spec.name, spec.cluster, spec.scheduler.value, spec.namespace, spec.pool.name, gpus, spec.vault_role, os.path.relpath(path))
    console.print(table)


def cmd_plan(job: str = typer.Argument(..., help="Job name (jobs/<job>.yaml).")) -> None:
    """Ask Nomad whether one dispatched run would be placed now; exit 1 if not."""
    spec = _spec(job)
    if _is_gke(spec):
        from gpufleet import jobs_k8s_cmd

        raise jobs_k8s_cmd.refuse_nomad_only("plan", spec)
    result = _client().plan(spec)
    if result.placeable:
        console.print(f"[green]placeable[/]: a client in pool {spec.pool.name} can take {spec.gpu.describe()} (job diff: {result.diff_type})")
        return
    console.print(f"[red]not placeable now[/]: {result.reason}")
    raise typer.Exit(1)


def cmd_submit(
    job: str = typer.Argument(..., help="Job name (jobs/<job>.yaml)."),
    allow_unplaceable: bool = typer.Option(False, "--allow-unplaceable", help="Register even if no client fits now (e.g. the pool scales up from zero)."),
) -> None:
    """Plan, then register the parameterized job (runs nothing until a dispatch)."""
    spec = _spec(job)
    if _is_gke(spec):
        from gpufleet import jobs_k8s_cmd

        return jobs_k8s_cmd.submit(spec)
    client = _client()
    result = client.plan(spec)
    if not result.placeable and not allow_unplaceable:
        raise UserError(f"not submitting {spec.name}: {result.reason}; pass --allow-unplaceable if the pool will scale up")
    if not result.placeable:
        err.print(f"warning: {result.reason}")
    index = client.register(spec)
    console.print(f"registered {spec.name} in namespace {spec.namespace} (job modify index {index}); next: gpufleet jobs dispatch {spec.name} " + " ".join(f"--meta {k}=..." for k in spec.meta_required))


def _preflight(spec: FinetuneSpec) -> NomadClient:
    """Everything checkable before a single-use secret_id is minted: NOMAD_ADDR set, Nomad reachable, the job registered."""
    from jobs.nomad.client import NomadError

    if not os.environ.get("NOMAD_ADDR"):
        raise UserError("NOMAD_ADDR is not set; nothing was minted; set NOMAD_ADDR (and NOMAD_TOKEN) to your Nomad servers, e.g. https://nomad.example.com:4646")
    client = _client()
    try:
        client.status(spec.name, spec.namespace, spec)
    except NomadError as exc:
        detail = str(exc).split("; check the id printed")[0]
        raise UserError(f"not dispatching, nothing was minted: {detail}; if the job is not registered yet: gpufleet jobs submit {spec.name}") from None
    return client


def cmd_dispatch(
    job: str = typer.Argument(..., help="Job name (jobs/<job>.yaml)."),
    meta: list[str] | None = MetaOption,
    idempotency_token: str | None = typer.Option(None, "--idempotency-token", help="Reuse a token to make a retried dispatch a no-op (default: a new one)."),
    expected_queue_minutes: int | None = typer.Option(None, "--expected-queue-minutes", min=0, help="How long the run may wait for a GPU; sizes the wrap TTL (default: 20 for a pool that scales from zero, else 5)."),
) -> None:
    """Mint a wrapped secret_id (one per rank on GKE) for the job's role and dispatch one run."""
    from jobs.meta import parse_pairs, validate_meta
    from jobs.vault_mint import default_queue_seconds, mint_wrapped_secret_id

    from jobs.quota import check_tenant_quota

    spec = _spec(job)
    checked = validate_meta(spec, parse_pairs(meta or []))
    token = idempotency_token or str(uuid.uuid4())
    if _is_gke(spec):
        from gpufleet import jobs_k8s_cmd

        # Kueue enforces the tenant's per-pool quota on GKE: an over-quota run waits in its queue.
        minutes = expected_queue_minutes if expected_queue_minutes is not None else default_queue_seconds(spec.pool) // 60
        return jobs_k8s_cmd.dispatch(spec, checked, token, minutes * 60)
    client = _preflight(spec)
    # Nomad CE has no quotas: refuse here, before a secret_id is minted for a run that must not start.
    decision = check_tenant_quota(spec.tenant, pool=spec.pool.name, requested_gpus=spec.total_gpus,
                                  in_use_gpus=client.tenant_gpus_in_use(spec.namespace, spec.pool.name))
    if not decision.allowed:
        raise UserError(f"not dispatching {spec.name}: {decision.reason}")
    queue_seconds = expected_queue_minutes * 60 if expected_queue_minutes is not None else default_queue_seconds(spec.pool)
    wrapped = mint_wrapped_secret_id(spec, os.environ, expected_queue_seconds=queue_seconds)
    result = client.dispatch(spec, checked, role_id=wrapped.role_id, wrapping_token=wrapped.wrapping_token, idempotency_token=token)
    console.print(f"dispatched {result.dispatched_job_id} (namespace {result.namespace}, evaluation {result.eval_id or '-'}, idempotency token {token})")
    console.print(f"follow it: gpufleet jobs status {result.dispatched_job_id} --watch")
    source = "--expected-queue-minutes" if expected_queue_minutes is not None else f"pool {spec.pool.name}, min_nodes {spec.pool.min_nodes}"
    console.print(f"the wrapped secret_id expires in {wrapped.wrap_ttl_seconds}s (queue wait {queue_seconds // 60} min, from {source}): a run still queued then must be re-dispatched")


def _status_table(status: RunStatus) -> Table:
    colour = {"running": "cyan", "complete": "green", "failed": "red", "lost": "red"}.get(status.state.value, "yellow")
    table = Table(title=status.job_id)
    for column in ("state", "detail", "allocation", "node"):
        table.add_column(column, overflow="fold")
    table.add_row(f"[{colour}]{status.state.value}[/]", status.detail, status.alloc_id or "-", status.node or "-")
    return table


def cmd_status(
    job_id: str = typer.Argument(..., help="Dispatched job id, e.g. finetune-llama/dispatch-1733150000-1a2b3c4d."),
    namespace: str | None = NamespaceOption,
    watch: bool = typer.Option(False, "--watch", help="Refresh until the run completes, fails or is lost."),
    interval: float = typer.Option(2.0, "--interval", min=0.2, help="Seconds between refreshes with --watch."),
) -> None:
    """pending / running / complete / failed / lost, with the failing task's last event."""
    from rich.live import Live

    from gpufleet import jobs_k8s_cmd
    from jobs.nomad.status import TERMINAL

    gke = jobs_k8s_cmd.resolve(job_id, namespace)
    if gke is not None:
        return jobs_k8s_cmd.status(gke[0], gke[1], watch=watch, interval=interval)
    chosen, spec = _resolve(job_id, namespace)
    client = _client()
    status = client.status(job_id, chosen, spec)
    if not watch:
        console.print(_status_table(status))
        return
    try:
        with Live(_status_table(status), console=console, refresh_per_second=4) as live:
            while status.state not in TERMINAL:
                time.sleep(interval)
                status = client.status(job_id, chosen, spec)
                live.update(_status_table(status))
    except KeyboardInterrupt:
        err.print("stopped watching; the run goes on")


def cmd_stop(
    job_id: str = typer.Argument(..., help="Job or dispatched job id."),
    namespace: str | None = NamespaceOption,
    purge: bool = typer.Option(False, "--purge", help="Also purge it now instead of leaving it to garbage collection."),
) -> None:
    """Stop a run (or the parameterized job); --purge removes it from Nomad at once."""
    from gpufleet import jobs_k8s_cmd

    gke = jobs_k8s_cmd.resolve(job_id, namespace)
    if gke is not None:
        return jobs_k8s_cmd.stop(gke[0], gke[1])
    chosen, _ = _resolve(job_id, namespace)
    eval_id = _client().stop(job_id, chosen, purge=purge)
    console.print(f"{'stopped and purged' if purge else 'stopped'} {job_id} in namespace {chosen} (evaluation {eval_id or '-'})")


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
    jobs = typer.Typer(help="Fine-tune jobs from jobs/*.yaml on Nomad or GKE: render, plan, submit, dispatch, status, stop, run-local.", no_args_is_help=True)
    jobs.command("render")(cmd_render)
    jobs.command("plan")(cmd_plan)
    jobs.command("submit")(cmd_submit)
    jobs.command("dispatch")(cmd_dispatch)
    jobs.command("status")(cmd_status)
    jobs.command("stop")(cmd_stop)
    jobs.command("run-local")(cmd_run_local)
    app.add_typer(jobs, name="jobs")
