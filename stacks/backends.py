"""Where each stack keeps its state, chosen by the cluster file's ``state:`` section."""

from __future__ import annotations

from cdktf import CloudBackend, GcsBackend, LocalBackend, NamedCloudWorkspace, TerraformStack

from clusters.derive.addresses import tfc_workspace
from clusters.schema import ClusterConfig, GcsState, LocalState, TfcState


def state_prefix(stack_name: str) -> str:
    return f"gpufleet/{stack_name}"


def local_state_path(stack_name: str) -> str:
    """Relative to the stack's working dir ``<out>/stacks/<stack>``: beside ``cdktf.out``, never in it.

    Inside ``cdktf.out`` the state would be deleted by the next synthesis, and a relative path
    that differs per stack would break the scheduler stack's ``terraform_remote_state`` read;
    every stack directory sits at the same depth, so one relative path serves both.
    """
    return f"../../../.gpufleet/state/terraform.{stack_name}.tfstate"


def configure_backend(stack: TerraformStack, config: ClusterConfig, stack_name: str) -> None:
    """Local state for dev clusters; remote state is one GCS prefix or TFC workspace per stack."""
    state = config.state
    if isinstance(state, LocalState):
        LocalBackend(stack, path=local_state_path(stack_name))
    elif isinstance(state, GcsState):
        GcsBackend(stack, bucket=state.bucket, prefix=state_prefix(stack_name))
    elif isinstance(state, TfcState):
        CloudBackend(stack, organization=state.organization,
                     workspaces=NamedCloudWorkspace(tfc_workspace(config, stack_name), state.project))
    else:
        raise TypeError(f"unhandled state backend {state!r}")
