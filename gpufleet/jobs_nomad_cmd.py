"""The Nomad half of ``gpufleet jobs``: plan, register, dispatch, status [--watch], cancel.

``gpufleet.jobs_cmd`` hands a command here when the job file names a Nomad cluster, or when a
run id is not a GKE run. Nomad is reached through NOMAD_ADDR / NOMAD_TOKEN / NOMAD_NAMESPACE /
NOMAD_REGION / NOMAD_CACERT, Vault (for dispatch) through VAULT_ADDR / VAULT_TOKEN. The flow
(submit's plan-then-register rule; preflight, quota, mint, dispatch; namespace fallback) lives
in ``jobs.nomad.dispatch``, the status watch in ``jobs.nomad.status.follow``; this module
prints. Heavy imports (python-nomad, hvac) happen inside the functions so ``gpufleet --help``
stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer
from gpufleet.console import make_console
from rich.table import Table

if TYPE_CHECKING:
    from jobs.nomad.status import RunStatus
    from jobs.spec import FinetuneSpec

console = make_console()
err = make_console(stderr=True)


def plan(spec: FinetuneSpec) -> None:
    from jobs.nomad.dispatch import client

    result = client().plan(spec)
    if result.placeable:
        console.print(f"[green]placeable[/]: a client in pool {spec.pool.name} can take {spec.gpu.describe()} (job diff: {result.diff_type})")
        return
    console.print(f"[red]not placeable now[/]: {result.reason}")
    raise typer.Exit(1)


def register(spec: FinetuneSpec, *, allow_unplaceable: bool) -> None:
    from jobs.nomad import dispatch as nomad_dispatch

    done = nomad_dispatch.submit(spec, allow_unplaceable=allow_unplaceable)
    if not done.plan.placeable:
        err.print(f"warning: {done.plan.reason}")
    console.print(f"registered {spec.name} in namespace {spec.namespace} (job modify index {done.index}); next: gpufleet jobs dispatch {spec.name} " + " ".join(f"--meta {k}=..." for k in spec.meta_required))


def dispatch(spec: FinetuneSpec, meta: dict[str, str], token: str, expected_queue_minutes: int | None) -> None:
    from jobs import vault_mint
    from jobs.nomad import dispatch as nomad_dispatch

    queue_seconds = vault_mint.queue_seconds(spec.pool, expected_queue_minutes)
    done = nomad_dispatch.dispatch(spec, meta, idempotency_token=token, queue_seconds=queue_seconds)
    result = done.result
    console.print(f"dispatched {result.dispatched_job_id} (namespace {result.namespace}, evaluation {result.eval_id or '-'}, idempotency token {token})")
    console.print(f"follow it: gpufleet jobs status {result.dispatched_job_id} --watch")
    source = "--expected-queue-minutes" if expected_queue_minutes is not None else f"pool {spec.pool.name}, min_nodes {spec.pool.min_nodes}"
    if done.wrap_ttl_seconds is None:
        console.print("a job without secrets: no Vault role, nothing was minted")
        return
    console.print(f"the wrapped secret_id expires in {done.wrap_ttl_seconds}s (queue wait {queue_seconds // 60} min, from {source}): a run still queued then must be re-dispatched")


def _status_table(status: RunStatus) -> Table:
    colour = {"running": "cyan", "complete": "green", "failed": "red", "lost": "red"}.get(status.state.value, "yellow")
    table = Table(title=status.job_id)
    for column in ("state", "detail", "allocation", "node"):
        table.add_column(column, overflow="fold")
    table.add_row(f"[{colour}]{status.state.value}[/]", status.detail, status.alloc_id or "-", status.node or "-")
    return table


def status(job_id: str, namespace: str | None, *, watch: bool, interval: float) -> None:
    from rich.live import Live

    from jobs.nomad.dispatch import client, resolve
    from jobs.nomad.status import follow

    chosen, spec = resolve(job_id, namespace)
    nomad = client()
    current = nomad.status(job_id, chosen, spec)
    if not watch:
        console.print(_status_table(current))
        return
    try:
        with Live(_status_table(current), console=console, refresh_per_second=4) as live:
            for current in follow(nomad, job_id, chosen, spec, current=current, interval=interval):
                live.update(_status_table(current))
    except KeyboardInterrupt:
        err.print("stopped watching; the run goes on")


def cancel(job_id: str, namespace: str | None, *, purge: bool) -> None:
    from jobs.nomad.dispatch import client, resolve

    chosen, _ = resolve(job_id, namespace)
    eval_id = client().stop(job_id, chosen, purge=purge)
    console.print(f"{'stopped and purged' if purge else 'stopped'} {job_id} in namespace {chosen} (evaluation {eval_id or '-'})")
