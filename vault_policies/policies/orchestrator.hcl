# The dispatcher may only mint secret_ids that are response-wrapped: Vault refuses an
# unwrapped request, so a plain secret_id never exists outside the task that unwraps it.
# The wrapping bounds match vault_policies/layout.py (MIN/MAX_WRAP_TTL_SECONDS).
path "auth/approle/role/+/secret-id" {
  capabilities     = ["update"]
  min_wrapping_ttl = "60s"
  max_wrapping_ttl = "6h"
}

# role_ids are not secret; the dispatcher passes them to the task beside the wrapping token.
path "auth/approle/role/+/role-id" {
  capabilities = ["read"]
}
