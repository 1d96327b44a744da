# The dispatcher may only mint secret_ids that are response-wrapped: Vault refuses an
# unwrapped request, so a plain secret_id never exists outside the task that unwraps it.
# The wrapping bounds match vault_policies/layout.py (MIN/MAX_WRAP_TTL_SECONDS).
# One block per role in roles.yaml, named explicitly: a `+` would also cover every other
# team's AppRole role on the mount. A new role needs its two blocks here (gpufleet check
# says so), applied with an operator token: gpufleet-admin may not rewrite this policy.
path "auth/approle/role/eval/secret-id" {
  capabilities     = ["update"]
  min_wrapping_ttl = "60s"
  max_wrapping_ttl = "6h"
}

path "auth/approle/role/finetune/secret-id" {
  capabilities     = ["update"]
  min_wrapping_ttl = "60s"
  max_wrapping_ttl = "6h"
}

# role_ids are not secret; the dispatcher passes them to the task beside the wrapping token.
path "auth/approle/role/eval/role-id" {
  capabilities = ["read"]
}

path "auth/approle/role/finetune/role-id" {
  capabilities = ["read"]
}
