"""Which stacks the fleet has, as a pure function of the cluster files (no cdktf import).

``gpufleet stacks --json`` feeds CI's plan matrix from this without starting jsii;
``build_fleet`` checks that the stacks it builds are exactly these.
"""

from __future__ import annotations

from dataclasses import dataclass

from clusters.schema import ClusterConfig


@dataclass(frozen=True)
class StackInfo:
    """One row of ``gpufleet stacks``."""

    name: str
    cluster: str
    kind: str
    depends_on: tuple[str, ...]


def plan_stacks(configs: tuple[ClusterConfig, ...]) -> tuple[StackInfo, ...]:
    """Stacks in cluster-name order: synthesis creates them in this order, so output is stable."""
    return tuple(StackInfo(c.name, c.name, "infra", ()) for c in sorted(configs, key=lambda c: c.name))
