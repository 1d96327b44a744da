"""Fleet commands: clusters, stacks, synth, check."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

import clusters
from clusters.derive import derive_gpu_pools, total_gpus

console = Console()


def _clusters_dir(path: Path | None) -> Path:
    return path if path is not None else clusters.CLUSTERS_DIR


def cmd_clusters(
    clusters_dir: Path | None = typer.Option(None, "--clusters-dir", help="Directory of cluster files."),
) -> None:
    """Show every cluster: environment, scheduler, GPU pools, GPU range, tenants and quotas."""
    configs = clusters.load_all(_clusters_dir(clusters_dir))
    table = Table(title="gpufleet clusters")
    for column in ("cluster", "env", "scheduler", "state", "pools", "GPUs min/max", "tenants (GPU quota)"):
        table.add_column(column)
    for config in configs:
        specs = derive_gpu_pools(config)
        low, high = total_gpus(specs)
        pools = "\n".join(f"{s.name}: {s.machine_type} x{s.min_nodes}-{s.max_nodes} ({s.gpus_per_node}x {s.accelerator})" for s in specs)
        tenants = "\n".join(
            f"{t.name}: " + ", ".join(f"{p}={q}" for p, q in sorted(t.gpu_quota.items())) for t in config.tenants
        )
        table.add_row(config.name, config.environment.value, config.scheduler.value, config.state.backend, pools, f"{low}/{high}", tenants or "-")
    console.print(table)


def register(app: typer.Typer) -> None:
    app.command("clusters")(cmd_clusters)
