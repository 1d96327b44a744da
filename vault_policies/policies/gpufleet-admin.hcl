# What `gpufleet vault apply|prune` needs, and no more: it manages mounts, policies and
# role definitions, but cannot mint secret_ids or read API keys.
path "sys/auth" {
  capabilities = ["read"]
}

# Enabling an auth method is a sudo operation in Vault.
path "sys/auth/approle" {
  capabilities = ["create", "update", "read", "sudo"]
}

path "sys/mounts" {
  capabilities = ["read"]
}

path "sys/mounts/secret" {
  capabilities = ["create", "update", "read"]
}

path "sys/policies/acl" {
  capabilities = ["list"]
}

path "sys/policies/acl/*" {
  capabilities = ["create", "read", "update", "delete"]
}

# Without these the admin token could rewrite its own policy (or the orchestrator's) into
# anything, which makes it root. Deny wins over the glob above; an operator with a root
# token writes these two policies (gpufleet vault apply shows them as "skip" otherwise).
path "sys/policies/acl/gpufleet-admin" {
  capabilities = ["deny"]
}

path "sys/policies/acl/orchestrator" {
  capabilities = ["deny"]
}

path "auth/approle/role" {
  capabilities = ["list"]
}

path "auth/approle/role/+" {
  capabilities = ["create", "read", "update", "delete"]
}

# The record of which roles gpufleet wrote, so prune spares everyone else's.
path "secret/data/gpufleet/managed" {
  capabilities = ["create", "read", "update"]
}
