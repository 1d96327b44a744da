"""Measuring one process tree: wall time from spawn to reap and peak RSS sampled from /proc.

Peak RSS is sampled every 20 ms: "tree" is the largest sum of VmRSS over the child and all its
descendants (Python, the jsii Node process, terraform and checkov children), "python" and "node"
are the VmHWM high-water marks of those processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

SAMPLE_SECONDS = 0.02


@dataclass
class Sample:
    wall: float
    tree_kb: int
    python_kb: int
    node_kb: int
    report: dict = field(default_factory=dict)
    exit_code: int = 0


def _children(pid: int) -> list[int]:
    found = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                found += [int(c) for c in handle.read().split()]
    except OSError:
        pass
    return found


def _status(pid: int) -> tuple[str, int, int]:
    """(command name, VmRSS kB, VmHWM kB) of a live process; zeros once it is gone."""
    values = {"Name": "", "VmRSS": "0", "VmHWM": "0"}
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key in values:
                    values[key] = value.split()[0] if value.split() else ""
    except OSError:
        return "", 0, 0
    return values["Name"], int(values["VmRSS"] or 0), int(values["VmHWM"] or 0)


def measure(cmd: list[str], *, cwd: Path, env: dict[str, str], ok_codes: tuple[int, ...] = (0,)) -> Sample:
    """Run ``cmd`` to its end; its wall time, peak RSS of the whole tree and of its Python and Node
    processes, and the ``BENCH {json}`` line it printed, if any."""
    begin = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peaks = {"tree": 0, "python": 0, "node": 0}
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            pids, total = [proc.pid], 0
            for pid in pids:
                pids += _children(pid)
                name, rss, hwm = _status(pid)
                total += rss
                if pid == proc.pid:
                    peaks["python"] = max(peaks["python"], hwm)
                elif name.startswith("node"):
                    peaks["node"] = max(peaks["node"], hwm)
            peaks["tree"] = max(peaks["tree"], total)
            stop.wait(SAMPLE_SECONDS)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - begin
    stop.set()
    poller.join()
    if proc.returncode not in ok_codes:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{err[-3000:]}{out[-2000:]}")
    report = next((json.loads(line[6:]) for line in out.splitlines() if line.startswith("BENCH ")), {})
    return Sample(wall, peaks["tree"], peaks["python"], peaks["node"], report, proc.returncode)
