# gpufleet: the two newcomer commands are `make demo` and `make test`.
# Both create or reuse .venv and install the project from pyproject.toml first.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export CHECKPOINT_DISABLE := 1
export BC_SKIP_MAPPING := TRUE

.PHONY: demo test docs bench install browser cdktf-cli clean preview-release

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing gpufleet and its pinned dependencies into $(VENV) (pip's output: $(VENV)/install.log)"
	@{ $(BIN)/python -m pip install --upgrade pip && $(BIN)/python -m pip install -e '.[dev]'; } > $(VENV)/install.log 2>&1 \
	  || { tail -n 40 $(VENV)/install.log; echo "error: pip install failed; the whole log is $(VENV)/install.log"; exit 2; }
	@touch $@

DEMO_DB := sqlite:///$(CURDIR)/.gpufleet/demo-experiments.db
DEMO_API := http://127.0.0.1:8787

# Synthesize the example fleet, start a local OpenBao and the control plane (SQLite), submit the
# fine-tune through the API; the service runs it here through the real Vault flow (run-local's).
# Its first attempt fails at step 150 as if its GPU had an XID (--local-xid-at-step): the service
# counts that as an infrastructure failure, and attempt 2 (new secret_id) resumes from the checkpoint.
demo: $(STAMP)
	$(BIN)/gpufleet clusters
	$(BIN)/gpufleet synth
	$(BIN)/gpufleet stacks
	$(BIN)/gpufleet jobs render
	$(BIN)/gpufleet dev up
	@set -e; eval "$$($(BIN)/gpufleet dev env)"; \
	  trap '$(BIN)/gpufleet dev down' EXIT; \
	  $(BIN)/gpufleet vault diff; \
	  rm -f .gpufleet/demo-experiments.db*; \
	  export GPUFLEET_API=$(DEMO_API) GPUFLEET_API_TOKEN="$$($(BIN)/gpufleet api token create --tenant finetune --db $(DEMO_DB) --quiet)"; \
	  PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/gpufleet serve --db $(DEMO_DB) --scheduler local --port 8787 --poll-seconds 0.5 \
	    --retry-backoff-seconds 2 --local-xid-at-step 150 > .gpufleet/demo-serve.log 2>&1 & \
	  serve=$$!; trap 'kill $$serve 2>/dev/null; $(BIN)/gpufleet dev down' EXIT; \
	  for i in $$(seq 50); do curl -fsS $(DEMO_API)/healthz >/dev/null 2>&1 && break; sleep 0.2; done; \
	  $(BIN)/gpufleet exp submit finetune-llama --meta dataset_uri=hf://datasets/demo/tiny@v1 --meta run_id=demo-1 --watch; \
	  id=$$($(BIN)/gpufleet exp list --limit 1 --json | $(BIN)/python -c 'import json, sys; print(json.load(sys.stdin)["items"][0]["id"][:8])'); \
	  echo "--- what attempt 2 printed, first lines and last: gpufleet exp logs $$id"; \
	  $(BIN)/gpufleet exp logs $$id | head -n 3; \
	  $(BIN)/gpufleet exp logs $$id --tail 3

# The dashboard tests drive Debian's chromium (Playwright only connects to it; no browser download).
browser:
	@test -x /usr/bin/chromium || { \
	  command -v apt-get >/dev/null || { echo "error: /usr/bin/chromium is missing and apt-get is not available; install Chromium at /usr/bin/chromium"; exit 2; }; \
	  echo "installing Debian chromium for the dashboard tests (apt-get, needs root)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }
	@test -x /usr/bin/chromium || { echo "error: /usr/bin/chromium is still missing after apt-get install chromium"; exit 2; }

test: $(STAMP) browser
	@command -v terraform >/dev/null || { echo "error: terraform is not on PATH; install terraform 1.11 (plan-gate tests run it)"; exit 2; }
	@command -v node >/dev/null || { echo "error: node is not on PATH; install Node.js 20 (jsii runs cdktf on it)"; exit 2; }
	$(BIN)/python -m pytest -q

# The reference pages in docs/reference/ from the code (schemas, CLI, OpenAPI, exit codes); no network.
docs: $(STAMP)
	$(BIN)/python tools/gen_reference.py

bench: $(STAMP)
	$(BIN)/python bench/synth.py --write
	$(BIN)/python bench/vault_startup.py
	$(BIN)/python bench/jobs.py
	$(BIN)/python bench/control_plane.py

# Optional: the pinned cdktf CLI for `npx cdktf synth|diff|deploy <stack>`.
cdktf-cli: package-lock.json
	npm ci --ignore-scripts --no-audit --no-fund

# Keeps .gpufleet/state: the Terraform state of state.backend: local clusters (stacks/backends.py).
clean:
	rm -rf cdktf.out jobs/out .pytest_cache
	test ! -d .gpufleet || find .gpufleet -mindepth 1 -maxdepth 1 ! -name state -exec rm -rf {} +

# What plan.yml's preview job runs: the working tree against the last release (newest final version tag vX.Y.Z),
# failing on a protected resource destroyed, replaced or renamed without a migration (docs/nomad.md).
preview-release: $(STAMP)
	GPUFLEET=$(CURDIR)/$(BIN)/gpufleet tools/preview_last_release.sh
