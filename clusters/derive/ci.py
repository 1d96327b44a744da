"""Where CI plans each stack from: the runner labels of its plan job, whether that job needs the
Nomad mTLS files, and the Terraform Cloud agent pool of its workspace.

Pure derivations from a validated ClusterConfig (``nomad.planned_from``). ``gpufleet stacks --json``
carries them into CI's plan matrix (``.github/workflows/plan.yml``); ``constructs_lib.tfc_workspaces``
reads the agent pool. Nothing here knows cdktf.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from clusters.schema import ClusterConfig

# GitHub-hosted Linux runners: the public internet, no route into a VPC.
GITHUB_HOSTED = ("ubuntu-latest",)
# A label set without it selects GitHub-hosted runners (GitHub docs, "Choosing the runner for a job":
# self-hosted runners carry the default label 'self-hosted', GitHub-hosted ones never do).
SELF_HOSTED = "self-hosted"


@dataclass(frozen=True)
class PlanRunnerSpec:
    """How one stack is planned. ``runs_on``: the labels of the CI plan job (GitHub-hosted unless
    the cluster file names self-hosted runners). ``nomad_tls``: the job writes the Nomad CA, client
    certificate and key from CI secrets before the plan (terraform runs on the runner itself).
    ``tfc_agent_pool``: the stack's TFC workspace runs in ``agent`` mode on this pool, so terraform
    runs on the agent and the CI job only starts the run and reads its plan."""

    runs_on: tuple[str, ...]
    nomad_tls: bool
    tfc_agent_pool: str | None


def derive_plan_runner(config: ClusterConfig, *, scheduler_stack: bool) -> PlanRunnerSpec:
    """Only a Nomad cluster's scheduler stack talks to a private API; every other stack talks to
    Google's, Cloudflare's or GKE's public endpoints and keeps GitHub-hosted runners."""
    planned = config.nomad.planned_from if config.nomad is not None and scheduler_stack else None
    if planned is not None and planned.github_runner_labels:
        return PlanRunnerSpec(tuple(planned.github_runner_labels), True, None)
    if planned is not None and planned.tfc_agent_pool:
        return PlanRunnerSpec(GITHUB_HOSTED, False, planned.tfc_agent_pool)
    return PlanRunnerSpec(GITHUB_HOSTED, config.nomad is not None and scheduler_stack, None)


def internal_nomad_api(config: ClusterConfig) -> str | None:
    """Why the cluster's Nomad API is reachable only from inside its network, or None when gpufleet
    cannot tell (existing servers named by a public address or a hostname).

    Servers gpufleet creates sit behind an internal TCP load balancer (``constructs_lib.nomad_servers``,
    ``load_balancing_scheme = "INTERNAL"``), whose name lives only in a private DNS zone; existing
    servers named by a private address, or found by cloud auto-join (which lists VPC instances),
    are internal too."""
    nomad = config.nomad
    if nomad is None:
        return None
    if not nomad.existing_servers:
        return "its API is the Nomad servers' internal load balancer (a private address, named only in a private DNS zone)"
    first = nomad.existing_servers[0]
    if first.startswith("provider="):
        return f"its servers are found by cloud auto-join ({first!r}), which yields their VPC addresses"
    host = first.rsplit(":", 1)[0]
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    return None if address.is_global else f"its first server {first!r} is not a public address"
