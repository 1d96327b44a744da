"""Synthesis split over worker processes, one jsii kernel each, merged into one ``cdktf.out`` layout.

Why processes: a synthesis is mostly jsii messaging between one Python process and one Node
process, so a single kernel keeps about one core busy. A cluster's stacks reference only each
other (the scheduler stack reads its infra stack's outputs) and ``tfc-workspaces`` is derived
from the cluster files alone, so stacks split by cluster synthesize independently.

Why the merge is byte-identical to a serial synthesis: every stack directory is written by
cdktf from that stack's constructs alone, and ``manifest.json`` is rebuilt from the workers'
entries and serialised the way cdktf writes it (``manifest_json``: keys sorted at every level,
an empty list as ``[`` newline ``]``, no trailing newline). ``tests/stacks/test_parallel_synth.py`` compares every file of both trees.

This process synthesizes one share itself while the others run in ``python -m stacks.parallel``
workers (plain interpreters started with a job file: no ``fork`` of a process that may hold a
jsii kernel, no re-import of the caller's ``__main__``), so N jobs means N-1 extra processes.

Why a threshold and a load check: each worker pays jsii's start and its own provider loading
(about 3.7 CPU-seconds more than one process for a 50-cluster fleet, ``/usr/bin/time``), which
a free core hides and a busy one does not: on a 2-core machine at load 8-10 two processes were
slower than one for 4, 8 and 50 clusters (BENCHMARKS.md). So by default a fleet below
``PARALLEL_MIN_CLUSTERS`` (an estimate for idle cores: half of 8 clusters' per-cluster time
outweighs a worker's start latency; not confirmed on an idle machine here) and a machine without
an idle core synthesize in one process.

Why each synthesis runs on one core (``one_core``): a kernel round trip is a write that wakes the
other process and a read that sleeps until it answers, so a Python process and its Node kernel
never run at the same time. On two cores they wake each other across cores (an inter-processor
wake-up per message, and a core that went idle in between); on one, the writer's sleep hands the
core straight to the reader. Pinned, 44 generated clusters took 30% less wall time at the same CPU
time (load 11-14). So the process pins itself, and the kernel it starts inherits the mask: this
process's share to the core it is on, worker ``i`` to the ``i``-th core after it (round the
allowed ones), a single process to the core it is on. The thread's mask is restored afterwards;
a kernel started while pinned (and jsii's stderr reader thread) keeps that core for the rest of the
process (in a test session too); it runs mostly while a caller waits on it.
A sandbox that refuses ``sched_setaffinity`` gets an unpinned synthesis.
"""

from __future__ import annotations

import gc
import json
import os
import pickle
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from clusters.errors import UserError
from clusters.schema import ClusterConfig
from clusters.termination import EXIT_INTERRUPTED, EXIT_TERMINATED, Terminated, exit_now, sigterm_unwinds
from stacks import interpolation
from stacks.layout import StackInfo, plan_stacks

CODE_ROOT = Path(__file__).resolve().parent.parent
JOBS_ENV = "GPUFLEET_SYNTH_JOBS"
PARALLEL_MIN_CLUSTERS = 8
# Workers started by ``early_workers`` that wait for a job, and the cores they were given in that order.
_early: list[subprocess.Popen] = []
_early_cores: list[int] = []
_early_kernel: list[threading.Thread] = []
# Clusters per App when a caller wants each stack as soon as it is written (``synth_streamed``).
STREAM_CLUSTERS = 10
# How long a worker asked to stop (SIGTERM) may take to remove its files before it is killed.
# Past jsii's own exit hook at its slowest (5 s for a busy kernel, 5 s for its stderr reader), and well inside
# the grace (clusters.termination.GRACE_SECONDS): a worker using all of its own would outlive this process's,
# which would then end before it can kill the worker or remove the staging directory.
STOP_SECONDS = 12.0
# Told each stack directory (under the staging tree) once its files are written and final.
Written = Callable[[Path], None]


def available_cores() -> int:
    """Cores this process may run on (its affinity mask, not the machine's count)."""
    counter = getattr(os, "process_cpu_count", None)  # Python 3.13+
    if counter is not None:
        return counter() or 1
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:
        return os.cpu_count() or 1


def current_core() -> int | None:
    """The core this thread runs on now (field 39 of ``/proc/thread-self/stat``), or None where unknown."""
    try:
        return int(Path("/proc/thread-self/stat").read_text().rsplit(")", 1)[1].split()[36])
    except (OSError, ValueError, IndexError):
        return None


@contextmanager
def one_core(core: int | None = None) -> Iterator[None]:
    """Run this thread, and every process it starts meanwhile, on ``core`` (default: the one it is on)."""
    try:
        allowed = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        yield
        return
    core = current_core() if core is None else core
    if core is None or core not in allowed or len(allowed) == 1 or not _set_affinity({core}):
        yield
        return
    try:
        yield
    finally:
        _set_affinity(allowed)


@contextmanager
def quiet_gc() -> Iterator[None]:
    """Python's cyclic garbage collector held back while this thread synthesizes, then as it was.

    A synthesis allocates steadily (each kernel message builds and drops dictionaries and lists), so
    the youngest generation is collected every 700 allocations, and every tenth of those the next, and
    the full collections walk everything alive, most of it the loaded cluster configs, cdktf's modules
    and the jsii proxies, which live as long as the synthesis does. Here what exists when the synthesis
    starts is set aside (``gc.freeze``) and the youngest generation collects every 50,000 allocations:
    about 2% of a 200-cluster synthesis's CPU (bench/check.py, issue 28's seventh round) for a few MB.
    Collection only decides when unreachable objects are freed; nothing the synthesis writes depends on
    it (cdktf's Python objects define no ``__del__``; jsii 1.142.0's one, its kernel process's, belongs to
    an object that lives as long as this process). The same settings as the checkov
    worker's (``safety/checkov_worker.py``, ``lighten``), without its ``gc.collect`` first: the objects
    set aside are handed back at the end (``gc.unfreeze``), where a later collection frees any of them
    that died, and so are the thresholds; the settings are the whole process's, as always."""
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def _set_affinity(cores: set[int]) -> bool:
    """Pin this thread to ``cores``; False where that is refused (a sandbox's EPERM, a core taken away
    meanwhile): pinning only saves time, so a synthesis goes on unpinned."""
    try:
        os.sched_setaffinity(0, cores)
    except OSError:
        return False
    return True


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


def idle_cores() -> int:
    """Cores nobody else keeps busy (by the 1-minute load average): a worker on a busy core only adds
    its jsii start-up to everyone's CPU time (measured: bench/synth_parallel.py on a loaded machine)."""
    cores = available_cores()
    return max(0, min(cores, cores - int(os.getloadavg()[0] + 0.5)))


def worker_count(clusters: int, jobs: int | None = None) -> int:
    """Processes to synthesize ``clusters`` clusters with. Asked for (``--jobs``, ``GPUFLEET_SYNTH_JOBS``):
    that many. Else 1 (this process) below ``PARALLEL_MIN_CLUSTERS``, and above it this process
    plus one worker per idle core, at most one per core."""
    asked = requested_jobs(jobs)
    if asked is None:
        asked = min(available_cores(), 1 + idle_cores()) if clusters >= PARALLEL_MIN_CLUSTERS else 1
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


def synth_group(configs: tuple[ClusterConfig, ...], names: tuple[str, ...], outdir: Path,
                imported_dir: Path | None) -> dict:
    """Synthesize only ``names`` into ``outdir`` in this process's jsii kernel, on one core (``one_core``);
    returns cdktf's manifest."""
    from constructs_lib.jsii_runtime import direct_kernel

    join_early_kernel()
    with one_core(), quiet_gc():
        with direct_kernel():
            from cdktf import App

        from stacks.fleet import build_fleet

        app = App(outdir=str(outdir))
        build_fleet(app, configs, imported_dir=imported_dir, only=names)
        app.synth()
    return json.loads((outdir / "manifest.json").read_text())


def synth_streamed(configs: tuple[ClusterConfig, ...], names: tuple[str, ...], outdir: Path, imported_dir: Path | None,
                   written: Written) -> dict:
    """``synth_group`` of ``names`` into ``outdir``, ``STREAM_CLUSTERS`` whole clusters per App in this process's
    kernel, telling ``written`` each stack directory as soon as its batch is synthesized (``gpufleet check``
    scans them meanwhile); returns the manifest, written to ``outdir`` as ``synthesize_parallel`` merges one.

    The same bytes as one App: a stack's files are written from its own constructs (the reason
    ``synthesize_parallel`` may split a fleet by cluster), and the manifest is rebuilt the way it is
    rebuilt there. Each App costs about 20-50 ms more of this kernel's time."""
    wanted = set(names)
    order = [s for s in plan_stacks(configs) if s.name in wanted]
    clusters = list(dict.fromkeys(s.cluster for s in order))
    (outdir / "stacks").mkdir(parents=True)
    entries: dict[str, dict] = {}
    top: dict = {}
    for index in range(0, len(clusters), STREAM_CLUSTERS):
        batch = set(clusters[index:index + STREAM_CLUSTERS])
        part = outdir / f".batch-{index}"
        top = synth_group(configs, tuple(s.name for s in order if s.cluster in batch), part, imported_dir)
        for name, entry in top["stacks"].items():
            entries[name] = entry
            os.replace(part / "stacks" / name, outdir / "stacks" / name)
            written(outdir / "stacks" / name)
        shutil.rmtree(part)
    manifest = {**top, "stacks": entries}
    (outdir / "manifest.json").write_text(manifest_json(manifest), encoding="utf-8")
    return manifest


def _worker_argv(*args: str) -> tuple[list[str], dict[str, str]]:
    """``python -m stacks.parallel ...``: a plain interpreter, so it imports neither the caller's
    ``__main__`` (``fork`` would copy a jsii kernel, ``spawn`` re-imports the CLI) nor anything else."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (str(CODE_ROOT), os.environ.get("PYTHONPATH")))))
    # -P: ``-m`` would put the working directory first on sys.path, so a worker started from inside another
    # gpufleet checkout (or a folder with its own ``stacks/``) ran that code, not this process's (CODE_ROOT).
    return [sys.executable, "-P", "-m", "stacks.parallel", *args], env


def _start_worker(configs: tuple[ClusterConfig, ...], names: tuple[str, ...], part: Path,
                  imported_dir: Path | None, core: int | None, check: bool = False) -> subprocess.Popen:
    """A worker for the job ``part``: one started early (``early_workers``) if one waits, else a new one.
    ``check``: it also runs the template check over what it wrote (``_findings``)."""
    job = part.with_name(f"{part.name}.job")
    job.write_bytes(pickle.dumps((configs, names, part, imported_dir, core, check)))
    if _early:
        proc = _early.pop(0)
        assert proc.stdin is not None
        try:
            proc.stdin.write(os.fsencode(job))  # the whole of stdin: a path may hold a newline
            proc.stdin.close()
        except BrokenPipeError:  # it died meanwhile: _finish_worker reports that it left no result
            pass
        return proc
    argv, env = _worker_argv(str(job))
    return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL)


@contextmanager
def early_workers(clusters: int, jobs: int | None = None) -> Iterator[None]:
    """Start the workers a synthesis of ``clusters`` clusters will ask for now, before the caller loads and
    validates the cluster files, and hand them their jobs when ``synthesize_parallel`` runs.

    Why: a worker spends about a second starting (an interpreter, cdktf's import, its jsii kernel, the
    fleet's modules) before it synthesizes anything, and the caller spends as long loading the cluster
    files (2 s at 200 clusters); started first, a worker does its part of that on its own core meanwhile.
    A started worker reads its stdin to its end: the path of its job file; without one (the loading
    failed, or the synthesis wanted fewer workers) it exits when this block closes its stdin, without
    having synthesized anything. The job and what the worker does with it are those of a worker started
    late, so the output is the same bytes. Workers get their cores as ``synthesize_parallel`` would give
    them (the caller's share keeps the first), and this process's share takes the same first core then.
    A bad ``--jobs``/``GPUFLEET_SYNTH_JOBS`` starts nothing here: the synthesis reports it after the files.
    More workers than cores: one per other core starts here, the rest after the files.

    When workers start, this process's own jsii kernel starts meanwhile too, in a thread pinned to the
    first core (``_start_kernel``): Node boots and loads cdktf while this process parses YAML, and
    ``synth_group`` waits for that thread before it uses jsii, so nothing else touches the kernel first."""
    try:
        count = worker_count(clusters, jobs) - 1 if clusters else 0
    except UserError:
        count = 0
    # At most one per other core: more could not warm up at once, and a ``--jobs`` far above the cores
    # (GPUFLEET_SYNTH_JOBS=64 left in a shell) would boot that many kernels for a cluster file that then
    # fails to load; the synthesis starts any further workers it asks for after the files, as before.
    count = min(count, available_cores() - 1)
    cores = _cores()
    _early_cores[:] = cores
    try:  # a start that fails half-way (no more processes, no memory) leaves no worker waiting in this module
        for index in range(1, count + 1):
            core = cores[index % len(cores)] if cores else None
            argv, env = _worker_argv("--early", "" if core is None else str(core))
            # Its own process group: the terminal's Ctrl-C (sent to the foreground group) reaches only this
            # process, whose ``finally`` closes the worker's stdin, so a worker still warming up ends quietly
            # instead of printing a KeyboardInterrupt traceback into a failed or interrupted loading.
            _early.append(subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, process_group=0))
        if count:
            kernel = threading.Thread(target=_start_kernel, args=(cores[0] if cores else None,),
                                      name="gpufleet-early-kernel", daemon=True)
            kernel.start()
            _early_kernel.append(kernel)
        yield
    except Terminated:
        # Its own process group kept the group's SIGTERM from it, and a closed stdin ends it only once it has
        # warmed up, after this process is gone: stopped now, it unwinds and removes its jsii files meanwhile.
        _stop_workers(_early)
        raise
    finally:
        for proc in _early:  # not needed: it exits by itself (removing its kernel's files), nobody waits for it
            assert proc.stdin is not None
            try:
                proc.stdin.close()
            except BrokenPipeError:
                pass
        _early.clear()
        _early_cores.clear()
        join_early_kernel()


def _start_kernel(core: int | None) -> None:
    """This process's jsii kernel, started as ``synth_group`` starts it, on ``core`` (this thread's mask;
    the kernel inherits it, as it would from ``one_core``). A failure is left for ``synth_group``, which
    starts the kernel again and reports it."""
    if core is not None:
        _set_affinity({core})
    try:
        from constructs_lib.jsii_runtime import direct_kernel

        with direct_kernel():
            import cdktf  # noqa: F401  (starts the kernel)
        import stacks.fleet  # noqa: F401
    except Exception:  # noqa: BLE001  (raised again, in the caller's thread, by synth_group)
        return


def join_early_kernel() -> None:
    """Wait for ``early_workers``' kernel thread, if one runs: jsii is not to be used from two threads at once."""
    while _early_kernel:
        _early_kernel.pop().join()


def _findings(part: Path) -> list[interpolation.Finding]:
    """The template check's findings over one part, named relative to it (``stacks/<name>/cdk.tf.json``)."""
    return interpolation.findings(part, shown_as=Path())


def _finish_worker(proc: subprocess.Popen, part: Path) -> tuple[dict, list[interpolation.Finding]]:
    """The worker's manifest and template-check findings (``_findings``; empty when it was not asked), or its
    exception raised here (a UserError stays a one-line error)."""
    code = proc.wait()
    result = part.with_name(f"{part.name}.result")
    if not result.is_file():
        raise RuntimeError(f"synthesis worker for {part.name} exited {code} without a result (killed or out of memory?)")
    ok, value = pickle.loads(result.read_bytes())
    if not ok:
        raise value
    return value


def synthesize_parallel(configs: tuple[ClusterConfig, ...], tmp: Path, workers: int,
                        imported_dir: Path | None = None, names: tuple[str, ...] | None = None,
                        written: Written | None = None, shown_as: Path | None = None) -> tuple[str, ...]:
    """Synthesize into ``tmp`` (a fresh staging dir) over ``workers`` processes, this one included;
    returns every stack name in ``plan_stacks`` order. ``names`` (whole clusters, as the synthesis
    cache asks) builds only those stacks, still from every config. ``written`` hears this process's
    stacks as it writes them (``synth_streamed``), the workers' once they are done.

    ``shown_as`` (the output directory as errors name it): the template check (``stacks.interpolation``)
    runs here, each process over the stacks it wrote, this one while the workers finish theirs, instead of
    once over the whole tree afterwards (0.2 s at 200 clusters, the last step before the output moves);
    the parts' findings are merged into what one check over the tree reports, and refused the same way."""
    info = plan_stacks(configs)
    if names is not None:
        info = tuple(s for s in info if s.name in names)
    groups = partition(info, workers)
    parts = [tmp / f".part-{i}" for i in range(len(groups))]
    cores = list(_early_cores) if _early else _cores()
    check = shown_as is not None
    started = [_start_worker(configs, names, part, imported_dir, cores[index % len(cores)] if cores else None, check)
               for index, (names, part) in enumerate(zip(groups[1:], parts[1:]), start=1)]
    try:
        with one_core(cores[0] if cores else None):
            manifests = [synth_group(configs, groups[0], parts[0], imported_dir) if written is None
                         else synth_streamed(configs, groups[0], parts[0], imported_dir, written)]
        found = [_findings(parts[0])] if check else []
        for proc, part in zip(started, parts[1:]):
            manifest, part_found = _finish_worker(proc, part)
            manifests.append(manifest)
            found.append(part_found)
            for name in manifests[-1]["stacks"] if written is not None else ():
                written(part / "stacks" / name)
    finally:
        _stop_workers(started)  # after an error here, a worker still running has nothing left to do
    if check:
        assert shown_as is not None
        interpolation.refuse([replace(f, file=str(shown_as / f.file)) for f in interpolation.merged(found)])
    entries: dict[str, dict] = {}
    (tmp / "stacks").mkdir()
    for part, manifest in zip(parts, manifests):
        for name, entry in manifest["stacks"].items():
            entries[name] = entry
            os.replace(part / "stacks" / name, tmp / "stacks" / name)
    for leftover in [p for p in tmp.iterdir() if p.name.startswith(".part-")]:
        if leftover.is_dir():
            shutil.rmtree(leftover)
        else:
            leftover.unlink()
    order = [s.name for s in info if s.name in entries]
    (tmp / "manifest.json").write_text(manifest_json({**manifests[0], "stacks": entries}), encoding="utf-8")
    return tuple(order)


def _stop_workers(procs: list[subprocess.Popen]) -> None:
    """SIGTERM every worker still running, so it unwinds and its exit hooks remove its jsii files
    (``clusters.termination``); one that has not ended ``STOP_SECONDS`` later is killed."""
    running = [proc for proc in procs if proc.poll() is None]
    for proc in running:
        proc.terminate()
    deadline = time.monotonic() + STOP_SECONDS
    for proc in running:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _cores() -> list[int]:
    """The cores this process may use, starting at the one it runs on and going round: this process's
    share keeps its core and worker ``i`` takes the ``i``-th after it, so syntheses started at once on
    different cores do not all pin themselves to the first ones."""
    try:
        cores = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return []
    here = current_core()
    start = cores.index(here) if here in cores else 0
    return cores[start:] + cores[:start]


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


def _early_main(core: str) -> int:
    """A worker started by ``early_workers``: on its core, start the jsii kernel and import the fleet's code,
    then run the job file named on stdin (all of it); nothing before stdin closes means no job."""
    if core:
        _set_affinity({int(core)})
    try:
        from constructs_lib.jsii_runtime import direct_kernel

        with direct_kernel():
            import cdktf  # noqa: F401  (starts the kernel)
        import stacks.fleet  # noqa: F401
    except Exception:  # noqa: BLE001  (synth_group starts it again and reports the error as any worker does)
        pass
    job = sys.stdin.buffer.read()  # up to EOF: the path's bytes as written, whatever characters they hold
    if not job:
        return 0
    _join_callers_group()
    return _worker_main(Path(os.fsdecode(job)))


def _join_callers_group() -> None:
    """An early worker starts in a process group of its own (``early_workers``); with its job it joins its
    caller's, as a late-started worker is, so a signal to the whole group (``timeout``, a CI job cancelled,
    Ctrl-C during the synthesis) ends it too instead of leaving it synthesizing for nobody. A caller already
    gone (its group now in no relation to this session) leaves it where it is."""
    try:
        os.setpgid(0, os.getpgid(os.getppid()))
    except OSError:
        pass


def _worker_main(job: Path) -> int:
    """Run one job file written by ``_start_worker``; the outcome goes to ``<part>.result``."""
    configs, names, part, imported_dir, core, check = pickle.loads(job.read_bytes())
    if core is not None:
        _set_affinity({core})
    try:
        manifest = synth_group(configs, names, part, imported_dir)
        outcome = (True, (manifest, _findings(part) if check else []))
    except Exception as exc:  # handed to the parent, which raises it
        try:
            pickle.dumps(exc)
            outcome = (False, exc)
        except Exception:
            outcome = (False, RuntimeError(f"{type(exc).__name__}: {exc}"))
    part.with_name(f"{part.name}.result").write_bytes(pickle.dumps(outcome))
    return 0


def _main(argv: list[str]) -> int:
    """A worker's entry: SIGTERM (its caller stopping it, or a signal to the whole group) unwinds it, so
    the exit hooks stop its jsii kernel and remove the kernel's files before it exits; so does Ctrl-C,
    without a traceback of its own (the caller reports it)."""
    try:
        with sigterm_unwinds():
            return _early_main(argv[2]) if argv[1] == "--early" else _worker_main(Path(argv[1]))
    except Terminated:
        return EXIT_TERMINATED
    except KeyboardInterrupt:  # Ctrl-C reaches the caller's whole group: the caller reports it, not each worker
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    exit_now(_main(sys.argv))  # the caller waits for this process to end before it merges: no teardown
