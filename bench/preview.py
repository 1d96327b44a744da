"""What does ``gpufleet preview`` cost next to one synthesis, cold and with the base cached?

    .venv/bin/python bench/preview.py [--runs 5]

A throwaway git repository holds this checkout's files (committed as the base) with one
cluster-file edit in the working tree (a static IP description: a blocked replace). Every
scenario is a fresh ``gpufleet`` process, as a user or CI runs it, interleaved over the
rounds so load drift on a shared machine hits all of them alike:

  synth           ``gpufleet synth`` of the working tree (the unit of cost)
  preview cold    ``gpufleet preview`` with an empty cache: base and head synthesized
  preview cached  the same with the base already cached (the usual second run on a PR)
  preview subproc cold again, with a code edit in the working tree, so the base (older code)
                  synthesizes in a subprocess with its own main.py and the head in-process

Medians are printed with the preview / synth ratios the issue asks for.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
GPUFLEET = str(Path(sys.executable).with_name("gpufleet"))
ENV = {**os.environ, "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20", "JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION": "1",
       "GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@example.com", "GIT_COMMITTER_NAME": "bench",
       "GIT_COMMITTER_EMAIL": "bench@example.com"}


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=ENV)


def make_repo(root: Path) -> Path:
    repo = root / "fleet"
    names = subprocess.run(["git", "-C", str(REPO_ROOT), "ls-files", "-co", "--exclude-standard", "-z"], check=True,
                           capture_output=True, text=True).stdout.split("\0")
    for name in filter(None, names):
        if (REPO_ROOT / name).is_file():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(REPO_ROOT / name, repo / name)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    cluster = repo / "clusters" / "prod-gke.yaml"
    cluster.write_text(cluster.read_text().replace("description: training dashboards and TensorBoard ingress", "description: dashboards"))
    return repo


def timed(args: list[str], expect: set[int]) -> float:
    start = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, env=ENV)
    elapsed = time.perf_counter() - start
    if done.returncode not in expect:
        raise SystemExit(f"{' '.join(args)} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-preview-") as tmp:
        root = Path(tmp)
        repo = make_repo(root)
        cached = root / "cache-warm"
        preview = [GPUFLEET, "--repo", str(repo), "preview", "--base", "HEAD"]  # the uncommitted edit only: main is HEAD here (no origin)
        timed([*preview, "--cache-dir", str(cached)], {4})  # fills the cache and warms bytecode and jsii's caches
        times: dict[str, list[float]] = {"synth": [], "preview cold": [], "preview cached": [], "preview subproc": []}
        for run in range(args.runs):
            times["synth"].append(timed([GPUFLEET, "--repo", str(repo), "synth", "--out", str(repo / "cdktf.out")], {0}))
            times["preview cold"].append(timed([*preview, "--cache-dir", str(root / f"cold-{run}")], {4}))
            times["preview cached"].append(timed([*preview, "--cache-dir", str(cached)], {4}))
            code = repo / "constructs_lib" / "network.py"
            original = code.read_text()
            code.write_text(original + "\n# bench: a code edit\n")
            try:
                times["preview subproc"].append(timed([*preview, "--cache-dir", str(root / f"sub-{run}")], {4}))
            finally:
                code.write_text(original)
    medians = {k: statistics.median(v) for k, v in times.items()}
    print(f"gpufleet preview bench: {args.runs} runs, medians (load average {os.getloadavg()[0]:.1f})")
    for name, value in medians.items():
        print(f"  {name:16s} {value:6.2f} s   runs: {', '.join(f'{t:.2f}' for t in times[name])}")
    for name in ("preview cold", "preview cached", "preview subproc"):
        print(f"  {name} / synth = {medians[name] / medians['synth']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
