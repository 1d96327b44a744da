"""How close does gpufleet's synthesis come to the jsii floor, and what do naive imports cost?

One command, one run, every scenario in fresh processes, interleaved over several rounds so
drift on a shared machine hits all of them alike:

    .venv/bin/python bench/synth.py [--runs 5] [--write]      (``make bench`` passes --write)

  floor      start jsii and load the assemblies the example fleet needs, nothing else
  floor lazy the same, with the lazy index.js tarballs gpufleet hands the kernel
  synth      gpufleet's synthesis of the example fleet (clusters/*.yaml)
  synth -O   the same under ``python -O`` (skips the generated typeguard checks)
  naive      the same synthesis importing providers the packaged way
  fleet50    a generated fleet of 50 clusters x 6 GPU pools (files in a temp dir); also with -O,
             and split over 2 concurrent processes of 25 clusters (what sharding would give)
  check      ``gpufleet check`` on the example fleet (load, synth, secret scan, checkov)

Wall time is measured by this process from spawn to reap. Peak RSS is sampled from /proc
every 20 ms: "tree" is the largest sum of VmRSS over the child and all its descendants
(Python, the jsii Node process, terraform and checkov children), "python" and "node" are
the VmHWM high-water marks of those processes. ``--write`` replaces this bench's section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import proctree
from fleetgen import generated_fleet
from proctree import Sample

REPO_ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
GPUFLEET = str(Path(PYTHON).with_name("gpufleet"))
# Bytecode for every scenario (including -O's .opt-1.pyc) lives here, warmed by a first
# uncounted round: users run with a warm bytecode cache, whatever this shell's
# PYTHONDONTWRITEBYTECODE says, and .venv is shared, so it is not written into.
PYCACHE = REPO_ROOT / ".gpufleet" / "bench-pycache"
TARGETS = (
    # (label, numerator, denominator, limit, kind)
    ("example synthesis / jsii floor", "synth", "floor", 1.3, "max"),
    ("naive imports / example synthesis", "naive", "synth", 3.0, "min"),
    ("50 clusters x 6 pools / example synthesis", "fleet50", "synth", 1.5, "max"),
    ("gpufleet check (incl. checkov) / example synthesis", "check", "synth", 2.0, "max"),
)
RSS_TARGET_MB = 400
ENV = {"JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20", "JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION": "1",
       "CHECKPOINT_DISABLE": "1", "BC_SKIP_MAPPING": "TRUE"}
# ---------------------------------------------------------------- children (fresh processes)

def child_floor(packages: list[str], lazy_js: bool) -> dict:
    import cdktf  # noqa: F401  (starts jsii, loads the cdktf and constructs assemblies)

    from constructs_lib import providers

    for package in packages:
        providers.load_assembly(package, lazy_js=lazy_js)
    return {}


def child_synth(outdir: Path, clusters_dir: Path | None, naive: bool) -> dict:
    """Same calls as main.py; phase times show where the wall time goes."""
    start = time.perf_counter()
    import cdktf  # noqa: F401

    imported = time.perf_counter()
    import clusters
    from constructs_lib import providers
    from stacks.synth import synthesize

    if naive:
        providers.use_naive_imports()
    provider_seconds = [0.0]
    original = providers.ProviderPackage.__getattr__

    def timed(self, name):
        begin = time.perf_counter()
        try:
            return original(self, name)
        finally:
            provider_seconds[0] += time.perf_counter() - begin

    providers.ProviderPackage.__getattr__ = timed
    configs = clusters.load_all(clusters_dir) if clusters_dir else clusters.load_all()
    loaded = time.perf_counter()
    synthesize(configs, outdir)
    done = time.perf_counter()
    roots = sorted({m.split(".")[0] for m in sys.modules if m.startswith("cdktf_cdktf_provider_")})
    return {"providers": roots, "phases": {
        "import cdktf (jsii start)": imported - start,
        "load cluster files": loaded - imported,
        "provider loading": provider_seconds[0],
        "constructs + app.synth": done - loaded - provider_seconds[0],
    }, "clusters": len(configs)}


def child_shards(outdir: Path, shard_dirs: list[Path]) -> dict:
    """What sharding synthesis by cluster across processes would give (one jsii each)."""
    me = str(Path(__file__).resolve())
    procs = [subprocess.Popen([sys.executable, *(["-O"] if not __debug__ else []), me, "--child", "synth",
                               "--out", str(outdir / str(i)), "--clusters-dir", str(d)], stdout=subprocess.DEVNULL)
             for i, d in enumerate(shard_dirs)]
    if any(p.wait() != 0 for p in procs):
        raise RuntimeError("a shard failed")
    return {}


def _child_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=["floor", "synth", "shards"])
    parser.add_argument("--packages", default="")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--clusters-dir", type=Path, action="append")
    parser.add_argument("--naive", action="store_true")
    parser.add_argument("--lazy-js", action="store_true")
    args = parser.parse_args(argv)
    if args.kind == "floor":
        report = child_floor([p for p in args.packages.split(",") if p], args.lazy_js)
    elif args.kind == "shards":
        report = child_shards(args.out, args.clusters_dir)
    else:
        report = child_synth(args.out, args.clusters_dir[0] if args.clusters_dir else None, args.naive)
    print("BENCH " + json.dumps(report))


# ---------------------------------------------------------------- measuring (bench/proctree.py)

def measure(cmd: list[str], ok_codes: tuple[int, ...] = (0,)) -> Sample:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"} | ENV
    env["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    return proctree.measure(cmd, cwd=REPO_ROOT, env=env, ok_codes=ok_codes)


# ---------------------------------------------------------------- scenarios

def scenarios(work: Path, packages: list[str]) -> dict[str, tuple[str, list[str]]]:
    """name -> (command as documented, argv); every output goes under ``work``."""
    me = str(Path(__file__).resolve())
    fleet50 = generated_fleet(work / "fleet50-clusters")
    halves = [generated_fleet(work / "fleet50-half-a", range(25)), generated_fleet(work / "fleet50-half-b", range(25, 50))]
    synth = [me, "--child", "synth", "--out"]
    return {
        "floor": ("python bench/synth.py --child floor", [PYTHON, me, "--child", "floor", "--packages", ",".join(packages)]),
        "floor lazy": ("... --child floor --lazy-js",
                       [PYTHON, me, "--child", "floor", "--packages", ",".join(packages), "--lazy-js"]),
        "synth": ("python bench/synth.py --child synth", [PYTHON, *synth, str(work / "synth")]),
        "synth -O": ("python -O bench/synth.py --child synth", [PYTHON, "-O", *synth, str(work / "synth-O")]),
        "naive": ("... --child synth --naive", [PYTHON, *synth, str(work / "naive"), "--naive"]),
        "fleet50": ("... --child synth --clusters-dir <50 generated files>",
                    [PYTHON, *synth, str(work / "fleet50"), "--clusters-dir", str(fleet50)]),
        "fleet50 -O": ("python -O ... --clusters-dir <50 generated files>",
                       [PYTHON, "-O", *synth, str(work / "fleet50-O"), "--clusters-dir", str(fleet50)]),
        # check exits 1 when a gate finds something: it still ran every step, so its time counts.
        "fleet50 2 procs -O": ("python -O ... --child shards (25 clusters per process, concurrently)",
                               [PYTHON, "-O", me, "--child", "shards", "--out", str(work / "fleet50-shards"),
                                "--clusters-dir", str(halves[0]), "--clusters-dir", str(halves[1])]),
        "check": ("gpufleet check --out <tmp>", [GPUFLEET, "check", "--out", str(work / "check")]),
    }


def run(runs: int) -> dict:
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-") as tmp:
        work = Path(tmp)
        me = str(Path(__file__).resolve())
        # Tells us which providers the fleet loads; the first counted round needs them for the floor.
        packages = measure([PYTHON, me, "--child", "synth", "--out", str(work / "probe")]).report["providers"]
        plan = scenarios(work, packages)
        samples: dict[str, list[Sample]] = {name: [] for name in plan}
        for round_ in range(runs + 1):
            for name, (_, argv) in plan.items():
                sample = measure(argv, (0, 1) if name == "check" else (0,))
                print(f"  {'warm-up' if round_ == 0 else f'run {round_}'} {name}: {sample.wall:.2f} s, "
                      f"tree {sample.tree_kb / 1024:.0f} MB", file=sys.stderr)
                if round_:
                    samples[name].append(sample)
        shutil.rmtree(work, ignore_errors=True)
    return {"plan": {name: doc for name, (doc, _) in plan.items()}, "samples": samples, "packages": packages,
            "load": (load_before, os.getloadavg()), "runs": runs}


# ---------------------------------------------------------------- reporting

def _median(values: list[float]) -> float:
    return statistics.median(values)


def summarize(result: dict) -> dict[str, dict]:
    rows = {}
    for name, samples in result["samples"].items():
        walls = [s.wall for s in samples]
        phases: dict[str, list[float]] = {}
        for s in samples:
            for phase, seconds in s.report.get("phases", {}).items():
                phases.setdefault(phase, []).append(seconds)
        rows[name] = {"wall": _median(walls), "min": min(walls), "max": max(walls),
                      "tree_mb": _median([s.tree_kb for s in samples]) / 1024,
                      "python_mb": _median([s.python_kb for s in samples]) / 1024,
                      "node_mb": _median([s.node_kb for s in samples]) / 1024,
                      "phases": {p: _median(v) for p, v in phases.items()}}
    return rows


def machine() -> list[str]:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem_kb = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                  if line.startswith("MemTotal"))
    node = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip()
    from importlib.metadata import version

    return [f"- CPU: {cpu}; nproc: {os.cpu_count()}; memory: {mem_kb / 1024 / 1024:.1f} GiB",
            f"- Python {platform.python_version()}, Node {node}, jsii {version('jsii')}, cdktf {version('cdktf')}"]


def render(result: dict) -> str:
    rows = summarize(result)
    base = rows["synth"]["wall"]
    before, after = result["load"]
    lines = [f"Median of {result['runs']} runs per scenario, interleaved; after one uncounted warm-up round of every scenario (jsii package cache and bytecode cache warm).",
             f"Providers the example fleet loads: {', '.join(result['packages'])}.",
             f"Load average (1/5/15 min) before: {before[0]:.2f}/{before[1]:.2f}/{before[2]:.2f}; "
             f"after: {after[0]:.2f}/{after[1]:.2f}/{after[2]:.2f}.", "",
             "| scenario | command | median wall s | min-max s | x example synth | peak RSS tree MB | python MB | node MB |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, row in rows.items():
        lines.append(f"| {name} | `{result['plan'][name]}` | {row['wall']:.2f} | {row['min']:.2f}-{row['max']:.2f} | "
                     f"{row['wall'] / base:.2f} | {row['tree_mb']:.0f} | {row['python_mb']:.0f} | {row['node_mb']:.0f} |")
    codes = sorted({s.exit_code for s in result["samples"]["check"]})
    lines += ["", f"`gpufleet check` exit codes: {codes} (1 = a gate reported findings; every step still ran)."]
    lines += ["", "| target | measured | limit | met |", "| --- | ---: | ---: | --- |"]
    for label, num, den, limit, kind in TARGETS:
        ratio = rows[num]["wall"] / rows[den]["wall"]
        met = ratio <= limit if kind == "max" else ratio >= limit
        lines.append(f"| {label} | {ratio:.2f}x | {'<=' if kind == 'max' else '>='} {limit}x | {'yes' if met else 'NO'} |")
    lines.append(f"| (info) example synthesis / floor with lazy index.js | "
                 f"{rows['synth']['wall'] / rows['floor lazy']['wall']:.2f}x | - | - |")
    for scope, key in (("process tree (python + node + terraform)", "tree_mb"), ("python process", "python_mb")):
        peak = rows["synth"][key]
        lines.append(f"| example synthesis peak RSS, {scope} | {peak:.0f} MB | <= {RSS_TARGET_MB} MB | "
                     f"{'yes' if peak <= RSS_TARGET_MB else 'NO'} |")
    lines += ["", "Where the time goes (medians, seconds, measured inside the child process):", "",
              "| scenario | " + " | ".join(rows["synth"]["phases"]) + " | interpreter + exit |",
              "| --- |" + " ---: |" * (len(rows["synth"]["phases"]) + 1)]
    for name, row in rows.items():
        if row["phases"]:
            rest = row["wall"] - sum(row["phases"].values())
            lines.append(f"| {name} | " + " | ".join(f"{v:.2f}" for v in row["phases"].values()) + f" | {rest:.2f} |")
    return "\n".join(lines)


def write_benchmarks(table: str, argv: list[str]) -> Path:
    """Only this bench's section of BENCHMARKS.md (between its markers, bench/mdsection.py): the other
    benches' sections and the prose around them stay as they are."""
    from mdsection import replace_section

    command = " ".join(["python bench/synth.py", *argv])
    return replace_section(REPO_ROOT / "BENCHMARKS.md", "bench/synth.py", "\n".join([
        f"<!-- Generated by `{command}` (`make bench`). Do not edit by hand: rerun to refresh. -->",
        "",
        f"Generated {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC by `{command}`.",
        "",
        "## Machine",
        "",
        *machine(),
        "",
        "## Synthesis (bench/synth.py)",
        "",
        "```text",
        __doc__.split("\n\n", 2)[2].strip(),
        "```",
        "",
        table,
    ]))


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        _child_main(argv[1:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--write", action="store_true", help="replace this bench's section of BENCHMARKS.md (between its markers)")
    args = parser.parse_args(argv)
    table = render(run(args.runs))
    print(table)
    if args.write:
        print(f"wrote {write_benchmarks(table, argv)}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO_ROOT))
    sys.exit(main(sys.argv[1:]))
