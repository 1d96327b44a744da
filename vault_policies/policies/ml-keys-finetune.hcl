# Fine-tune runs read the Hugging Face token (model pulls/pushes) and the W&B key (metrics).
# Read only, one path per key: a new key for this family is a reviewed line here.
path "secret/data/ml-api-keys/huggingface" {
  capabilities = ["read"]
}

path "secret/data/ml-api-keys/wandb" {
  capabilities = ["read"]
}
