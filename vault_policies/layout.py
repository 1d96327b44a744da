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

# The sync marks every policy it writes with this first line, and keeps the names of the
# roles it wrote in one KV record, so that prune never deletes what someone else wrote.
MANAGED_MARKER = "# managed-by: gpufleet"
MANAGED_RECORD_PATH = "gpufleet/managed"

# Wrap TTL bounds for secret_ids; orchestrator.hcl states the same values as
# min_wrapping_ttl / max_wrapping_ttl so Vault itself refuses anything outside them.
# The minimum covers a dispatch round trip; the maximum is the longest queue wait we
# accept before the task must be re-dispatched (roles' secret_id_ttl must cover it).
MIN_WRAP_TTL_SECONDS = 60
MAX_WRAP_TTL_SECONDS = 6 * 3600

ORCHESTRATOR_POLICY = "orchestrator"
ADMIN_POLICY = "gpufleet-admin"

# The task environment contract between the jobs layer (which renders it) and gpufleet-exec /
# vault_policies.client (which read it). Defined here, and only here, because both sides and
# the training image import this stdlib-only module.
ENV_ROLE_ID = "GPUFLEET_VAULT_ROLE_ID"
ENV_WRAPPED_SECRET_ID = "GPUFLEET_VAULT_WRAPPED_SECRET_ID"
ENV_SECRETS = "GPUFLEET_SECRETS"
# The job's max_run_hours in seconds, and how long gpufleet-exec waits after SIGTERM before
# SIGKILL (the job's kill_timeout): Nomad clients before 2.0.3 ignore MaxRunDuration.
ENV_MAX_RUN_SECONDS = "GPUFLEET_MAX_RUN_SECONDS"
ENV_KILL_GRACE_SECONDS = "GPUFLEET_KILL_GRACE_SECONDS"
# Dispatch meta keys carrying the role_id and the wrapping token; Nomad also exposes each
# as NOMAD_META_<key> (as given and upper-cased).
META_ROLE_ID = "gpufleet_vault_role_id"
META_WRAPPED_SECRET_ID = "gpufleet_vault_wrapped_secret_id"
