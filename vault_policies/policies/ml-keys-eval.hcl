# Evaluation runs call the OpenAI API as a judge model; they need nothing else.
# Current version only: denied_parameters refuses ?version=N (rotated-out keys).
path "secret/data/ml-api-keys/openai" {
  capabilities = ["read"]
  denied_parameters = {
    "version" = []
  }
}
