"""How fast can N training tasks start at once through Vault, and what does our client cost?

One command, one run: starts its own OpenBao dev server, applies the repo's policies and
roles, then measures N concurrent task start-ups (unwrap, AppRole login, read two keys,
revoke) through ``vault_policies.client.start_task`` and through a bare hvac loop doing the
same calls. After one untimed warm-up round each, rounds alternate AB, BA, ... so drift on
a shared machine hits both sides; wrapped secret_ids are minted before each round, untimed.

    .venv/bin/python bench/vault_startup.py [--tasks 200] [--rounds 4]

Targets: zero errors at 200 concurrent start-ups; client p50 at most 1.25x bare hvac.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import hvac

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from vault_policies import sync  # noqa: E402
from vault_policies.client import TaskConfig, parse_secrets, start_task  # noqa: E402
from vault_policies.devserver import start_dev_server  # noqa: E402
from vault_policies.layout import KV_MOUNT  # noqa: E402
from vault_policies.orchestrator import issue_wrapped_secret_id  # noqa: E402
from vault_policies.validate import load_definitions  # noqa: E402

ROLE = "finetune"
SECRETS = "HF_TOKEN=ml-api-keys/huggingface#token,WANDB_API_KEY=ml-api-keys/wandb#api_key"
FAKE_KEYS = {"ml-api-keys/huggingface": {"token": "fake-hf-bench-0000"}, "ml-api-keys/wandb": {"api_key": "fake-wandb-bench-0000"}}
TARGET_RATIO = 1.25


def client_startup(addr: str, role_id: str, wrapping_token: str) -> None:
    config = TaskConfig(addr=addr, role_id=role_id, wrapping_token=wrapping_token, secrets=parse_secrets(SECRETS))
    session = start_task(config)
    if len(session.secrets) != 2:
        raise RuntimeError("missing keys")
    if not session.close():
        raise RuntimeError("revoke failed")


def bare_startup(addr: str, role_id: str, wrapping_token: str) -> None:
    client = hvac.Client(url=addr, token=wrapping_token)
    secret_id = client.sys.unwrap()["data"]["secret_id"]
    client.token = ""
    client.auth.approle.login(role_id, secret_id)
    keys = {}
    for ref in parse_secrets(SECRETS):
        data = client.secrets.kv.v2.read_secret_version(ref.path, mount_point=KV_MOUNT, raise_on_deleted_version=True)["data"]["data"]
        keys[ref.env_name] = data[ref.key]
    if len(keys) != 2:
        raise RuntimeError("missing keys")
    client.auth.token.revoke_self()
    client.adapter.close()


def run_round(startup: Callable[[str, str, str], None], addr: str, orchestrator: hvac.Client, tasks: int) -> tuple[list[float], Counter[str], float]:
    wrapped = [issue_wrapped_secret_id(orchestrator, ROLE, wrap_ttl_seconds=600) for _ in range(tasks)]
    barrier = threading.Barrier(tasks)
    latencies: list[float] = []
    errors: Counter[str] = Counter()
    lock = threading.Lock()

    def one(index: int) -> None:
        barrier.wait()
        started = time.perf_counter()
        try:
            startup(addr, wrapped[index].role_id, wrapped[index].wrapping_token)
        except Exception as exc:  # counted and reported, a benchmark must not stop at the first failure
            with lock:
                errors[type(exc).__name__] += 1
            return
        elapsed = time.perf_counter() - started
        with lock:
            latencies.append(elapsed)

    wall_started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=tasks) as pool:
        list(pool.map(one, range(tasks)))
    return latencies, errors, time.perf_counter() - wall_started


def sequential(variants: dict[str, Callable[[str, str, str], None]], addr: str, orchestrator: hvac.Client, tasks: int) -> dict[str, float]:
    """Median single start-up, one at a time, alternating variants: the client's own cost without queueing on 2 cores."""
    latencies: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(tasks):
        for name, startup in variants.items():
            wrapped = issue_wrapped_secret_id(orchestrator, ROLE, wrap_ttl_seconds=600)
            started = time.perf_counter()
            startup(addr, wrapped.role_id, wrapped.wrapping_token)
            latencies[name].append(time.perf_counter() - started)
    return {name: statistics.median(values) for name, values in latencies.items()}


def percentile(values: list[float], fraction: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=4, help="even keeps the AB/BA order balanced against drift")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        server = start_dev_server(Path(tmp) / "bao.log")
        try:
            root = hvac.Client(url=server.addr, token=server.root_token)
            sync.apply(root, load_definitions(REPO_ROOT))
            for path, data in FAKE_KEYS.items():
                root.secrets.kv.v2.create_or_update_secret(path, secret=data, mount_point=KV_MOUNT)
            orchestrator = hvac.Client(url=server.addr, token=root.auth.token.create(policies=["orchestrator"], ttl="1h")["auth"]["client_token"])
            variants = {"bare hvac": bare_startup, "vault_policies.client": client_startup}
            results: dict[str, dict[str, list[float]]] = {name: {"p50": [], "p99": [], "wall": []} for name in variants}
            errors: dict[str, Counter[str]] = {name: Counter() for name in variants}
            for warm_up in variants.values():
                run_round(warm_up, server.addr, orchestrator, args.tasks)
            for round_index in range(args.rounds):
                order = list(variants) if round_index % 2 == 0 else list(reversed(variants))
                for name in order:
                    latencies, round_errors, wall = run_round(variants[name], server.addr, orchestrator, args.tasks)
                    results[name]["p50"].append(percentile(latencies, 0.50))
                    results[name]["p99"].append(percentile(latencies, 0.99))
                    results[name]["wall"].append(wall)
                    errors[name].update(round_errors)
                    print(f"round {round_index + 1} {name:<22} p50 {percentile(latencies, 0.5) * 1000:7.1f} ms  p99 {percentile(latencies, 0.99) * 1000:7.1f} ms  wall {wall:5.2f} s  errors {sum(round_errors.values())}", flush=True)
            single = sequential(variants, server.addr, orchestrator, 100)
        finally:
            server.stop()

    print(f"\n{args.tasks} concurrent start-ups (unwrap, login, read 2 keys, revoke), median of {args.rounds} rounds")
    print(f"{'variant':<24}{'p50 ms':>10}{'p99 ms':>10}{'wall s':>10}{'errors':>10}")
    medians = {name: {k: statistics.median(v) for k, v in r.items()} for name, r in results.items()}
    for name, m in medians.items():
        detail = f"  {dict(errors[name])}" if errors[name] else ""
        print(f"{name:<24}{m['p50'] * 1000:>10.1f}{m['p99'] * 1000:>10.1f}{m['wall']:>10.2f}{sum(errors[name].values()):>10}{detail}")
    ours, bare = medians["vault_policies.client"], medians["bare hvac"]
    ratio = ours["p50"] / bare["p50"]
    print(f"{'ratio client/bare':<24}{ratio:>10.2f}{ours['p99'] / bare['p99']:>10.2f}{ours['wall'] / bare['wall']:>10.2f}")
    print(f"{'one at a time (p50 ms)':<24}" + "".join(f"{name}: {value * 1000:.1f}  " for name, value in single.items()) + f"ratio {single['vault_policies.client'] / single['bare hvac']:.2f}")
    total_errors = sum(sum(e.values()) for e in errors.values())
    ok = total_errors == 0 and ratio <= TARGET_RATIO
    print(f"target: 0 errors and p50 ratio <= {TARGET_RATIO}: {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
