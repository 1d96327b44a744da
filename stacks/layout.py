"""Which stacks the fleet has, as a pure function of the cluster files (no cdktf import).

``gpufleet stacks --json`` feeds CI's plan matrix from this without starting jsii;
``build_fleet`` checks that the stacks it builds are exactly these.
"""

from __future__ import annotations

from dataclasses import dataclass

from clusters.derive.ci import GITHUB_HOSTED, derive_plan_runner
from clusters.schema import ClusterConfig, TfcState

TFC_WORKSPACES_STACK = "tfc-workspaces"


@dataclass(frozen=True)
class StackInfo:
    """One row of ``gpufleet stacks``."""

    name: str
    cluster: str
    kind: str
    depends_on: tuple[str, ...]
    runs_on: tuple[str, ...] = GITHUB_HOSTED
    """Labels of the CI job that plans it (``nomad.planned_from``, ``clusters.derive.ci``)."""
    nomad_tls: bool = False
    """The CI plan job writes the Nomad CA, client certificate and key before planning it."""


def scheduler_stack_name(cluster: str) -> str:
    return f"{cluster}-scheduler"


def plan_stacks(configs: tuple[ClusterConfig, ...]) -> tuple[StackInfo, ...]:
    """Stacks in cluster-name order, infra before scheduler: synthesis creates them in this order.

    The scheduler stack configures its provider from the infra stack's outputs, so it is
    planned and applied after it.
    """
    rows: list[StackInfo] = []
    for c in sorted(configs, key=lambda c: c.name):
        needs_workspace = (TFC_WORKSPACES_STACK,) if isinstance(c.state, TfcState) else ()
        rows.append(StackInfo(c.name, c.name, "infra", needs_workspace))
        runner = derive_plan_runner(c, scheduler_stack=True)
        rows.append(StackInfo(scheduler_stack_name(c.name), c.name, "scheduler", (*needs_workspace, c.name), runner.runs_on, runner.nomad_tls))
    if any(isinstance(c.state, TfcState) for c in configs):
        # The workspaces must exist before the stacks whose state they hold; it belongs to no one cluster.
        rows.insert(0, StackInfo(TFC_WORKSPACES_STACK, "", "tfc-workspaces", ()))
    return tuple(rows)
