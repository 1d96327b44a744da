"""Terraform Cloud workspaces for every cluster stack on ``state: tfc``, declared from the cluster files.

A workspace holds a cluster's state: deleting it orphans a GPU fleet, so workspaces are
``prevent_destroy``, refuse destroy plans and never auto-apply. Names come from
``clusters.derive.addresses.tfc_workspace``, the same function the stacks' ``CloudBackend`` uses, so a
stack and its workspace cannot drift apart. Provider credentials live in one variable set per
organization: GCP through dynamic (workload identity) credentials, so no key exists at all; the
remaining tokens are declared here (key, category, sensitive) but their values are set by an
administrator in Terraform Cloud. ``ignore_changes = [value]`` keeps the empty placeholder in
this repo and in state: no credential value is ever written by gpufleet.

State sharing: a cluster's other stacks (its scheduler stack) read the infra stack's outputs
through ``terraform_remote_state``, so each infra workspace names exactly those workspaces in
``remote_state_consumer_ids`` and keeps ``global_remote_state`` off: no other workspace of the
organization can read a cluster's state.

Execution mode: infra stacks run ``remote`` (TFC's shared runners); every scheduler stack runs
``local`` unless its cluster file names a TFC agent pool (``nomad.planned_from.tfc_agent_pool``).
A Nomad scheduler stack's provider talks to the servers' internal load balancer
inside the VPC, which shared runners cannot reach: it is planned in CI on the self-hosted runners
the file names, or on that agent pool (``agent`` mode, the pool found by name through the
``tfe_agent_pool`` data source; terraform-provider-tfe v0.71.0
``internal/provider/resource_tfe_workspace_settings.go:300-316``: ``execution_mode`` one of
agent/local/remote, ``agent_pool_id`` required exactly when it is agent, ``:109-115``). An agent run
starts with a clean environment (HCP Terraform docs, "Install and run agents"), so such a workspace
gets its own env variables: ``NOMAD_CACERT``/``NOMAD_CLIENT_CERT``/``NOMAD_CLIENT_KEY`` naming files
the agent host holds (``AGENT_TLS_DIR``; paths, not secrets) and ``NOMAD_TOKEN``, sensitive, its
value set by an administrator. A GKE scheduler stack reaches the cluster
over its DNS endpoint, but its kubernetes provider authenticates by running
``gke-gcloud-auth-plugin``, which shared runners do not have (and a ``google_client_config``
token instead would land in state). So those plans run in CI, which installs the plugin
(``.github/workflows/plan.yml``, ``drift.yml``), and the workspace only stores state. An
That is also why the credentials variable set is attached to remote workspaces
only and holds no Nomad token: a local-execution workspace never reads it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from cdktf import CloudBackend, NamedCloudWorkspace, TerraformResourceLifecycle, TerraformStack
from constructs import Construct

from clusters.derive.addresses import tfc_workspace
from clusters.derive.ci import derive_plan_runner
from clusters.schema import ClusterConfig, TfcState
from constructs_lib.naming import pin, tf_id
from constructs_lib.providers import tfe

TERRAFORM_VERSION = "1.11.4"
STACK_NAME = "tfc-workspaces"
BOOTSTRAP_WORKSPACE = "gpufleet-tfc-workspaces"
VARIABLE_SET_NAME = "gpufleet-provider-credentials"


@dataclass(frozen=True)
class CredentialVariable:
    key: str
    sensitive: bool
    description: str
    value: str = ""
    admin_set: bool = True


GCP_DYNAMIC_CREDENTIALS = (
    CredentialVariable("TFC_GCP_PROVIDER_AUTH", False, "GCP dynamic credentials: runs get short-lived tokens, no key", "true", admin_set=False),
    CredentialVariable("TFC_GCP_WORKLOAD_PROVIDER_NAME", False, "Workload identity provider resource name; set in Terraform Cloud"),
    CredentialVariable("TFC_GCP_RUN_SERVICE_ACCOUNT_EMAIL", False, "Service account the runs impersonate; set in Terraform Cloud"),
)
CLOUDFLARE_TOKEN = CredentialVariable("CLOUDFLARE_API_TOKEN", True, "Cloudflare DNS edit token; set in Terraform Cloud, never in the repo")


class ExecutionMode(StrEnum):
    REMOTE = "remote"
    LOCAL = "local"
    AGENT = "agent"


# Where an agent host keeps a cluster's Nomad mTLS files (docs/nomad.md, "Where CI plans from").
AGENT_TLS_DIR = "/etc/gpufleet/nomad"


def agent_variables(cluster: str) -> tuple[CredentialVariable, ...]:
    """A Nomad scheduler workspace's env variables on an agent pool: the provider's file defaults
    (terraform-provider-nomad v2.5.2 ``nomad/provider.go:44-75``) and its token (``:86``, NOMAD_TOKEN)."""
    base = f"{AGENT_TLS_DIR}/{cluster}"
    return (
        CredentialVariable("NOMAD_CACERT", False, "Nomad CA on the agent host", f"{base}/ca.pem", admin_set=False),
        CredentialVariable("NOMAD_CLIENT_CERT", False, "Nomad client certificate on the agent host", f"{base}/client.pem", admin_set=False),
        CredentialVariable("NOMAD_CLIENT_KEY", False, "Nomad client key on the agent host (mode 0600)", f"{base}/client-key.pem", admin_set=False),
        CredentialVariable("NOMAD_TOKEN", True, "Nomad ACL token that may plan this stack; set in Terraform Cloud, never in the repo"),
    )


@dataclass(frozen=True)
class WorkspaceSpec:
    name: str
    stack: str
    organization: str
    project: str | None
    tags: tuple[tuple[str, str], ...]
    execution_mode: ExecutionMode
    state_consumers: tuple[str, ...]
    """Stacks whose workspaces may read this workspace's state (``terraform_remote_state``)."""
    agent_pool: str | None = None
    """The agent pool's name when ``execution_mode`` is agent."""
    cluster: str = ""


def derive_workspaces(stacks: Iterable[tuple[str, ClusterConfig]]) -> tuple[WorkspaceSpec, ...]:
    """One workspace per (stack, cluster) whose cluster keeps state in Terraform Cloud, in stack-name order.

    The stack named like its cluster is the infra stack; every other stack of that cluster
    reads its state, so those are its consumers. See the module docstring for execution modes.
    """
    pairs = sorted(stacks, key=lambda pair: pair[0])
    specs = []
    for stack, config in pairs:
        state = config.state
        if not isinstance(state, TfcState):
            continue
        infra = stack == config.name
        consumers = tuple(s for s, c in pairs if c.name == config.name and s != stack) if infra else ()
        pool = None if infra else derive_plan_runner(config, scheduler_stack=True).tfc_agent_pool
        mode = ExecutionMode.REMOTE if infra else ExecutionMode.AGENT if pool else ExecutionMode.LOCAL
        tags = (("cluster", config.name), ("environment", config.environment.value), ("scheduler", config.scheduler.value))
        specs.append(WorkspaceSpec(tfc_workspace(config, stack), stack, state.organization, state.project, tags, mode, consumers,
                                   pool, config.name))
    return tuple(specs)


def credential_variables(configs: Iterable[ClusterConfig]) -> tuple[CredentialVariable, ...]:
    """The variable set's keys: GCP always, Cloudflare when a cluster has DNS records (its infra stack runs remotely)."""
    configs = tuple(configs)
    extra = [CLOUDFLARE_TOKEN] if any(c.dns is not None for c in configs) else []
    return (*GCP_DYNAMIC_CREDENTIALS, *extra)


class TfcWorkspaces(Construct):
    """Workspaces, their settings and the credentials variable set, for one or more organizations."""

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        workspaces: tuple[WorkspaceSpec, ...],
        variables: tuple[CredentialVariable, ...],
        terraform_version: str = TERRAFORM_VERSION,
    ) -> None:
        super().__init__(scope, id_)
        self.workspaces: dict[str, tfe.workspace.Workspace] = {}
        self.variable_sets: dict[str, tfe.variable_set.VariableSet] = {}
        projects: dict[tuple[str, str], tfe.data_tfe_project.DataTfeProject] = {}
        for org in sorted({w.organization for w in workspaces}):
            self.variable_sets[org] = self._variable_set(org, variables)
        for spec in workspaces:
            project_id = None
            if spec.project:
                key = (spec.organization, spec.project)
                if key not in projects:
                    projects[key] = pin(
                        tfe.data_tfe_project.DataTfeProject(self, f"project-{tf_id(spec.organization)}-{tf_id(spec.project)}", name=spec.project, organization=spec.organization),
                        f"project_{spec.organization}_{spec.project}",
                    )
                project_id = projects[key].id
            workspace = pin(
                tfe.workspace.Workspace(
                    self,
                    f"workspace-{spec.stack}",
                    name=spec.name,
                    organization=spec.organization,
                    project_id=project_id,
                    description=f"gpufleet stack {spec.stack}; managed from clusters/{dict(spec.tags)['cluster']}.yaml",
                    tags=dict(spec.tags),
                    terraform_version=terraform_version,
                    auto_apply=False,
                    allow_destroy_plan=False,
                    force_delete=False,
                    queue_all_runs=False,
                    lifecycle=TerraformResourceLifecycle(prevent_destroy=True),
                ),
                f"workspace_{spec.stack}",
            )
            self.workspaces[spec.stack] = workspace
            if spec.execution_mode is ExecutionMode.REMOTE:
                pin(
                    tfe.workspace_variable_set.WorkspaceVariableSet(
                        self, f"credentials-{spec.stack}", variable_set_id=self.variable_sets[spec.organization].id, workspace_id=workspace.id
                    ),
                    f"credentials_{spec.stack}",
                )
        pools: dict[tuple[str, str], tfe.data_tfe_agent_pool.DataTfeAgentPool] = {}
        for spec in workspaces:
            agent_pool_id = None
            if spec.execution_mode is ExecutionMode.AGENT and spec.agent_pool:
                key = (spec.organization, spec.agent_pool)
                if key not in pools:
                    pools[key] = pin(tfe.data_tfe_agent_pool.DataTfeAgentPool(
                        self, f"agent-pool-{tf_id(spec.organization)}-{tf_id(spec.agent_pool)}", name=spec.agent_pool, organization=spec.organization,
                    ), f"agent_pool_{spec.organization}_{spec.agent_pool}")
                agent_pool_id = pools[key].id
                for var in agent_variables(spec.cluster):
                    self._variable(f"var-{spec.stack}-{var.key}", f"var_{spec.stack}_{var.key.lower()}", var,
                                   workspace_id=self.workspaces[spec.stack].id)
            pin(
                tfe.workspace_settings.WorkspaceSettings(
                    self,
                    f"settings-{spec.stack}",
                    workspace_id=self.workspaces[spec.stack].id,
                    execution_mode=spec.execution_mode.value,
                    agent_pool_id=agent_pool_id,
                    global_remote_state=False,
                    remote_state_consumer_ids=[self.workspaces[s].id for s in spec.state_consumers] or None,
                ),
                f"settings_{spec.stack}",
            )

    def _variable_set(self, org: str, variables: tuple[CredentialVariable, ...]) -> tfe.variable_set.VariableSet:
        varset = pin(
            tfe.variable_set.VariableSet(
                self, f"varset-{org}", name=VARIABLE_SET_NAME, organization=org,
                description="Provider credentials for gpufleet stacks; values are set in Terraform Cloud, never in the repo",
            ),
            f"credentials_{org}",
        )
        for var in variables:
            self._variable(f"var-{org}-{var.key}", f"var_{org}_{var.key.lower()}", var, variable_set_id=varset.id)
        return varset

    def _variable(self, id_: str, address: str, var: CredentialVariable, **owner: object) -> tfe.variable.Variable:
        """An env variable of a variable set or a workspace; an admin-set value is never written by gpufleet."""
        return pin(
            tfe.variable.Variable(
                self, id_, key=var.key, value=var.value, category="env", sensitive=var.sensitive, description=var.description,
                lifecycle=TerraformResourceLifecycle(ignore_changes=["value"]) if var.admin_set else None, **owner,
            ),
            address,
        )


def tfc_workspaces_stack(app: Construct, stacks: Iterable[tuple[str, ClusterConfig]]) -> TerraformStack | None:
    """The ``tfc-workspaces`` stack, or None when no cluster keeps state in Terraform Cloud.

    Its own state lives in a bootstrap workspace (created once by hand, execution mode local)
    in the first organization: it cannot manage the workspace that holds its own state.
    """
    pairs = tuple(stacks)
    specs = derive_workspaces(pairs)
    if not specs:
        return None
    stack = TerraformStack(app, STACK_NAME)
    tfe.provider.TfeProvider(stack, "tfe")
    CloudBackend(stack, organization=min(s.organization for s in specs), workspaces=NamedCloudWorkspace(BOOTSTRAP_WORKSPACE))
    configs = {c.name: c for _, c in pairs if isinstance(c.state, TfcState)}
    TfcWorkspaces(stack, "tfc", workspaces=specs, variables=credential_variables(configs[k] for k in sorted(configs)))
    return stack
