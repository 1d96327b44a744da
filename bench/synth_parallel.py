"""Serial against parallel synthesis, and `gpufleet check` with a cold against a warm checkov cache.

One command, one run, every scenario in a fresh process, interleaved over the rounds so drift on
a shared machine hits all of them alike; medians, ratios side by side, load average printed:

    .venv/bin/python bench/synth_parallel.py [--runs 3]

  example x1     the example fleet (clusters/*.yaml, 4 clusters) in one process (GPUFLEET_SYNTH_JOBS=1)
  example xN     the same over N worker processes (N = the cores this process may use)
  example auto   the default: below stacks.parallel.PARALLEL_MIN_CLUSTERS clusters, one process
  example x1 tc  one process with jsii's generated type checks on (GPUFLEET_JSII_TYPE_CHECKS=1, as before)
  gen8 x1 / xN   a generated fleet of 8 clusters (bench/fleetgen.py): where the threshold sits
  gen50 x1 / xN  a generated fleet of 50 clusters x 6 GPU pools
  check cold     `gpufleet check --clusters-dir <example>` with an empty checkov cache
  check warm     the same after one cluster file changed (a fresh cache holding the other stacks)

Peak RSS "tree" is the largest sum of VmRSS over the command and all its descendants (worker
processes and their Node kernels included), sampled every 20 ms (bench/proctree.py).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import proctree
from fleetgen import generated_fleet

REPO_ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
GPUFLEET = str(Path(PYTHON).with_name("gpufleet"))
ENV = {"JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20", "JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION": "1",
       "CHECKPOINT_DISABLE": "1", "BC_SKIP_MAPPING": "TRUE"}
PAIRS = (("example xN", "example x1"), ("example auto", "example x1"), ("example x1", "example x1 tc"),
         ("gen8 xN", "gen8 x1"), ("gen50 xN", "gen50 x1"), ("gen50 xN", "example auto"), ("check warm", "check cold"))


def cores() -> int:
    sys.path.insert(0, str(REPO_ROOT))
    from stacks.parallel import available_cores

    return available_cores()


def synth_argv(out: Path, clusters: Path) -> list[str]:
    return [GPUFLEET, "synth", "--out", str(out), "--clusters-dir", str(clusters)]


def edit_one_cluster(source: Path, target: Path) -> Path:
    """A copy of the example fleet with one GPU pool's max_nodes changed (one cluster's stacks change)."""
    shutil.copytree(source, target)
    first = sorted(target.glob("*.yaml"))[0]
    text = first.read_text()
    edited = text.replace("max_nodes: ", "max_nodes: 1", 1)
    if edited == text:
        raise RuntimeError(f"{first}: no max_nodes to edit")
    first.write_text(edited)
    return target


def scenarios(work: Path, jobs: int) -> dict[str, tuple[list[str], dict[str, str]]]:
    example = REPO_ROOT / "clusters"
    gen8 = generated_fleet(work / "gen8", range(8))
    gen50 = generated_fleet(work / "gen50")
    edited = edit_one_cluster(example, work / "edited")
    serial, parallel = {"GPUFLEET_SYNTH_JOBS": "1"}, {"GPUFLEET_SYNTH_JOBS": str(jobs)}
    return {
        "example x1": (synth_argv(work / "o1", example), serial),
        "example xN": (synth_argv(work / "o2", example), parallel),
        "example auto": (synth_argv(work / "o3", example), {}),
        "example x1 tc": (synth_argv(work / "o4", example), serial | {"GPUFLEET_JSII_TYPE_CHECKS": "1"}),
        "gen8 x1": (synth_argv(work / "o5", gen8), serial),
        "gen8 xN": (synth_argv(work / "o6", gen8), parallel),
        "gen50 x1": (synth_argv(work / "o7", gen50), serial),
        "gen50 xN": (synth_argv(work / "o8", gen50), parallel),
        "check cold": ([GPUFLEET, "check", "--out", str(work / "c1"), "--clusters-dir", str(example)],
                       {"GPUFLEET_CHECKOV_CACHE": "{fresh}"}),
        "check warm": ([GPUFLEET, "check", "--out", str(work / "c2"), "--clusters-dir", str(edited)],
                       {"GPUFLEET_CHECKOV_CACHE": "{primed}"}),
    }


def measure(argv: list[str], extra: dict[str, str], work: Path, round_: int) -> proctree.Sample:
    env = {k: v for k, v in os.environ.items() if k not in ("GPUFLEET_SYNTH_JOBS", "GPUFLEET_JSII_TYPE_CHECKS")} | ENV
    cache = extra.get("GPUFLEET_CHECKOV_CACHE")
    if cache == "{fresh}":
        extra = extra | {"GPUFLEET_CHECKOV_CACHE": str(work / f"cache-cold-{round_}")}
    elif cache == "{primed}":
        primed = work / f"cache-warm-{round_}"
        # the unedited example fleet fills the cache; the measured run then sees one cluster changed
        subprocess.run([GPUFLEET, "check", "--out", str(work / "prime"), "--clusters-dir", str(REPO_ROOT / "clusters")],
                       cwd=REPO_ROOT, env=env | {"GPUFLEET_CHECKOV_CACHE": str(primed)}, capture_output=True, check=False)
        extra = extra | {"GPUFLEET_CHECKOV_CACHE": str(primed)}
    # check exits 1 when a gate finds something: it still ran every step, so its time counts
    return proctree.measure(argv, cwd=REPO_ROOT, env=env | extra, ok_codes=(0, 1))


def run(runs: int) -> str:
    jobs = cores()
    before = os.getloadavg()
    samples: dict[str, list[proctree.Sample]] = {}
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-parallel-") as tmp:
        work = Path(tmp)
        plan = scenarios(work, jobs)
        for round_ in range(runs + 1):
            for name, (argv, extra) in plan.items():
                sample = measure(argv, extra, work, round_)
                print(f"  {'warm-up' if round_ == 0 else f'run {round_}'} {name}: {sample.wall:.2f} s, "
                      f"tree {sample.tree_kb / 1024:.0f} MB", file=sys.stderr)
                if round_:
                    samples.setdefault(name, []).append(sample)
    after = os.getloadavg()
    wall = {name: statistics.median(s.wall for s in rows) for name, rows in samples.items()}
    lines = [f"Median of {runs} run(s) per scenario, interleaved, after one uncounted warm-up round; N = {jobs} "
             f"(cores this process may use). Load average (1/5/15 min) before: {before[0]:.2f}/{before[1]:.2f}/{before[2]:.2f}; "
             f"after: {after[0]:.2f}/{after[1]:.2f}/{after[2]:.2f}.", "",
             "| scenario | median wall s | min-max s | peak RSS tree MB (median) | peak RSS tree MB (max) |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for name, rows in samples.items():
        walls = [s.wall for s in rows]
        trees = [s.tree_kb / 1024 for s in rows]
        lines.append(f"| {name} | {wall[name]:.2f} | {min(walls):.2f}-{max(walls):.2f} | "
                     f"{statistics.median(trees):.0f} | {max(trees):.0f} |")
    lines += ["", "| ratio | value |", "| --- | ---: |"]
    lines += [f"| {a} / {b} | {wall[a] / wall[b]:.2f}x |" for a, b in PAIRS]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    print(run(parser.parse_args(argv).runs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
