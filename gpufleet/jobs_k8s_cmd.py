"""The Kubernetes (GKE) half of ``gpufleet jobs``: register (server-side dry run), dispatch, status [--watch], cancel.

``gpufleet.jobs_cmd`` hands a command here when the job file names a GKE cluster, or when a
run id is ``<job>-<10 hex>`` of a GKE job file (what dispatch prints). The Kubernetes API is
reached through KUBECONFIG / GPUFLEET_KUBE_CONTEXT (or the in-cluster service account), Vault
through VAULT_ADDR / VAULT_TOKEN, as for Nomad. The per-rank mint and the run-id lookup live in
``jobs.k8s.dispatch``, the status watch in ``jobs.k8s.status.follow``; this module prints.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpufleet.console import make_console
from rich.table import Table

from clusters.errors import UserError

if TYPE_CHECKING:
    from jobs.k8s.client import K8sClient
    from jobs.k8s.status import K8sRunStatus
    from jobs.spec import FinetuneSpec

console = make_console()
err = make_console(stderr=True)


def client() -> K8sClient:
    from jobs.k8s.dispatch import client as make_client

    return make_client()


def register(spec: FinetuneSpec) -> None:
    """Nothing is registered on GKE (each dispatch creates its own Job); check instead that the
    cluster would take one: the LocalQueue exists and the API server (with Kueue's webhooks)
    accepts the Job in a server-side dry run."""
    result = client().dry_run(spec)
    console.print(f"GKE accepts {spec.name} in namespace {spec.namespace} (dry run of Job {result}, LocalQueue {spec.gke.local_queue if spec.gke else '-'}); "
                  f"nothing to register: next: gpufleet jobs dispatch {spec.name} " + " ".join(f"--meta {k}=..." for k in spec.meta_required))


def dispatch(spec: FinetuneSpec, meta: dict[str, str], dispatch_id: str, expected_queue_minutes: int | None) -> None:
    from jobs import vault_mint
    from jobs.k8s import dispatch as k8s_dispatch

    # Kueue enforces the tenant's per-pool quota on GKE: an over-quota run waits in its queue.
    queue_seconds = vault_mint.queue_seconds(spec.pool, expected_queue_minutes)
    done = k8s_dispatch.dispatch(spec, meta, dispatch_id=dispatch_id, queue_seconds=queue_seconds)
    result = done.result
    verb = "dispatched" if result.created else "already dispatched (same --idempotency-token)"
    console.print(f"{verb} {result.run} (namespace {result.namespace}, {spec.nodes} rank(s), LocalQueue {spec.gke.local_queue if spec.gke else '-'}, idempotency token {dispatch_id})")
    console.print(f"follow it: gpufleet jobs status {result.run} --watch")
    if done.wrap_ttl_seconds is not None:
        console.print(f"the wrapped secret_ids expire in {done.wrap_ttl_seconds}s: a run Kueue has not admitted by then must be stopped and re-dispatched")


def _table(status: K8sRunStatus) -> Table:
    colour = {"running": "cyan", "succeeded": "green", "failed": "red", "stopped": "magenta"}.get(status.state.value, "yellow")
    table = Table(title=status.run)
    for column in ("state", "reason", "cluster queue", "flavor"):
        table.add_column(column)
    table.add_row(f"[{colour}]{status.state.value}[/]", status.reason, status.queue or "-", status.flavor or "-")
    return table


def status(namespace: str, run: str, *, watch: bool, interval: float) -> None:
    from rich.live import Live

    from jobs.k8s.status import follow

    api = client()
    current = api.status(namespace, run)
    if not watch:
        console.print(_table(current))
        return
    try:
        with Live(_table(current), console=console, refresh_per_second=4) as live:
            for current in follow(api, namespace, run, current=current, interval=interval):
                live.update(_table(current))
    except KeyboardInterrupt:
        err.print("stopped watching; the run goes on")


def cancel(namespace: str, run: str) -> None:
    client().stop(namespace, run)
    console.print(f"stopping {run} in namespace {namespace}: its Job is deleted in the foreground (pods get their grace period); its Secret and Service go with it")


def refuse_nomad_only(command: str, spec: FinetuneSpec) -> UserError:
    return UserError(f"{command} is Nomad's; {spec.name} runs on GKE cluster {spec.cluster}: use gpufleet jobs register (a dry run) or dispatch")
