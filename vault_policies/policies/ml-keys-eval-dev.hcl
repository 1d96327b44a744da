# Evaluation runs on dev clusters call the OpenAI API as a judge model with a dev key of their
# own (a key belongs to one family: the prod eval key stays out of every dev pod's reach).
# Current version only: denied_parameters refuses ?version=N (rotated-out keys).
path "secret/data/ml-api-keys/openai-dev" {
  capabilities = ["read"]
  denied_parameters = {
    "version" = []
  }
}
