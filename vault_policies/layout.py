"""Where gpufleet's objects live in Vault, shared by the sync, the orchestrator and the task client.

Standard library only: ``vault_policies.client`` imports this inside training images.
The mounts are fixed rather than configurable because the task environment contract
(``GPUFLEET_SECRETS=ENV=ml-api-keys/<name>#key``) names paths relative to them.
"""

from __future__ import annotations

KV_MOUNT = "secret"
APPROLE_MOUNT = "approle"
API_KEYS_PREFIX = "ml-api-keys/"
API_KEYS_POLICY_PREFIX = f"{KV_MOUNT}/data/{API_KEYS_PREFIX}"

# The sync marks every policy it writes with this first line. What gpufleet owns is decided
# by names, never by a record the sync token could edit: job policies carry the prefix
# below (gpufleet-admin may write only those), roles are the ones roles.yaml names.
MANAGED_MARKER = "# managed-by: gpufleet"
JOB_POLICY_PREFIX = "ml-keys-"
# Vault's built-in policies: attached to every token (default) or all-powerful (root).
BUILTIN_POLICIES = ("default", "root")

# Wrap TTL bounds for secret_ids; orchestrator.hcl states the same values as
# min_wrapping_ttl / max_wrapping_ttl so Vault itself refuses anything outside them.
# The minimum covers a dispatch round trip; the maximum is the longest queue wait we
# accept before the task must be re-dispatched (roles' secret_id_ttl must cover it).
# A role's secret_id_ttl may not exceed the maximum: a secret_id outliving its wrap is only
# useful to whoever unwrapped it.
MIN_WRAP_TTL_SECONDS = 60
MAX_WRAP_TTL_SECONDS = 30 * 60

# Local development (gpufleet dev up, the tests' OpenBao) runs tasks on this host: roles
# applied there are also bound to the loopback address; real Vaults never get it.
LOOPBACK_CIDR = "127.0.0.1/32"

ORCHESTRATOR_POLICY = "orchestrator"
ADMIN_POLICY = "gpufleet-admin"
OPERATOR_POLICIES = (ADMIN_POLICY, ORCHESTRATOR_POLICY)

# The task environment contract between the jobs layer (which renders it) and gpufleet-exec /
# vault_policies.client (which read it). Defined here, and only here, because both sides and
# the training image import this stdlib-only module.
ENV_ROLE = "GPUFLEET_VAULT_ROLE"
ENV_ROLE_ID = "GPUFLEET_VAULT_ROLE_ID"
ENV_WRAPPED_SECRET_ID = "GPUFLEET_VAULT_WRAPPED_SECRET_ID"
# On Kubernetes the wrapping token is a file from the run's Secret (one per rank), never an
# environment variable of the pod spec; gpufleet-exec reads it when ENV_WRAPPED_SECRET_ID is unset.
ENV_WRAPPED_SECRET_ID_FILE = "GPUFLEET_VAULT_WRAPPED_SECRET_ID_FILE"
ENV_SECRETS = "GPUFLEET_SECRETS"
# Set to "1" for a job without ``secrets:``: gpufleet-exec then never talks to Vault (there is no
# role and no wrap to spend) and only enforces the run limit and forwards signals. Explicit, so a
# job with keys whose Vault variables went missing still fails as a malformed environment.
ENV_NO_VAULT = "GPUFLEET_NO_VAULT"
# The job's max_run_hours in seconds, and how long gpufleet-exec waits after SIGTERM before
# SIGKILL (the job's kill_timeout): Nomad clients before 2.0.3 ignore MaxRunDuration.
ENV_MAX_RUN_SECONDS = "GPUFLEET_MAX_RUN_SECONDS"
ENV_KILL_GRACE_SECONDS = "GPUFLEET_KILL_GRACE_SECONDS"
# What is left of the experiment's deadline when its run was dispatched, in seconds (dispatch meta
# jobs.spec.RUN_DEADLINE_META on Nomad, a plain value on GKE and locally). gpufleet-exec stops the
# command at the smaller of this and ENV_MAX_RUN_SECONDS; empty, unset or left uninterpolated (a
# dispatch without the meta key) it falls back to ENV_MAX_RUN_SECONDS alone.
ENV_RUN_DEADLINE_SECONDS = "GPUFLEET_RUN_DEADLINE_SECONDS"
# Dispatch meta keys carrying the role_id and the wrapping token; Nomad also exposes each
# as NOMAD_META_<key> (as given and upper-cased).
META_ROLE_ID = "gpufleet_vault_role_id"
META_WRAPPED_SECRET_ID = "gpufleet_vault_wrapped_secret_id"
# Which attempt of an experiment a task is (1, 2, ...): dispatch meta on Nomad, an env value on GKE
# and locally; the task sees GPUFLEET_ATTEMPT (experiments.background.reconcile retries, issue 25).
META_ATTEMPT = "gpufleet_attempt"
ENV_ATTEMPT = "GPUFLEET_ATTEMPT"
# The exit code a trainer or its health check uses to say "a GPU/hardware fault (an XID), not my
# code": gpufleet-exec passes it through, and the control plane counts it as an infrastructure
# failure and retries. 75 is EX_TEMPFAIL (sysexits.h: "a temporary failure ... the user is invited
# to retry"); no other gpufleet-exec code uses it.
EXIT_HARDWARE = 75
