"""Deterministic, atomic synthesis: build stacks into a temp dir, then swap them into place.

A failed synthesis (bad cluster file, construct error, a Terraform template sequence gpufleet
did not generate) leaves the previous ``cdktf.out`` untouched, so a reviewer never plans against
a half-written or injected tree. The output directory is replaced only if gpufleet made it
(``clusters.outputs``): ``--out .`` or ``--out clusters`` is refused.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from clusters.errors import UserError
from clusters.schema import ClusterConfig, TfcState
from clusters import cache_trust, outputs, termination
from stacks import synth_cache
from stacks.interpolation import check_outdir
from stacks.layout import TFC_WORKSPACES_STACK, StackInfo, plan_stacks
from stacks.parallel import Written

DEFAULT_OUTDIR = Path("cdktf.out")
# jsii prints a banner on every start under Node 20; gpufleet pins Node 20 knowingly.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
os.environ.setdefault("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1")


def _select(configs: tuple[ClusterConfig, ...], only: tuple[str, ...]
            ) -> tuple[tuple[ClusterConfig, ...], tuple[str, ...], tuple[str, ...] | None]:
    """Clusters needed for the requested stacks (a stack needs every stack of its cluster), the requested
    names, and the stacks to build: None (all of those clusters') unless a fleet-wide stack is asked for."""
    info = plan_stacks(configs)
    known = {s.name: s for s in info}
    unknown = [s for s in only if s not in known]
    if unknown:
        raise UserError(f"unknown stack {unknown[0]!r}; known stacks: {', '.join(sorted(known))} (see gpufleet stacks)")
    wanted = {known[s].cluster for s in only}
    if "" in wanted:
        # A fleet-wide stack (tfc-workspaces) is derived from every cluster's file, not from its stacks: every
        # config, but only that stack and the named clusters' stacks are built (200 clusters: 13.1 s to 1.3 s).
        return configs, tuple(sorted(set(only))), tuple(s.name for s in info if s.cluster in wanted)
    return tuple(c for c in configs if c.name in wanted), tuple(sorted(set(only))), None


def synthesize(configs: tuple[ClusterConfig, ...], outdir: Path = DEFAULT_OUTDIR,
               only: tuple[str, ...] = (), imported_dir: Path | None = None, jobs: int | None = None,
               written: Written | None = None) -> tuple[str, ...]:
    """Synthesize the fleet, or only the named stacks, into ``outdir``; returns the stack names written.

    ``imported_dir`` holds the recorded imports (default ``stacks/imported``); ``gpufleet preview``
    points it at another checkout's. ``jobs`` is the number of worker processes (default: from
    ``GPUFLEET_SYNTH_JOBS``, else the cores for a fleet of ``stacks.parallel.PARALLEL_MIN_CLUSTERS``
    clusters or more, else 1 = in this process); the output is the same bytes either way. Stacks
    whose inputs did not change since a synthesis stored them come from ``stacks.synth_cache``.
    ``written`` (``gpufleet check``'s scan) hears each stack directory of the staging tree as soon as
    its files are final, before the whole synthesis is; a synthesis that then fails writes nothing.
    """
    from stacks.imported import imported_dir as default_imported_dir
    from stacks.parallel import synthesize_parallel, worker_count

    # Resolved here, once: a worker process does not see this one's default (``--repo``, a directory set
    # in-process), and the synthesis cache keys the very directory every stack is built from.
    imported_dir = Path(imported_dir) if imported_dir is not None else default_imported_dir()
    build: tuple[str, ...] | None = None
    if only:
        configs, only, build = _select(configs, only)
    built = len(configs) if build is None else len({s.cluster for s in plan_stacks(configs) if s.cluster and s.name in build})
    workers = worker_count(built, jobs)
    outdir = outputs.claim_dir(outdir)
    if only:
        outputs.refuse_symlinks(outdir, "manifest.json", *(f"stacks/{stack}" for stack in only))
    tmp = outputs.staging_dir(outdir)
    try:
        cache = synth_cache.cache_dir()
        cache = cache_trust.prepare(cache, synth_cache.CACHE_ENV) if cache is not None else None
        if cache is not None:
            names = _synthesize_cached(configs, tmp, imported_dir, jobs, cache, shown_as=outdir, written=written, build=build)
        elif workers > 1:  # checks the template sequences as each process finishes its stacks
            names = synthesize_parallel(configs, tmp, workers, imported_dir, names=build, written=written, shown_as=outdir)
        elif written is not None:
            names = _synthesize_streamed(configs, tmp, imported_dir, written, build)
        else:
            names = _synthesize_here(configs, tmp, imported_dir, build)
        if cache is None and workers == 1:
            check_outdir(tmp, shown_as=outdir)
        if only:
            _merge(tmp, outdir, only)
        else:
            outputs.replace_dir(tmp, outdir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return only or names


def _synthesize_here(configs: tuple[ClusterConfig, ...], tmp: Path, imported_dir: Path | None,
                     build: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The whole fleet (or the stacks ``build`` names) in this process's jsii kernel, on one core
    (``stacks.parallel.one_core``)."""
    from constructs_lib.jsii_runtime import direct_kernel
    from stacks.parallel import join_early_kernel, one_core, quiet_gc

    join_early_kernel()
    with one_core(), quiet_gc():
        with direct_kernel():
            from cdktf import App

        from stacks.fleet import build_fleet

        app = App(outdir=str(tmp))
        fleet = build_fleet(app, configs, imported_dir=imported_dir, only=build)
        app.synth()
    return tuple(fleet.stacks)


def _synthesize_streamed(configs: tuple[ClusterConfig, ...], tmp: Path, imported_dir: Path | None, written: Written,
                         build: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The whole fleet (or the stacks ``build`` names) in this process, a batch of clusters at a time
    (``stacks.parallel.synth_streamed``), on one core."""
    from stacks.parallel import one_core, synth_streamed

    with one_core():
        synth_streamed(configs, build or tuple(s.name for s in plan_stacks(configs)), tmp, imported_dir, written)
    return tuple(s.name for s in plan_stacks(configs) if (tmp / "stacks" / s.name).is_dir())


def _units(configs: tuple[ClusterConfig, ...]) -> list[tuple[tuple[ClusterConfig, ...], tuple[StackInfo, ...]]]:
    """What each cached entry holds: one cluster's stacks (built from its config alone; the scheduler
    stack references its infra stack), and ``tfc-workspaces`` on its own, built from the configs of
    every cluster that keeps state in Terraform Cloud (``constructs_lib.tfc_workspaces`` skips the others)."""
    info = plan_stacks(configs)
    by_name = {c.name: c for c in configs}
    tfc = tuple(c for c in sorted(configs, key=lambda c: c.name) if isinstance(c.state, TfcState))
    clusters = sorted({s.cluster for s in info})
    return [((by_name[cluster],) if cluster else tfc, tuple(s for s in info if s.cluster == cluster)) for cluster in clusters]


def _synthesize_cached(configs: tuple[ClusterConfig, ...], tmp: Path, imported_dir: Path, jobs: int | None,
                       cache: Path, shown_as: Path, written: Written | None = None,
                       build: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """Cached units are written from the cache; the others are synthesized (over worker processes
    when there are enough of them), checked for template sequences (``check_outdir``) and only then
    stored, so every cached stack passed that check with the code its key names and is not checked
    again. ``manifest.json`` is rebuilt from every stack's entry exactly as ``stacks.parallel``
    merges workers' manifests, so the tree is a cold synthesis's bytes.

    With ``written`` (``gpufleet check``'s checkov stream), the misses are synthesized first and the hits
    written after: in a one-cluster edit the edited cluster's stacks reach the stream about a second
    earlier at 200 clusters, while this process writes the rest. The hits are held meanwhile (the cached
    fleet's text: about 30 MB at 200 clusters); without ``written`` each is written as it is found."""
    from stacks.parallel import manifest_json, one_core, synth_group, synth_streamed, synthesize_parallel, worker_count

    top: dict | None = None  # the manifest's top: the last miss's, else the last hit's
    hit_top: dict | None = None
    entries: dict[str, dict] = {}
    missing: list[tuple[str, tuple[str, ...]]] = []
    hits: list[tuple[dict, tuple[str, ...]]] = []
    inputs: dict[str, tuple[tuple[ClusterConfig, ...], tuple[StackInfo, ...]]] = {}
    (tmp / "stacks").mkdir()

    def write_hit(hit: dict, names: tuple[str, ...]) -> dict:
        """Write a cached unit into ``tmp``, tell ``written`` its stacks, keep their entries; its manifest top."""
        synth_cache.write_unit(hit, tmp)
        for name in names if written is not None else ():
            written(tmp / "stacks" / name)
        entries.update({name: hit["stacks"][name]["manifest"] for name in names})
        return hit["top"]

    for unit_configs, stacks in _units(configs):
        if build is not None and not any(s.name in build for s in stacks):
            continue
        key = synth_cache.unit_key(unit_configs, stacks, imported_dir)
        names = tuple(s.name for s in stacks)
        hit = synth_cache.load(cache, key, names)
        if hit is None:
            missing.append((key, names))
            inputs[key] = (unit_configs, stacks)
            continue
        if written is None:
            hit_top = write_hit(hit, names)
        else:
            hits.append((hit, names))
    if missing:
        build = tuple(name for _, names in missing for name in names)
        fresh = tmp / ".fresh"
        fresh.mkdir()
        workers = worker_count(max(1, sum(1 for _, names in missing if names[0] != TFC_WORKSPACES_STACK)), jobs)
        if workers > 1:
            synthesize_parallel(configs, fresh, workers, imported_dir, names=build, written=written)
            manifest = json.loads((fresh / "manifest.json").read_text())
        elif written is not None:
            with one_core():
                manifest = synth_streamed(configs, build, fresh, imported_dir, written)
        else:
            manifest = synth_group(configs, build, fresh, imported_dir)
        check_outdir(fresh, shown_as=shown_as, stacks=build)
        # The constructs imported code and read recorded imports while synthesizing: an input edited
        # meanwhile (a checkout during a check) must not put its stacks under the key of the old one.
        synth_cache.code_digest.cache_clear()
        for key, names in missing:
            unit = synth_cache.read_unit(fresh, manifest, names)
            if synth_cache.unit_key(*inputs[key], imported_dir) == key:
                synth_cache.store(cache, key, unit)
            for name in names:
                os.replace(fresh / "stacks" / name, tmp / "stacks" / name)
            top = unit["top"]
            entries.update({name: unit["stacks"][name]["manifest"] for name in names})
        shutil.rmtree(fresh)
    hits.reverse()
    while hits:  # in their order, each let go once written
        hit_top = write_hit(*hits.pop())
    if not missing:
        top = hit_top
    order = tuple(s.name for s in plan_stacks(configs) if s.name in entries)
    (tmp / "manifest.json").write_text(manifest_json({**(top or {}), "stacks": entries}), encoding="utf-8")
    return order


def _swap(new: Path, target: Path) -> None:
    """Swap one stack directory inside a gpufleet-made output directory."""
    old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=target.parent))
    if target.exists():
        os.replace(target, old)
    os.replace(new, target)
    shutil.rmtree(old, ignore_errors=True)


def _merge(new: Path, target: Path, stacks: tuple[str, ...]) -> None:
    """Replace only the requested stack directories; add manifest entries only for new stacks.

    A stack's manifest entry depends on its name alone, so an existing manifest that already
    lists the stack is left byte-for-byte as cdktf wrote it.
    """
    outputs.ensure_dir(target)
    outputs.refuse_symlinks(target, "manifest.json", *(f"stacks/{stack}" for stack in stacks))
    (target / "stacks").mkdir(exist_ok=True)
    with termination.held():  # a SIGTERM acts once every stack and the manifest are swapped, not between two renames
        _merge_stacks(new, target, stacks)


def _merge_stacks(new: Path, target: Path, stacks: tuple[str, ...]) -> None:
    """``_merge``'s swaps and manifest update, one step a SIGTERM does not cut (``termination.held``)."""
    for stack in stacks:
        _swap(new / "stacks" / stack, target / "stacks" / stack)
    from stacks.parallel import manifest_json

    manifest_path = target / "manifest.json"
    if not manifest_path.exists():
        # Only the stacks written here: the synthesis built whole clusters (and named them all), and a manifest
        # listing a stack whose directory is not there sends cdktf looking for it.
        fresh = json.loads((new / "manifest.json").read_text())
        fresh["stacks"] = {name: entry for name, entry in fresh["stacks"].items() if name in stacks}
        outputs.write_file(manifest_path, manifest_json(fresh), option="--out")
        return
    manifest = json.loads(manifest_path.read_text())
    missing = [s for s in stacks if s not in manifest.get("stacks", {})]
    if missing:
        fresh = json.loads((new / "manifest.json").read_text())
        manifest["stacks"] = dict(sorted({**manifest.get("stacks", {}), **{s: fresh["stacks"][s] for s in missing}}.items()))
        outputs.write_file(manifest_path, manifest_json(manifest), option="--out")  # cdktf's layout, as a whole synthesis
