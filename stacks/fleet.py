"""Composition: which stacks each cluster file yields."""

from __future__ import annotations

from dataclasses import dataclass

from cdktf import App, TerraformStack

from clusters.schema import ClusterConfig
from stacks.infra import ClusterStack


@dataclass(frozen=True)
class StackInfo:
    """One row of ``gpufleet stacks``: CI builds its plan matrix from these."""

    name: str
    cluster: str
    kind: str
    depends_on: tuple[str, ...]


@dataclass(frozen=True)
class Fleet:
    stacks: dict[str, TerraformStack]
    info: tuple[StackInfo, ...]


def build_fleet(app: App, configs: tuple[ClusterConfig, ...]) -> Fleet:
    """Stacks are created in cluster-name order so synthesis is byte-identical run to run."""
    stacks: dict[str, TerraformStack] = {}
    info: list[StackInfo] = []
    for config in sorted(configs, key=lambda c: c.name):
        infra = ClusterStack(app, config)
        stacks[config.name] = infra
        info.append(StackInfo(config.name, config.name, "infra", ()))
    return Fleet(stacks, tuple(info))
