# gpufleet: the two newcomer commands are `make demo` and `make test`.
# Both create or reuse .venv and install the project from pyproject.toml first.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export CHECKPOINT_DISABLE := 1
export BC_SKIP_MAPPING := TRUE

.PHONY: demo test bench install cdktf-cli clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $@

# Synthesize the example fleet, start a local OpenBao, run a fine-tune task through the real Vault flow.
demo: $(STAMP)
	$(BIN)/gpufleet clusters
	$(BIN)/gpufleet synth
	$(BIN)/gpufleet stacks
	$(BIN)/gpufleet jobs render
	$(BIN)/gpufleet dev up
	@set -e; eval "$$($(BIN)/gpufleet dev env)"; \
	  trap '$(BIN)/gpufleet dev down' EXIT; \
	  $(BIN)/gpufleet vault diff; \
	  PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/gpufleet jobs run-local finetune-llama \
	    --meta dataset_uri=hf://datasets/demo/tiny@v1 --meta run_id=demo-1

test: $(STAMP)
	@command -v terraform >/dev/null || { echo "error: terraform is not on PATH; install terraform 1.11 (plan-gate tests run it)"; exit 2; }
	@command -v node >/dev/null || { echo "error: node is not on PATH; install Node.js 20 (jsii runs cdktf on it)"; exit 2; }
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python bench/synth.py --write
	$(BIN)/python bench/vault_startup.py
	$(BIN)/python bench/jobs.py

# Optional: the pinned cdktf CLI for `npx cdktf synth|diff|deploy <stack>`.
cdktf-cli: package-lock.json
	npm ci --ignore-scripts --no-audit --no-fund

clean:
	rm -rf cdktf.out jobs/out .gpufleet .pytest_cache
