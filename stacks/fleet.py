"""Composition: which stacks each cluster file yields."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cdktf import App, TerraformStack

from clusters.schema import ClusterConfig, SchedulerKind
from constructs_lib.tfc_workspaces import tfc_workspaces_stack
from stacks.imported import apply_imports, load_imports
from stacks.infra import ClusterStack
from stacks.layout import StackInfo, plan_stacks
from stacks.scheduler import GkeSchedulerStack, NomadSchedulerStack


@dataclass(frozen=True)
class Fleet:
    stacks: dict[str, TerraformStack]
    info: tuple[StackInfo, ...]


def build_fleet(app: App, configs: tuple[ClusterConfig, ...], *, imported_dir: Path | None = None,
                only: tuple[str, ...] | None = None) -> Fleet:
    """Build every stack ``plan_stacks`` names, in its order, so synthesis is byte-identical run to run.

    ``only`` builds just those stacks (a parallel worker's share, ``stacks.parallel``); it must hold
    whole clusters, since a scheduler stack references its infra stack.
    """
    fleet_info = plan_stacks(configs)
    info = fleet_info if only is None else tuple(s for s in fleet_info if s.name in only)
    by_name = {c.name: c for c in configs}
    stacks: dict[str, TerraformStack] = {}
    for entry in info:
        if entry.kind == "tfc-workspaces":
            tfc = tfc_workspaces_stack(app, [(s.name, by_name[s.cluster]) for s in fleet_info if s.cluster])
            if tfc is not None:
                stacks[entry.name] = tfc
            continue
        config = by_name[entry.cluster]
        if entry.kind == "infra":
            stacks[entry.name] = ClusterStack(app, config)
        elif entry.kind == "scheduler":
            scheduler = GkeSchedulerStack if config.scheduler == SchedulerKind.GKE else NomadSchedulerStack
            stacks[entry.name] = scheduler(app, config, stacks[entry.cluster])
    for name, stack in stacks.items():
        apply_imports(stack, load_imports(name, imported_dir=imported_dir))
    missing = [s.name for s in info if s.name not in stacks]
    if missing:
        raise RuntimeError(f"stacks.layout names stacks build_fleet does not build: {missing}")
    return Fleet(stacks, info)
