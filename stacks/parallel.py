"""Synthesis split over worker processes, one jsii kernel each, merged into one ``cdktf.out`` layout.

Why processes: a synthesis is mostly jsii messaging between one Python process and one Node
process, so a single kernel keeps about one core busy. A cluster's stacks reference only each
other (the scheduler stack reads its infra stack's outputs) and ``tfc-workspaces`` is derived
from the cluster files alone, so stacks split by cluster synthesize independently.

Why the merge is byte-identical to a serial synthesis: every stack directory is written by
cdktf from that stack's constructs alone, and ``manifest.json`` is rebuilt from the workers'
entries and serialised the way cdktf writes it (``manifest_json``: keys sorted at every level,
an empty list as ``[`` newline ``]``, no trailing newline). ``tests/stacks/test_parallel_synth.py`` compares every file of both trees.

Why a threshold: each worker pays jsii's start and its own provider loading (seconds), so a
fleet of a few clusters is faster in one process; ``PARALLEL_MIN_CLUSTERS`` is where two workers
started to win on 2 cores (``bench/synth_parallel.py``).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from clusters.errors import UserError
from clusters.schema import ClusterConfig
from stacks.layout import StackInfo, plan_stacks

JOBS_ENV = "GPUFLEET_SYNTH_JOBS"
PARALLEL_MIN_CLUSTERS = 8


def available_cores() -> int:
    """Cores this process may run on (its affinity mask, not the machine's count)."""
    counter = getattr(os, "process_cpu_count", None)  # Python 3.13+
    if counter is not None:
        return counter() or 1
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:
        return os.cpu_count() or 1


def requested_jobs(jobs: int | None = None) -> int | None:
    """``--jobs`` if given, else ``GPUFLEET_SYNTH_JOBS``; None means "decide from the fleet and the cores"."""
    if jobs is None:
        raw = os.environ.get(JOBS_ENV, "").strip()
        if not raw:
            return None
        if not raw.isdigit() or int(raw) < 1:
            raise UserError(f"{JOBS_ENV}={raw!r}: not a positive integer; set it to a worker count such as 2, or unset it")
        jobs = int(raw)
    if jobs < 1:
        raise UserError(f"--jobs {jobs}: not a positive integer; pass a worker count such as 2")
    return jobs


def worker_count(clusters: int, jobs: int | None = None) -> int:
    """Processes to synthesize ``clusters`` clusters with: 1 (in-process) below the threshold unless asked."""
    asked = requested_jobs(jobs)
    if asked is None:
        asked = available_cores() if clusters >= PARALLEL_MIN_CLUSTERS else 1
    return max(1, min(asked, clusters))


def partition(info: tuple[StackInfo, ...], workers: int) -> list[tuple[str, ...]]:
    """Stack names per worker: whole clusters dealt round-robin in name order; ``tfc-workspaces`` to the
    last worker, which deals with the fewest clusters when they do not divide evenly."""
    clusters = sorted({s.cluster for s in info if s.cluster})
    groups: list[list[str]] = [[] for _ in range(workers)]
    for index, cluster in enumerate(clusters):
        groups[index % workers].extend(s.name for s in info if s.cluster == cluster)
    groups[-1].extend(s.name for s in info if not s.cluster)
    return [tuple(g) for g in groups if g]


def synth_group(configs: tuple[ClusterConfig, ...], names: tuple[str, ...], outdir: str,
                imported_dir: str | None) -> dict:
    """Worker entry point: synthesize only ``names`` into ``outdir``; returns cdktf's manifest."""
    from cdktf import App

    from stacks.fleet import build_fleet

    app = App(outdir=outdir)
    build_fleet(app, configs, imported_dir=Path(imported_dir) if imported_dir else None, only=names)
    app.synth()
    return json.loads((Path(outdir) / "manifest.json").read_text())


def synthesize_parallel(configs: tuple[ClusterConfig, ...], tmp: Path, workers: int,
                        imported_dir: Path | None = None) -> tuple[str, ...]:
    """Synthesize into ``tmp`` (a fresh staging dir) with ``workers`` processes; returns every stack name."""
    info = plan_stacks(configs)
    groups = partition(info, workers)
    parts = [tmp / f".part-{i}" for i in range(len(groups))]
    context = multiprocessing.get_context("spawn")  # never fork a process that may hold a jsii kernel
    with ProcessPoolExecutor(max_workers=len(groups), mp_context=context) as pool:
        futures = [pool.submit(synth_group, configs, names, str(part), str(imported_dir) if imported_dir else None)
                   for names, part in zip(groups, parts)]
        manifests = [f.result() for f in futures]
    entries: dict[str, dict] = {}
    (tmp / "stacks").mkdir()
    for part, manifest in zip(parts, manifests):
        for name, entry in manifest["stacks"].items():
            entries[name] = entry
            os.replace(part / "stacks" / name, tmp / "stacks" / name)
        shutil.rmtree(part)
    order = [s.name for s in info if s.name in entries]
    (tmp / "manifest.json").write_text(manifest_json({**manifests[0], "stacks": entries}), encoding="utf-8")
    return tuple(order)


def manifest_json(value: object, depth: int = 0) -> str:
    """cdktf's ``manifest.json`` text: sorted keys, two-space indent, empty containers split over two lines."""
    pad, inner = "  " * depth, "  " * (depth + 1)
    if isinstance(value, dict):
        items = [f"{inner}{json.dumps(k, ensure_ascii=False)}: {manifest_json(value[k], depth + 1)}" for k in sorted(value)]
        return "{\n" + ",\n".join(items) + ("\n" if items else "") + pad + "}"
    if isinstance(value, list):
        items = [inner + manifest_json(v, depth + 1) for v in value]
        return "[\n" + ",\n".join(items) + ("\n" if items else "") + pad + "]"
    return json.dumps(value, ensure_ascii=False)
