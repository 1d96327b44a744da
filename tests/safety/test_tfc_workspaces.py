"""Terraform Cloud workspaces: one per cluster stack on state tfc, tagged, pinned, undeletable, no credential values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import clusters
from clusters.derive.addresses import tfc_workspace
from clusters.schema import ClusterConfig
from tests.conftest import load_fleet


@pytest.fixture(scope="module")
def configs() -> tuple[ClusterConfig, ...]:
    return load_fleet()


@pytest.fixture(scope="module")
def pairs(configs: tuple[ClusterConfig, ...]) -> list[tuple[str, ClusterConfig]]:
    from stacks.layout import plan_stacks

    by_name = {c.name: c for c in configs}
    return [(s.name, by_name[s.cluster]) for s in plan_stacks(configs) if s.cluster]


@pytest.fixture(scope="module")
def synthesized(pairs: list[tuple[str, ClusterConfig]]) -> dict:
    from cdktf import Testing

    from constructs_lib.tfc_workspaces import tfc_workspaces_stack

    stack = tfc_workspaces_stack(Testing.app(), pairs)
    assert stack is not None
    return json.loads(Testing.synth(stack))


def test_one_workspace_per_tfc_cluster_stack(synthesized: dict, pairs: list[tuple[str, ClusterConfig]]) -> None:
    tfc = {stack: config for stack, config in pairs if config.state.backend == "tfc"}
    assert tfc, "the example fleet should have a cluster on state: tfc"
    workspaces = synthesized["resource"]["tfe_workspace"]
    assert sorted(workspaces) == sorted(f"workspace_{s.replace('-', '_')}" for s in tfc)
    for stack, config in tfc.items():
        ws = workspaces[f"workspace_{stack.replace('-', '_')}"]
        assert ws["name"] == tfc_workspace(config, stack)
        assert ws["tags"] == {"cluster": config.name, "environment": config.environment.value, "scheduler": config.scheduler.value}
        assert ws["terraform_version"] == "1.11.4"
        assert ws["lifecycle"] == {"prevent_destroy": True} and ws["allow_destroy_plan"] is False and ws["auto_apply"] is False
    assert len(synthesized["resource"]["tfe_workspace_settings"]) == len(tfc)


def test_credential_variable_set_has_no_values(synthesized: dict) -> None:
    variables = synthesized["resource"]["tfe_variable"].values()
    keys = {v["key"] for v in variables}
    assert {"TFC_GCP_PROVIDER_AUTH", "TFC_GCP_WORKLOAD_PROVIDER_NAME", "TFC_GCP_RUN_SERVICE_ACCOUNT_EMAIL"} <= keys
    assert "NOMAD_TOKEN" not in keys, "Nomad scheduler workspaces run locally (in CI); TFC never needs the token"
    for var in variables:
        assert var["category"] == "env"
        if var["key"] == "TFC_GCP_PROVIDER_AUTH":
            assert var["value"] == "true"
        else:
            assert var["value"] == "" and var["lifecycle"] == {"ignore_changes": ["value"]}
    assert all(v["sensitive"] for v in variables if v["key"].endswith("_TOKEN"))


def test_workspace_names_match_the_cluster_stacks_cloud_backend(fleet_out: Path, pairs: list[tuple[str, ClusterConfig]], synthesized: dict) -> None:
    names = {ws["name"] for ws in synthesized["resource"]["tfe_workspace"].values()}
    backends = set()
    for stack, config in pairs:
        if config.state.backend == "tfc":
            cloud = json.loads((fleet_out / "stacks" / stack / "cdk.tf.json").read_text())["terraform"]["cloud"]
            backends.add(cloud["workspaces"]["name"])
    assert backends == names


def test_workspace_deletion_is_refused_by_the_plan_gate() -> None:
    from safety.plan_gate import DEFAULT_PROTECTED_TYPES

    assert "tfe_workspace" in DEFAULT_PROTECTED_TYPES


def test_no_stack_when_no_cluster_uses_tfc(pairs: list[tuple[str, ClusterConfig]]) -> None:
    from cdktf import Testing

    from constructs_lib.tfc_workspaces import tfc_workspaces_stack

    assert tfc_workspaces_stack(Testing.app(), [p for p in pairs if p[1].state.backend != "tfc"]) is None


def test_the_fleet_synthesizes_the_workspaces_stack_first(stack_json) -> None:
    """build_fleet wires it in: CI plans it like any stack, before the stacks whose state it holds."""
    workspaces = stack_json("tfc-workspaces")["resource"]["tfe_workspace"]
    assert {w["name"] for w in workspaces.values()} == {"gpufleet-prod-nomad", "gpufleet-prod-nomad-scheduler"}


def test_infra_state_is_readable_by_its_scheduler_workspace_only(stack_json) -> None:
    """The scheduler stack reads the infra outputs via terraform_remote_state; TFC denies that unless the infra
    workspace names the reader. Checked on the stack the fleet actually synthesizes."""
    settings = stack_json("tfc-workspaces")["resource"]["tfe_workspace_settings"]
    infra = settings["settings_prod_nomad"]
    assert infra["remote_state_consumer_ids"] == ["${tfe_workspace.workspace_prod_nomad_scheduler.id}"]
    assert infra["global_remote_state"] is False
    scheduler = settings["settings_prod_nomad_scheduler"]
    assert "remote_state_consumer_ids" not in scheduler and scheduler["global_remote_state"] is False


def test_nomad_scheduler_workspace_runs_locally_because_its_provider_is_inside_the_vpc(stack_json) -> None:
    synthesized = stack_json("tfc-workspaces")
    modes = {name: s["execution_mode"] for name, s in synthesized["resource"]["tfe_workspace_settings"].items()}
    assert modes == {"settings_prod_nomad": "remote", "settings_prod_nomad_scheduler": "local"}
    attached = {v["workspace_id"] for v in synthesized["resource"]["tfe_workspace_variable_set"].values()}
    assert attached == {"${tfe_workspace.workspace_prod_nomad.id}"}, "credentials only where TFC runs the plan"


def test_gke_scheduler_workspace_runs_locally_and_reads_only_its_own_infra(pairs: list[tuple[str, ClusterConfig]]) -> None:
    """Pure derivation: a GKE scheduler stack's provider runs gke-gcloud-auth-plugin, which TFC's shared runners lack,
    so CI (which installs it) runs the plan; consumers never cross clusters."""
    from constructs_lib.tfc_workspaces import ExecutionMode, derive_workspaces

    tfc_state = next(c.state for _, c in pairs if c.state.backend == "tfc")
    moved = [(stack, c.model_copy(update={"state": tfc_state})) for stack, c in pairs]
    specs = {s.stack: s for s in derive_workspaces(moved)}
    assert specs["prod-gke-scheduler"].execution_mode is ExecutionMode.LOCAL
    assert specs["prod-gke"].execution_mode is ExecutionMode.REMOTE
    assert specs["prod-nomad-scheduler"].execution_mode is ExecutionMode.LOCAL
    assert {stack: s.state_consumers for stack, s in specs.items() if s.state_consumers} == {
        "dev-gke": ("dev-gke-scheduler",),
        "prod-gke": ("prod-gke-scheduler",),
        "prod-nomad": ("prod-nomad-scheduler",),
        "train-a3mega": ("train-a3mega-scheduler",),
    }
