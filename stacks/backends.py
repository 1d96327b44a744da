"""Where each stack keeps its state, chosen by the cluster file's ``state:`` section."""

from __future__ import annotations

from cdktf import CloudBackend, GcsBackend, LocalBackend, NamedCloudWorkspace, TerraformStack

from clusters.derive import tfc_workspace
from clusters.schema import ClusterConfig, GcsState, LocalState, TfcState


def state_prefix(stack_name: str) -> str:
    return f"gpufleet/{stack_name}"


def configure_backend(stack: TerraformStack, config: ClusterConfig, stack_name: str) -> None:
    """Local state lives beside the synthesized stack (dev); remote state is one prefix or workspace per stack."""
    state = config.state
    if isinstance(state, LocalState):
        LocalBackend(stack, path=f"terraform.{stack_name}.tfstate")
    elif isinstance(state, GcsState):
        GcsBackend(stack, bucket=state.bucket, prefix=state_prefix(stack_name))
    elif isinstance(state, TfcState):
        CloudBackend(stack, organization=state.organization,
                     workspaces=NamedCloudWorkspace(tfc_workspace(config, stack_name), state.project))
    else:
        raise TypeError(f"unhandled state backend {state!r}")
