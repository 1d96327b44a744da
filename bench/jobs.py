"""What the typed job layer costs per dispatch: render + validate 1,000 dispatch requests.

Run: ``.venv/bin/python bench/jobs.py``. For each request (distinct run_id / dataset_uri)
the layer validates the dispatch meta against the job's declaration, renders the Nomad job
JSON from the checked spec and builds the dispatch body. The baseline builds the very same
dicts by hand, as a literal with no checks (asserted equal before timing). Both are timed
per request in the same process, interleaved, and reported as medians with their ratio.
Loading and cross-checking the job file happens once per CLI call and is reported apart.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from jobs.loader import find, load  # noqa: E402
from jobs.meta import validate_meta  # noqa: E402
from jobs.nomad.render import META_ROLE_ID, META_WRAPPED_SECRET_ID, render  # noqa: E402
from jobs.spec import FinetuneSpec  # noqa: E402

REQUESTS = 1000
LOADS = 20


def layer(spec: FinetuneSpec, meta: dict[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    checked = validate_meta(spec, meta)
    return render(spec), {"Meta": {**checked, META_ROLE_ID: "role-id", META_WRAPPED_SECRET_ID: "wrapping-token"}}


def by_hand(meta: dict[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    s = 1_000_000_000
    job = {"Job": {
        "ID": "finetune-llama", "Name": "finetune-llama", "Type": "batch", "Namespace": "finetune", "Region": "global",
        "Datacenters": ["europe-west4"], "NodePool": "a100", "Priority": 60,
        "Meta": {"gpufleet_vault_role": "finetune", "gpufleet_cluster": "prod-nomad", "gpufleet_gpu_pool": "a100"},
        "ParameterizedJob": {"Payload": "forbidden", "MetaRequired": ["dataset_uri", "gpufleet_vault_role_id", "gpufleet_vault_wrapped_secret_id", "run_id"], "MetaOptional": ["base_model"]},
        "TaskGroups": [{
            "Name": "train", "Count": 1,
            "Constraints": [{"LTarget": "${node.class}", "Operand": "=", "RTarget": "a100"}],
            "RestartPolicy": {"Attempts": 1, "Delay": 30 * s, "Interval": 86400 * s, "Mode": "fail"},
            "ReschedulePolicy": {"Attempts": 2, "Interval": 86400 * s, "Delay": 300 * s, "DelayFunction": "exponential", "MaxDelay": 3600 * s, "Unlimited": False},
            "EphemeralDisk": {"SizeMB": 51200, "Sticky": False, "Migrate": False},
            "MaxRunDuration": 12 * 3600 * s,
            "Tasks": [{
                "Name": "train", "Driver": "docker",
                "Config": {"image": "ghcr.io/acme/gpufleet-train:2026.12", "command": "gpufleet-exec", "args": ["--", "python", "jobs/tasks/tiny_finetune.py", "--steps", "300", "--require-env", "HF_TOKEN"]},
                "Env": {
                    "HF_HOME": "/alloc/data/hf-cache", "TOKENIZERS_PARALLELISM": "false", "VAULT_ADDR": "https://vault.example.com:8200",
                    "GPUFLEET_VAULT_ROLE_ID": "${NOMAD_META_gpufleet_vault_role_id}",
                    "GPUFLEET_VAULT_WRAPPED_SECRET_ID": "${NOMAD_META_gpufleet_vault_wrapped_secret_id}",
                    "GPUFLEET_SECRETS": "HF_TOKEN=ml-api-keys/huggingface#token",
                },
                "Resources": {"CPU": 8000, "MemoryMB": 32768, "Devices": [{"Name": "nvidia/gpu", "Count": 1, "Constraints": [
                    {"LTarget": "${device.attr.memory}", "Operand": ">=", "RTarget": "40 GiB"},
                    {"LTarget": "${device.model}", "Operand": "regexp", "RTarget": "A100"},
                ]}]},
                "KillTimeout": 120 * s, "KillSignal": "SIGTERM",
            }],
        }],
    }}
    return job, {"Meta": {**dict(sorted(meta.items())), META_ROLE_ID: "role-id", META_WRAPPED_SECRET_ID: "wrapping-token"}}


def _median_us(samples: list[int]) -> float:
    return statistics.median(samples) / 1000


def main() -> int:
    path = find("finetune-llama")
    load_ns = []
    for _ in range(LOADS):
        start = time.perf_counter_ns()
        spec = load(path)
        load_ns.append(time.perf_counter_ns() - start)
    requests = [{"dataset_uri": f"hf://datasets/acme/chat@v{i % 7 + 1}", "run_id": f"run-{i}"} for i in range(REQUESTS)]
    assert layer(spec, requests[0]) == by_hand(requests[0]), "the hand-built dicts must equal the rendered ones"
    ours, hand = [], []
    for meta in requests:
        start = time.perf_counter_ns()
        layer(spec, meta)
        middle = time.perf_counter_ns()
        by_hand(meta)
        hand.append(time.perf_counter_ns() - middle)
        ours.append(middle - start)
    typed, literal = _median_us(ours), _median_us(hand)
    print(f"{REQUESTS} dispatch requests of finetune-llama (validate meta + render job + dispatch body)")
    print(f"  typed layer : median {typed:8.1f} us/request   total {sum(ours) / 1e6:7.1f} ms")
    print(f"  by hand     : median {literal:8.1f} us/request   total {sum(hand) / 1e6:7.1f} ms")
    print(f"  ratio       : {typed / literal:.1f}x the hand-built dicts")
    print(f"  once per CLI call: load + cross-check the job file (clusters, roles, policies): median {_median_us(load_ns) / 1000:.1f} ms over {LOADS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
