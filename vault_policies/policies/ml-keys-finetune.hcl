# Fine-tune runs read the Hugging Face token (model pulls/pushes) and the W&B key (metrics).
# Read only, one path per key, current version only (denied_parameters refuses ?version=N,
# so a rotated-out key stays out of reach): a new key for this family is a reviewed block here.
path "secret/data/ml-api-keys/huggingface" {
  capabilities = ["read"]
  denied_parameters = {
    "version" = []
  }
}

path "secret/data/ml-api-keys/wandb" {
  capabilities = ["read"]
  denied_parameters = {
    "version" = []
  }
}
