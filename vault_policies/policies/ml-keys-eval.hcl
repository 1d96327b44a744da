# Evaluation runs call the OpenAI API as a judge model; they need nothing else.
path "secret/data/ml-api-keys/openai" {
  capabilities = ["read"]
}
