"""``nomad.planned_from``: the scheduler stack must be planned from somewhere that reaches its Nomad API.

A plan from GitHub's hosted runners (or a Terraform Cloud workspace running locally there) of a
cluster whose API is internal fails at the provider's first request; here it fails at review,
on the line of the cluster file, with the two ways out (docs/nomad.md, "Where CI plans from").
"""

from __future__ import annotations

from collections.abc import Iterator

from clusters.derive.ci import SELF_HOSTED, internal_nomad_api
from clusters.schema import ClusterConfig, TfcState
from clusters.source import FieldPath

Finding = tuple[FieldPath, str]

FIX = ("set nomad.planned_from to {github_runner_labels: [self-hosted, <label of runners in the VPC>]}"
       " or {tfc_agent_pool: <Terraform Cloud agent pool in the VPC>}")


def planned_from(config: ClusterConfig) -> Iterator[Finding]:
    nomad = config.nomad
    if nomad is None:
        return
    at: FieldPath = ("nomad", "planned_from")
    planned = nomad.planned_from
    if planned is not None and (planned.github_runner_labels is None) == (planned.tfc_agent_pool is None):
        yield (at, "planned_from takes exactly one of github_runner_labels or tfc_agent_pool; keep one")
        return
    if planned is None:
        reason = internal_nomad_api(config)
        if reason is not None:
            yield (at, f"GitHub-hosted runners cannot reach this cluster's Nomad API: {reason}; {FIX}")
        return
    labels = planned.github_runner_labels
    # Runner labels are case-insensitive (GitHub docs, "Using labels with self-hosted runners").
    if labels is not None and SELF_HOSTED not in {label.lower() for label in labels}:
        yield ((*at, "github_runner_labels"), f"labels {list(labels)} select GitHub-hosted runners, which cannot reach the Nomad API;"
               f" allowed: a set containing {SELF_HOSTED!r}; add {SELF_HOSTED!r} and the label of your runners in the VPC")
    if planned.tfc_agent_pool is not None and not isinstance(config.state, TfcState):
        yield ((*at, "tfc_agent_pool"), f"a Terraform Cloud agent pool runs plans of Terraform Cloud workspaces, but state.backend is"
               f" {config.state.backend!r}; allowed with: state.backend tfc; set state: {{backend: tfc, organization: ...}} or use github_runner_labels")
