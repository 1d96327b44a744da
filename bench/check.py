"""A 200-cluster fleet: synthesis serial and over 2 processes, and `gpufleet check` cold and after a one-cluster edit.

One command, every scenario in a fresh process, interleaved round by round; medians, the
issue's ratios side by side, the load average printed:

    .venv/bin/python bench/check.py [--clusters 200] [--runs 1] [--small-runs 3] [--synth-only] [--workdir DIR] [--write]

  example synth      `gpufleet synth` of the example fleet (clusters/, 4 clusters), default workers
  fleet synth x1     the generated fleet (bench/fleetgen.py, plus the 4 example clusters the job files
                     name) in one process (GPUFLEET_SYNTH_JOBS=1)
  fleet synth x2     the same with `--jobs 2`
  fleet check cold   `gpufleet check` with empty synthesis and checkov caches
  fleet check 1 edit `gpufleet check` after one cluster file changed, both caches holding the
                     unedited fleet (filled by that round's cold check; each round edits another value)
  fleet synth 1      `gpufleet synth <one stack>` of the fleet (the edited cluster's infra stack)

Every synthesis scenario runs with the synthesis cache off (cold), so only the check scenarios
use it. ``--synth-only`` leaves out the two check scenarios (a cold check is checkov over every
stack, minutes at 200 clusters) and the goal rows that need them. "Heavy" scenarios (the whole fleet) run --runs times, the others --small-runs times.
Where the fleets, outputs and caches live (``--workdir``): by default ``.gpufleet/bench/`` in the repository,
beside ``cdktf.out``, where a user's synthesis writes; a fleet's synthesis writes about 1,200 directories and
files and the example's about 30, so a filesystem slow at creating them weighs on the fleet alone. The header
prints what creating a directory and a small file cost there (on the machine of issue 28's seventh round, /tmp
took 150-580 us for each, the repository's directory 20-170 us, on the same ext4 device: it varies from minute to
minute, so read the header of each run).
Peak RSS "tree" is the largest sum of VmRSS over the command and all its descendants (worker
processes, Node kernels, checkov), sampled every 20 ms (bench/proctree.py). ``--write`` replaces
this bench's section of BENCHMARKS.md (bench/mdsection.py).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import proctree
from fleetgen import generated_fleet
from mdsection import replace_section

REPO_ROOT = Path(__file__).resolve().parents[1]
GPUFLEET = str(Path(sys.executable).with_name("gpufleet"))
ENV = {"JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20", "JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION": "1",
       "CHECKPOINT_DISABLE": "1", "BC_SKIP_MAPPING": "TRUE"}
HEAVY = ("fleet synth x1", "fleet synth x2", "fleet check cold")
EDITED = "gen-00"
# (label, numerator, denominator, limit): the goals
GOALS = (("fleet synth x2 / example synth", "fleet synth x2", "example synth", 4.0),
         ("fleet synth x1 / example synth", "fleet synth x1", "example synth", None),
         ("fleet synth x2 / fleet synth x1", "fleet synth x2", "fleet synth x1", None),
         ("fleet check cold / fleet synth x1", "fleet check cold", "fleet synth x1", 2.0),
         # the stricter reading: `gpufleet synth` of a fleet this size on an idle 2-core machine is x2, and the
         # check's own synthesis uses as many processes, so this row compares like with like
         ("fleet check cold / fleet synth x2", "fleet check cold", "fleet synth x2", 2.0),
         ("fleet check 1 edit / fleet synth 1", "fleet check 1 edit", "fleet synth 1", 2.0))
RSS_GOAL_MB = 1024


def fleet(work: Path, clusters: int) -> Path:
    """``clusters`` cluster files: the 4 example clusters (the job files name them) and generated ones."""
    directory = work / "fleet"
    examples = sorted((REPO_ROOT / "clusters").glob("*.yaml"))
    generated_fleet(directory, range(clusters - len(examples)))
    for path in examples:
        shutil.copy2(path, directory / path.name)
    return directory


def edit(source: Path, target: Path, round_: int) -> Path:
    """A copy of the fleet with one value of one cluster changed, a different value each round."""
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source, target)
    path = target / f"{EDITED}.yaml"
    text = path.read_text()
    edited = text.replace('"max_nodes": 4', f'"max_nodes": {4 + round_}', 1)
    if edited == text:
        raise RuntimeError(f"{path}: no max_nodes to edit")
    path.write_text(edited)
    return target


def measure(name: str, argv: list[str], extra: dict[str, str]) -> proctree.Sample:
    env = {k: v for k, v in os.environ.items() if k not in ("GPUFLEET_SYNTH_JOBS", "GPUFLEET_JSII_TYPE_CHECKS")} | ENV | extra
    # check exits 1 when a gate finds something: it still ran every step, so its time counts
    sample = proctree.measure(argv, cwd=REPO_ROOT, env=env, ok_codes=(0, 1))
    print(f"  {name}: {sample.wall:.2f} s, tree {sample.tree_kb / 1024:.0f} MB, exit {sample.exit_code}", file=sys.stderr, flush=True)
    return sample


def filesystem_probe(directory: Path, count: int = 200) -> tuple[float, float]:
    """Microseconds to create a directory, and a 2 kB file in it, under ``directory`` (means over ``count``)."""
    with tempfile.TemporaryDirectory(prefix="probe-", dir=directory) as tmp:
        start = time.perf_counter()
        for index in range(count):
            os.mkdir(f"{tmp}/d{index}")
        made = time.perf_counter()
        for index in range(count):
            with open(f"{tmp}/d{index}/f", "wb") as handle:
                handle.write(b"x" * 2000)
        written = time.perf_counter()
    return (made - start) / count * 1e6, (written - made) / count * 1e6


def run(clusters: int, runs: int, small_runs: int, synth_only: bool = False, workdir: Path | None = None) -> dict:
    workdir = workdir or REPO_ROOT / ".gpufleet" / "bench"
    workdir.mkdir(parents=True, exist_ok=True)
    probe = filesystem_probe(workdir)
    before = os.getloadavg()
    samples: dict[str, list[proctree.Sample]] = {}
    off = {"GPUFLEET_SYNTH_CACHE": "off"}
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-check-", dir=workdir) as tmp:
        work = Path(tmp)
        source = fleet(work, clusters)
        synth = lambda out, where, *more: [GPUFLEET, "synth", *more, "--out", str(work / out), "--clusters-dir", str(where)]  # noqa: E731
        measure("warm-up (uncounted): example synth", synth("w", REPO_ROOT / "clusters"), off)
        caches: dict[str, str] = {}
        for round_ in range(1, max(runs, small_runs) + 1):
            heavy = round_ <= runs
            edited = edit(source, work / "edited", round_)
            plan: list[tuple[str, list[str], dict[str, str]]] = [("example synth", synth("e", REPO_ROOT / "clusters"), off)]
            if heavy:
                caches = {"GPUFLEET_SYNTH_CACHE": str(work / f"synth-cache-{round_}"),
                          "GPUFLEET_CHECKOV_CACHE": str(work / f"checkov-cache-{round_}")}
                plan += [("fleet synth x1", synth("s1", source), off | {"GPUFLEET_SYNTH_JOBS": "1"}),
                         ("fleet check cold", [GPUFLEET, "check", "--out", str(work / "c1"), "--clusters-dir", str(source)], caches),
                         ("fleet synth x2", synth("s2", source, "--jobs", "2"), off)]
            plan += [("fleet check 1 edit", [GPUFLEET, "check", "--out", str(work / "c2"), "--clusters-dir", str(edited)], caches),
                     ("fleet synth 1", synth("s3", edited, EDITED), off)]
            if synth_only:
                plan = [step for step in plan if not step[0].startswith("fleet check")]
            print(f"round {round_}", file=sys.stderr, flush=True)
            for name, argv, extra in plan:
                samples.setdefault(name, []).append(measure(name, argv, extra))
    return {"samples": samples, "load": (before, os.getloadavg()), "clusters": clusters, "runs": runs, "small_runs": small_runs,
            "workdir": workdir, "probe": probe}


def _shown(path: Path) -> str:
    return f"{path.relative_to(REPO_ROOT)}/ in the repository" if path.is_relative_to(REPO_ROOT) else f"{path}/"


def render(result: dict) -> str:
    samples = result["samples"]
    wall = {name: statistics.median(s.wall for s in rows) for name, rows in samples.items()}
    tree = {name: max(s.tree_kb for s in rows) / 1024 for name, rows in samples.items()}
    before, after = result["load"]
    lines = [f"{result['clusters']} clusters ({result['clusters'] - 4} generated by bench/fleetgen.py, 6 GPU pools each, plus the 4 "
             f"example clusters); heavy scenarios (whole fleet) {result['runs']} run(s), the others median of "
             f"{result['small_runs']}, interleaved, after one uncounted example synthesis. "
             f"Load average (1/5/15 min) before: {before[0]:.2f}/{before[1]:.2f}/{before[2]:.2f}; "
             f"after: {after[0]:.2f}/{after[1]:.2f}/{after[2]:.2f} (2 cores). Work directory: "
             f"{_shown(result['workdir'])} (creating a directory {result['probe'][0]:.0f} us, a 2 kB file "
             f"{result['probe'][1]:.0f} us).", "",
             "| scenario | runs | median wall s | min-max s | peak RSS tree MB (max) | exit codes |",
             "| --- | ---: | ---: | ---: | ---: | --- |"]
    for name, rows in samples.items():
        walls = [s.wall for s in rows]
        lines.append(f"| {name} | {len(rows)} | {wall[name]:.2f} | {min(walls):.2f}-{max(walls):.2f} | {tree[name]:.0f} | "
                     f"{sorted({s.exit_code for s in rows})} |")
    lines += ["", "| goal | measured | limit | met |", "| --- | ---: | ---: | --- |"]
    for label, num, den, limit in GOALS:
        if num not in wall or den not in wall:
            continue
        ratio = wall[num] / wall[den]
        lines.append(f"| {label} | {ratio:.2f}x | {f'<= {limit}x' if limit else '-'} | "
                     f"{('yes' if ratio <= limit else 'NO') if limit else '-'} |")
    for name in ("fleet synth x1", "fleet synth x2"):
        lines.append(f"| {name}: peak RSS of all processes | {tree[name]:.0f} MB | <= {RSS_GOAL_MB} MB | "
                     f"{'yes' if tree[name] <= RSS_GOAL_MB else 'NO'} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clusters", type=int, default=200)
    parser.add_argument("--runs", type=int, default=1, help="runs of the whole-fleet scenarios")
    parser.add_argument("--small-runs", type=int, default=3, help="runs of the example and one-cluster scenarios")
    parser.add_argument("--synth-only", action="store_true", help="leave out the check scenarios (checkov over every stack)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where the fleets, outputs and caches go (default: .gpufleet/bench/ in the repository)")
    parser.add_argument("--write", action="store_true", help="replace this bench's section of BENCHMARKS.md")
    args = parser.parse_args(argv)
    table = render(run(args.clusters, args.runs, args.small_runs, args.synth_only, args.workdir and args.workdir.resolve()))
    print(table)
    if args.write:
        command = " ".join(["python bench/check.py", *argv])
        replace_section(REPO_ROOT / "BENCHMARKS.md", "bench/check.py", "\n".join([
            "## 200 clusters: synthesis and incremental check (bench/check.py)", "",
            f"<!-- Generated by `{command}`. Rerun to refresh. -->", "",
            f"`.venv/bin/{command}`, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC.", "", table]))
        print("wrote BENCHMARKS.md")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
