"""Following a run's logs through the control plane: latency and the cost of many followers.

Run: ``.venv/bin/python bench/logs.py`` (about a minute; loopback only, every loop bounded).

The Nomad API double (tests/jobs/nomad_double.py) runs in this process and holds one running
allocation of finetune-llama; ``gpufleet serve``'s app runs under uvicorn on 127.0.0.1 in a child
process of this script (so its RSS and CPU time are its own, not the double's or the clients'),
bound to prod-nomad, worker off, with one tenant token and the run's experiment row.

1. Latency: a line written to the double's task log (stamped with ``time.perf_counter_ns``) to the
   same line read by one ``follow=true`` HTTP client, one line at a time, ``LINES`` lines: p50, p99.
   The double polls its log file every 50 ms (as Nomad's client streams frames), so about 25 ms of
   each figure is the double's, not the service's. The service's Nomad follow holds the first
   window it reads until Nomad's first heartbeat (an empty frame after a quiet spell), so each
   client connects during a quiet second before anything is measured.
2. Followers: the service process's RSS and CPU seconds over equal windows with 0 and then
   ``FOLLOWERS`` concurrent followers of the same run, while the task writes a line every 100 ms;
   medians over ``WINDOWS`` windows each. The clients share the machine's 2 cores with the service.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LINES = 200
FOLLOWERS = 100
WINDOWS = 3
WINDOW_SECONDS = 5.0
WRITE_EVERY = 0.1
NAMESPACE = "finetune"
JOB_ID = "finetune-llama/dispatch-bench-logs"
TICKS = os.sysconf("SC_CLK_TCK")


def _double() -> tuple[Any, str]:
    """The Nomad double with one running allocation of JOB_ID; (double, alloc id)."""
    from tests.jobs.conftest import a100_nodes
    from tests.jobs.nomad_double import NomadDouble

    double = NomadDouble(a100_nodes()).start()
    double.heartbeat_seconds = 0.2  # as tests/experiments/test_logs.py: an empty frame after 0.2 s without output
    double.state.jobs[(NAMESPACE, JOB_ID)] = {"ID": JOB_ID, "ParentID": "finetune-llama", "Status": "running", "Namespace": NAMESPACE}
    double.state.evaluations[JOB_ID] = [{"ID": "e-logs", "Status": "complete", "CreateIndex": 1}]
    double.state.allocations[JOB_ID] = [{"ID": str(uuid.uuid4()), "JobID": JOB_ID, "Namespace": NAMESPACE, "TaskGroup": "a100-1gpu",
                                          "ClientStatus": "pending", "DesiredStatus": "run", "NodeName": "a100-0", "CreateIndex": 1, "ModifyIndex": 1}]
    return double, double.start_task(JOB_ID)


def serve(db_url: str, nomad_address: str) -> None:
    """The child: the service under uvicorn, then one line of JSON (base URL, token, experiment id)."""
    from tests.experiments.uvicorn_server import serve as uvicorn_serve

    from experiments.app import ServiceSettings, create_app, utcnow
    from experiments.auth import create_token
    from experiments.background.context import Timing
    from experiments.models import Experiment
    from experiments.scheduler import ClusterRunners
    from experiments.services.catalog import Catalog
    from jobs.nomad.client import NomadClient, NomadSettings
    from jobs.runner import NomadRunner
    from tests.conftest import load_fleet

    client = NomadClient(NomadSettings(address=nomad_address, timeout_seconds=10, retries=2, backoff_seconds=0.01))
    runner = ClusterRunners(nomad=("prod-nomad", NomadRunner(client, {"VAULT_ADDR": "http://127.0.0.1:1", "VAULT_TOKEN": "unused-by-logs"})))
    # All FOLLOWERS follow as one tenant: the per-tenant cap (--max-follows-per-tenant) is raised to let them.
    app = create_app(ServiceSettings(db_url=db_url, worker=False, timing=Timing(max_follows_per_tenant=FOLLOWERS)), runner=runner,
                     catalog=Catalog(configs=load_fleet()))
    with uvicorn_serve(app) as base:
        now = utcnow()
        experiment_id = str(uuid.uuid4())
        with app.state.ctx.sessions() as session, session.begin():
            token = create_token(session, tenant=NAMESPACE, admin=False, name="bench", now=now)[1]
            session.add(Experiment(id=experiment_id, tenant=NAMESPACE, job="finetune-llama", cluster="prod-nomad", pool="a100", gpus=1,
                                   meta={"dataset_uri": "hf://datasets/acme/chat@v3", "run_id": "logs"}, state="running", scheduler="nomad",
                                   run_id=f"{NAMESPACE}/{JOB_ID}", submitted_by="bench", request_hash="-", deadline_hours=12, price_per_gpu_hour=2.93,
                                   price_kind="list", created_at=now, updated_at=now, running_at=now, queued_at=now, reconciled_at=now))
        print(json.dumps({"base": base, "token": token, "id": experiment_id}), flush=True)
        sys.stdin.read()  # until the parent closes our stdin


def _proc(pid: int) -> tuple[float, int]:
    """(CPU seconds so far, RSS in KiB) of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime (proc(5): fields 14 and 15)
    rss = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("VmRSS:"))
    return cpu, rss


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Follower(threading.Thread):
    """One ``follow=true`` client; counts lines and hands each received one to ``on_line``."""

    def __init__(self, base: str, token: str, experiment_id: str, on_line: Any = None) -> None:
        super().__init__(daemon=True)
        self.url, self.token, self.on_line = f"{base}/api/v1/experiments/{experiment_id}/logs", token, on_line
        self.received = 0
        self.done = threading.Event()
        self.error: str | None = None

    def run(self) -> None:
        import httpx

        try:
            with httpx.stream("GET", self.url, params={"follow": "true", "tail": "0"}, headers={"Authorization": f"Bearer {self.token}"},
                              timeout=httpx.Timeout(30.0)) as answer:
                if answer.status_code != 200:
                    self.error = f"HTTP {answer.status_code}: {answer.read()[:200]!r}"
                    return
                for line in answer.iter_lines():
                    self.received += 1
                    if self.on_line is not None:
                        self.on_line(line)
                    if self.done.is_set():
                        return
        except Exception as exc:  # noqa: BLE001 - a failed follower is reported, not raised in a thread
            self.error = f"{type(exc).__name__}: {exc}"


def latency(double: Any, alloc: str, base: str, token: str, experiment_id: str) -> dict[str, float]:
    got: dict[int, int] = {}
    arrived = threading.Event()

    def on_line(line: str) -> None:
        if line.startswith("lat "):
            _, n, _stamp = line.split()
            got[int(n)] = time.perf_counter_ns()
            arrived.set()

    follower = Follower(base, token, experiment_id, on_line)
    follower.start()
    sent: dict[int, int] = {}
    deadline = time.monotonic() + 20
    while follower.received == 0 and follower.error is None:  # tail=0: lines written before it connected are not sent
        if time.monotonic() > deadline:
            raise RuntimeError("the follower never received its first line")
        double.write_log(alloc, "warm-up\n")
        time.sleep(1.0)  # quiet for longer than a heartbeat: the follow's first window is sent whole after one
    if follower.error:
        raise RuntimeError(f"the follower failed: {follower.error}")
    time.sleep(0.5)  # the warm-up lines still in flight arrive before the first measured one
    for n in range(LINES):
        arrived.clear()
        sent[n] = time.perf_counter_ns()
        double.write_log(alloc, f"lat {n} {sent[n]}\n")
        if not arrived.wait(5):
            raise RuntimeError(f"line {n} not received within 5 s ({follower.error})")
    follower.done.set()
    double.write_log(alloc, "end of latency\n")
    follower.join(timeout=5)
    ms = [(got[n] - sent[n]) / 1e6 for n in range(LINES)]
    return {"p50_ms": statistics.median(ms), "p99_ms": _percentile(ms, 0.99), "max_ms": max(ms)}


def _window(double: Any, alloc: str, pid: int) -> tuple[float, float]:
    """(CPU seconds, median RSS MiB) of the service over one window while the task writes."""
    cpu0, _ = _proc(pid)
    rss: list[int] = []
    ends = time.monotonic() + WINDOW_SECONDS
    n = 0
    while time.monotonic() < ends:
        double.write_log(alloc, f"step {n} loss 1.{n % 97:02d}\n")
        rss.append(_proc(pid)[1])
        n += 1
        time.sleep(WRITE_EVERY)
    return _proc(pid)[0] - cpu0, statistics.median(rss) / 1024


def followers(double: Any, alloc: str, pid: int, base: str, token: str, experiment_id: str) -> dict[str, Any]:
    idle = [_window(double, alloc, pid) for _ in range(WINDOWS)]
    clients = [Follower(base, token, experiment_id) for _ in range(FOLLOWERS)]
    for client in clients:
        client.start()
    deadline = time.monotonic() + 60
    while True:
        double.write_log(alloc, "sync\n")
        time.sleep(1.0)  # quiet past a heartbeat, as in latency()
        if all(c.received for c in clients) or any(c.error for c in clients):
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {sum(1 for c in clients if c.received)} of {FOLLOWERS} followers connected in 60 s")
    errors = [c.error for c in clients if c.error]
    if errors:
        raise RuntimeError(f"{len(errors)} followers failed: {errors[0]}")
    followed = [_window(double, alloc, pid) for _ in range(WINDOWS)]
    behind = [c for c in clients if c.error or not c.is_alive()]
    for client in clients:
        client.done.set()
    double.write_log(alloc, "bye\n")
    return {
        "idle_cpu_s": statistics.median(c for c, _ in idle), "idle_rss_mib": statistics.median(r for _, r in idle),
        "followed_cpu_s": statistics.median(c for c, _ in followed), "followed_rss_mib": statistics.median(r for _, r in followed),
        "followers_dropped": len(behind),
    }


def main() -> None:
    workdir = Path(tempfile.mkdtemp(prefix="gpufleet-bench-logs-"))
    double, alloc = _double()
    child = subprocess.Popen([sys.executable, __file__, "--serve", f"sqlite:///{workdir / 'experiments.db'}", double.address],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert child.stdout is not None
        started = json.loads(child.stdout.readline() or "null") or sys.exit("the service did not start (see its stderr above)")
        base, token, experiment_id = started["base"], started["token"], started["id"]
        print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        lat = latency(double, alloc, base, token, experiment_id)
        print(f"latency, line written to the task log -> line read by a follow=true client, {LINES} lines: "
              f"p50 {lat['p50_ms']:.1f} ms, p99 {lat['p99_ms']:.1f} ms (max {lat['max_ms']:.1f} ms)")
        load = followers(double, alloc, child.pid, base, token, experiment_id)
        print(f"service process over {WINDOW_SECONDS:.0f} s windows (median of {WINDOWS}), a line every {WRITE_EVERY * 1000:.0f} ms:")
        print(f"  {'followers':>10} {'CPU s':>8} {'RSS MiB':>9}")
        print(f"  {0:>10} {load['idle_cpu_s']:>8.2f} {load['idle_rss_mib']:>9.1f}")
        print(f"  {FOLLOWERS:>10} {load['followed_cpu_s']:>8.2f} {load['followed_rss_mib']:>9.1f}")
        ratio = load["followed_cpu_s"] / load["idle_cpu_s"] if load["idle_cpu_s"] else float("inf")
        print(f"  CPU x{ratio:.1f}, RSS +{load['followed_rss_mib'] - load['idle_rss_mib']:.1f} MiB; followers that dropped: {load['followers_dropped']}")
        print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    finally:
        if child.stdin:
            child.stdin.close()
        try:
            child.wait(timeout=20)
        except subprocess.TimeoutExpired:
            child.kill()
        double.stop()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(sys.argv[2], sys.argv[3])
    else:
        main()
