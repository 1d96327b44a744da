"""A tiny CPU stand-in for a fine-tune, for demos and tests: standard library only.

It does what a real trainer does at the edges: reads its dispatch parameters from
NOMAD_META_* (GPUFLEET_META_* on GKE), proves it received each required key from Vault WITHOUT printing it (the
variable name and a short sha256 fingerprint only), trains (SGD on a generated linear
regression task seeded by dataset_uri + run_id), and writes a checkpoint into the alloc dir.

Like a trainer that survives failures (issue 25), it writes its state after every step into
GPUFLEET_CHECKPOINT_URI when that is a local directory (the local runner's
``.gpufleet/checkpoints/<experiment id>``, the same for every attempt) and, when a checkpoint of the
same dataset and run is there, resumes from it instead of starting at step 0; GPUFLEET_ATTEMPT
says which attempt this is. For demos GPUFLEET_LOCAL_XID_AT_STEP (set by the local runner on a
first attempt only) makes it stop at that step as if its GPU failed: exit 75, the wrapper's
hardware code, which the control plane retries.
Exit codes: 0 trained, 3 a required key is missing, 4 the loss did not go down, 75 (simulated) GPU fault.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
from pathlib import Path

TRUE_WEIGHTS = (3.0, -2.0, 0.5)
BIAS = 0.25
EXIT_HARDWARE = 75  # vault_policies.layout.EXIT_HARDWARE (this file runs with the standard library only)


def fingerprint(value: str) -> str:
    return "sha256:" + hashlib.sha256(value.encode()).hexdigest()[:12]


def make_data(seed: str, n: int) -> list[tuple[list[float], float]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        x = [rng.uniform(-1, 1) for _ in TRUE_WEIGHTS]
        y = sum(w * xi for w, xi in zip(TRUE_WEIGHTS, x)) + BIAS + rng.gauss(0, 0.05)
        rows.append((x, y))
    return rows


def mse(weights: list[float], bias: float, rows: list[tuple[list[float], float]]) -> float:
    return sum((sum(w * xi for w, xi in zip(weights, x)) + bias - y) ** 2 for x, y in rows) / len(rows)


def _state_path(checkpoints: str, run_id: str) -> Path | None:
    """``<dir>/<run_id>.json`` when the URI is a local directory; None for a bucket (gs://): this
    stand-in has no cloud client, a real trainer writes there with its own."""
    if not checkpoints or "://" in checkpoints and not checkpoints.startswith("file://"):
        return None
    return Path(checkpoints.removeprefix("file://")) / f"{run_id}.json"


def _save(path: Path, state: dict) -> None:
    """Atomically (write, then rename): a run killed mid-write leaves the previous checkpoint whole."""
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(state, sort_keys=True))
    partial.replace(path)


def train(rows: list[tuple[list[float], float]], *, steps: int, lr: float, seed: str, state_path: Path | None = None,
          resume: dict | None = None, xid_at_step: int | None = None) -> tuple[list[float], float, list[tuple[int, float]]]:
    rng = random.Random(seed + "/sgd")
    weights, bias, start = [0.0] * len(TRUE_WEIGHTS), 0.0, 0
    history = [(0, mse(weights, bias, rows))]
    if resume is not None:
        weights, bias, start = list(resume["weights"]), float(resume["bias"]), int(resume["step"])
        rng.setstate((resume["rng"][0], tuple(resume["rng"][1]), resume["rng"][2]))
        history = [(step, loss) for step, loss in resume["history"]]
    for step in range(start + 1, steps + 1):
        if xid_at_step is not None and step == xid_at_step:
            print(f"step {step}: simulated XID 79 (GPU has fallen off the bus); exiting {EXIT_HARDWARE} for the control plane to retry", file=sys.stderr, flush=True)
            sys.exit(EXIT_HARDWARE)
        x, y = rows[rng.randrange(len(rows))]
        error = sum(w * xi for w, xi in zip(weights, x)) + bias - y
        weights = [w - lr * 2 * error * xi for w, xi in zip(weights, x)]
        bias -= lr * 2 * error
        if step % 50 == 0 or step == steps:
            history.append((step, mse(weights, bias, rows)))
        if state_path is not None:
            _save(state_path, {"step": step, "weights": weights, "bias": bias, "rng": list(rng.getstate()), "history": history, "seed": seed})
    return weights, bias, history


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--require-env", action="append", default=[], help="a key that must have arrived from Vault")
    args = parser.parse_args(argv)

    # Dispatch meta: NOMAD_META_<key> on Nomad, GPUFLEET_META_<key> on GKE.
    dataset = os.environ.get("NOMAD_META_dataset_uri") or os.environ.get("GPUFLEET_META_dataset_uri", "unset")
    run_id = os.environ.get("NOMAD_META_run_id") or os.environ.get("GPUFLEET_META_run_id", "unset")
    print(f"job {os.environ.get('NOMAD_JOB_ID', '?')} run_id={run_id} dataset={dataset}", flush=True)
    for name in args.require_env:
        value = os.environ.get(name)
        if not value:
            print(f"error: {name} is not set; list it in the job's secrets.env and run through gpufleet-exec", file=sys.stderr)
            return 3
        print(f"{name} received ({fingerprint(value)})", flush=True)

    seed = f"{dataset}#{run_id}"
    rows = make_data(seed, args.samples)
    state_path = _state_path(os.environ.get("GPUFLEET_CHECKPOINT_URI", ""), run_id)
    resume = None
    if state_path is not None:
        state_path.parent.mkdir(parents=True, exist_ok=True)
        if state_path.exists() and (saved := json.loads(state_path.read_text())).get("seed") == seed:
            resume = saved
    attempt = os.environ.get("GPUFLEET_ATTEMPT", "1")
    print(f"attempt {attempt}: " + (f"resuming from the checkpoint of step {resume['step']} ({state_path})" if resume else "starting at step 0"), flush=True)
    xid = os.environ.get("GPUFLEET_LOCAL_XID_AT_STEP")
    weights, bias, history = train(rows, steps=args.steps, lr=args.lr, seed=seed, state_path=state_path, resume=resume,
                                   xid_at_step=int(xid) if xid and xid.isdigit() else None)
    for step, loss in history:
        print(f"step {step:4d} loss {loss:.5f}", flush=True)

    alloc_dir = Path(os.environ.get("NOMAD_ALLOC_DIR") or os.environ.get("GPUFLEET_SCRATCH", "."))
    checkpoint = alloc_dir / "data" / f"checkpoint-{run_id}.json"
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    checkpoint.write_text(json.dumps({"run_id": run_id, "dataset_uri": dataset, "weights": weights, "bias": bias, "loss": history[-1][1]}, sort_keys=True) + "\n")
    print(f"checkpoint written to {checkpoint}", flush=True)
    if history[-1][1] >= history[0][1]:
        print("error: loss did not decrease", file=sys.stderr)
        return 4
    return 0


if __name__ == "__main__":
    sys.exit(main())
