"""Fleet commands: clusters, stacks, synth, check."""

from __future__ import annotations

import json
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import typer
from gpufleet.console import make_console
from gpufleet.progress import Stages
from rich.table import Table

import clusters
from clusters.derive.pools import derive_gpu_pools, total_gpus
from clusters.errors import UserError
from review.checks import checkov_warmed, run_checks

console = make_console()

ClustersDir = typer.Option(None, "--clusters-dir", help="Directory of cluster files (default: clusters/).")
Jobs = typer.Option(None, "--jobs", "-j", min=1,
                    help="Synthesis worker processes (default: GPUFLEET_SYNTH_JOBS, else the cores for 8+ clusters, else 1).")
OutDir = typer.Option(None, "--out", help="Where synthesized stacks go (default: cdktf.out in the repository root).")


def _out(out: Path | None) -> Path:
    """An explicit --out is taken as given (relative to the current directory); the default is the repository's."""
    from clusters import repo

    return out if out is not None else repo.root() / "cdktf.out"


def _configs(path: Path | None) -> tuple[clusters.ClusterConfig, ...]:
    return clusters.load_all(path)


JsonList = typer.Option(False, "--json", help="Print a JSON list instead of the table (for scripts).")


def _cluster_row(config: clusters.ClusterConfig) -> dict[str, object]:
    specs = derive_gpu_pools(config)
    low, high = total_gpus(specs)
    return {
        "cluster": config.name, "environment": config.environment.value, "scheduler": config.scheduler.value,
        "state": config.state.backend, "gpus_min": low, "gpus_max": high,
        "pools": [{"name": s.name, "machine_type": s.machine_type, "min_nodes": s.min_nodes, "max_nodes": s.max_nodes,
                   "gpus_per_node": s.gpus_per_node, "accelerator": s.accelerator} for s in specs],
        "tenants": [{"name": t.name, "gpu_quota": dict(sorted(t.gpu_quota.items()))} for t in config.tenants],
    }


def cmd_clusters(clusters_dir: Path | None = ClustersDir, as_json: bool = JsonList) -> None:
    """Show every cluster: environment, scheduler, GPU pools, GPU range, tenants and quotas."""
    if as_json:
        typer.echo(json.dumps([_cluster_row(c) for c in _configs(clusters_dir)], indent=2))
        return
    table = Table(title="gpufleet clusters")
    for column in ("cluster", "env", "scheduler", "state", "pools", "GPUs min/max", "tenants (GPU quota)"):
        table.add_column(column, overflow="fold")
    for config in _configs(clusters_dir):
        specs = derive_gpu_pools(config)
        low, high = total_gpus(specs)
        pools = "\n".join(f"{s.name}: {s.machine_type} x{s.min_nodes}-{s.max_nodes} ({s.gpus_per_node}x {s.accelerator})" for s in specs)
        tenants = "\n".join(
            f"{t.name}: " + ", ".join(f"{p}={q}" for p, q in sorted(t.gpu_quota.items())) for t in config.tenants
        )
        table.add_row(config.name, config.environment.value, config.scheduler.value, config.state.backend, pools,
                      f"{low}/{high}", tenants or "-")
    console.print(table)


def cmd_stacks(
    as_json: bool = typer.Option(False, "--json", help="Machine-readable list (CI builds its plan matrix from it)."),
    clusters_dir: Path | None = ClustersDir,
) -> None:
    """List every stack with its cluster, kind and dependencies."""
    from stacks.layout import plan_stacks

    info = plan_stacks(_configs(clusters_dir))
    if as_json:
        rows = [{"stack": s.name, "cluster": s.cluster, "kind": s.kind, "depends_on": list(s.depends_on),
                 "runs_on": list(s.runs_on), "nomad_tls": s.nomad_tls} for s in info]
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table(title="gpufleet stacks")
    for column in ("stack", "cluster", "kind", "depends on"):
        table.add_column(column, overflow="fold")
    for s in info:
        table.add_row(s.name, s.cluster, s.kind, ", ".join(s.depends_on) or "-")
    console.print(table)


def _early_workers(clusters_dir: Path | None, named: bool, jobs: int | None) -> AbstractContextManager[None]:
    """Synthesis workers started before the cluster files load (``stacks.parallel.early_workers``), when the
    whole fleet will be synthesized: no stacks named, the synthesis cache off. With the cache on, which
    clusters need a synthesis is known only from the loaded files (most often none or one), so workers
    start then, as many as those need."""
    from clusters.loader import cluster_files
    from stacks import synth_cache
    from stacks.parallel import early_workers

    if named or synth_cache.cache_dir() is not None:
        return nullcontext()
    try:
        count = len(cluster_files(clusters_dir))
    except (UserError, OSError):  # reported by the loading, in its own words
        return nullcontext()
    return early_workers(count, jobs)


def cmd_synth(
    stacks: list[str] = typer.Argument(None, help="Stacks to synthesize (default: all)."),
    out: Path | None = OutDir,
    clusters_dir: Path | None = ClustersDir,
    jobs: int | None = Jobs,
) -> None:
    """Synthesize stacks into cdktf.out atomically; a bad cluster file leaves it untouched."""
    from clusters import outputs
    from stacks.synth import synthesize

    out = _out(out)
    outputs.claim_dir(out)  # refuse `--out .` before spending a synthesis on it
    with Stages(console) as stages, _early_workers(clusters_dir, bool(stacks), jobs):
        stages.step("loading cluster files")
        configs = _configs(clusters_dir)
        stages.step(f"synthesizing {'the named' if stacks else 'every'} stack of {len(configs)} cluster(s)")
        names = synthesize(configs, out, only=tuple(stacks or ()), jobs=jobs)
    console.print(f"synthesized {len(names)} stack(s) into {out}: {', '.join(names)}")


def cmd_check(
    out: Path | None = OutDir,
    clusters_dir: Path | None = ClustersDir,
    state: list[Path] = typer.Option(None, "--state", help="`terraform show -json` state files to scan for secrets."),
    skip_checkov: bool = typer.Option(False, "--skip-checkov", help="Skip the policy scan (faster local loops)."),
) -> None:
    """Load and cross-check every file, synthesize, scan for secrets and run checkov; one summary."""
    from clusters import outputs
    from experiments.services.cost import load_prices
    from safety.secret_scan import require_state_files

    out = _out(out)
    outputs.claim_dir(out)
    require_state_files(state or ())
    # checkov's worker first: its imports run while the cluster files load (review.checks.checkov_warmed)
    with Stages(console) as stages, checkov_warmed(not skip_checkov, defer_errors=True) as warm:
        report = run_checks(_configs(clusters_dir) if clusters_dir else None, out=out, state_files=tuple(state or ()),
                            checkov=not skip_checkov, on_stage=stages.step, clusters_dir=clusters_dir, price=load_prices().price,
                            warm=warm)
    report.print(console)
    raise typer.Exit(0 if report.ok else 1)


def register(app: typer.Typer) -> None:
    app.command("clusters")(cmd_clusters)
    app.command("stacks")(cmd_stacks)
    app.command("synth")(cmd_synth)
    app.command("check")(cmd_check)
