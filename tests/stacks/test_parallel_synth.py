"""Synthesis split over worker processes writes the same bytes as one process, atomically."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from clusters.errors import UserError
from stacks import parallel
from stacks.layout import plan_stacks
from stacks.synth import synthesize


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def serial_out(tmp_path_factory, example_configs) -> Path:
    out = tmp_path_factory.mktemp("serial") / "cdktf.out"
    synthesize(example_configs, out, jobs=1)
    return out


@pytest.mark.parametrize("jobs", [2, 3])
def test_parallel_synthesis_is_byte_identical_to_serial(serial_out: Path, example_configs, tmp_path: Path, jobs: int) -> None:
    """Every file, manifest.json included; 3 workers over 4 clusters puts tfc-workspaces beside an uneven share."""
    out = tmp_path / "cdktf.out"
    names = synthesize(example_configs, out, jobs=jobs)
    serial, merged = _tree(serial_out), _tree(out)
    assert sorted(merged) == sorted(serial)
    assert [name for name in serial if merged[name] != serial[name]] == []
    assert names == tuple(s.name for s in plan_stacks(example_configs))
    assert "tfc-workspaces" in names and not any(p.name.startswith(".part-") for p in out.iterdir())


@pytest.mark.parametrize("jobs", [None, 2])
@pytest.mark.parametrize("cache", ["off", "cold", "warm"])
@pytest.mark.parametrize("asked", [("tfc-workspaces",), ("prod-nomad-scheduler", "tfc-workspaces", "dev-gke")],
                         ids=["alone", "with clusters"])
def test_a_fleet_wide_stack_is_built_without_every_clusters_stacks(serial_out: Path, example_configs, tmp_path: Path, monkeypatch,
                                                                   cache: str, asked: tuple[str, ...], jobs: int | None) -> None:
    """``gpufleet synth tfc-workspaces`` reads every cluster file (the stack is derived from them) but builds only
    that stack and the named clusters' (it built the whole fleet: 13 s at 200 clusters), with the bytes and the
    manifest entries of a whole synthesis, with the synthesis cache off, empty or holding the whole fleet, in one
    process or over two (the fleet-wide stack and two clusters)."""
    import stacks.fleet

    monkeypatch.setenv("GPUFLEET_SYNTH_CACHE", "off" if cache == "off" else str(tmp_path / "cache"))
    if cache == "warm":
        synthesize(example_configs, tmp_path / "whole")
    built: list[str] = []
    cluster_stack = stacks.fleet.ClusterStack
    monkeypatch.setattr(stacks.fleet, "ClusterStack", lambda app, config: built.append(config.name) or cluster_stack(app, config))
    out = tmp_path / "cdktf.out"
    assert synthesize(example_configs, out, only=asked, jobs=jobs) == tuple(sorted(asked))
    wanted = [] if cache == "warm" else sorted({name.removesuffix("-scheduler") for name in asked} - {"tfc-workspaces"})
    if jobs is None or len(wanted) < 2:
        assert sorted(built) == wanted
    else:  # the worker process builds its share unseen here: this process built part of the named clusters only
        assert built and set(built) < set(wanted)
    manifest, whole = (json.loads((root / "manifest.json").read_text()) for root in (out, serial_out))
    for name in asked:
        stack = Path("stacks") / name
        assert {k: v for k, v in _tree(out).items() if k.startswith(f"{stack}/")} \
            == {k: v for k, v in _tree(serial_out).items() if k.startswith(f"{stack}/")} != {}
        assert manifest["stacks"][name] == whole["stacks"][name]


@pytest.mark.parametrize("share", [0, 1], ids=["in-process share", "worker process"])
def test_a_failing_share_leaves_the_previous_output_untouched(example_configs, tmp_path: Path, share: int) -> None:
    out = tmp_path / "cdktf.out"
    synthesize(example_configs, out, jobs=1)
    before = _tree(out)
    imported = tmp_path / "imported"
    imported.mkdir()
    failing = parallel.partition(plan_stacks(example_configs), 2)[share][0]
    (imported / f"{failing}.json").write_text("[]")  # load_imports refuses it
    with pytest.raises(UserError, match="must be a JSON object"):
        synthesize(example_configs, out, jobs=2, imported_dir=imported)
    assert _tree(out) == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".cdktf.out.")] == []


def test_partition_keeps_each_cluster_whole_and_the_fleet_stack_once(example_configs) -> None:
    info = plan_stacks(example_configs)
    for workers in (1, 2, 3, 4):
        groups = parallel.partition(info, workers)
        assert sorted(n for g in groups for n in g) == sorted(s.name for s in info)
        for s in info:
            if s.cluster:
                owner = [g for g in groups if s.name in g]
                assert all(t.name in owner[0] for t in info if t.cluster == s.cluster)


def test_worker_count_follows_threshold_cores_and_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(parallel.JOBS_ENV, raising=False)
    monkeypatch.setattr(parallel, "available_cores", lambda: 2)
    monkeypatch.setattr(parallel.os, "getloadavg", lambda: (0.2, 0.2, 0.2))
    assert parallel.worker_count(parallel.PARALLEL_MIN_CLUSTERS - 1) == 1
    assert parallel.worker_count(parallel.PARALLEL_MIN_CLUSTERS) == 2
    monkeypatch.setattr(parallel.os, "getloadavg", lambda: (1.2, 0.2, 0.2))  # one core busy elsewhere
    assert parallel.worker_count(200) == 2
    monkeypatch.setattr(parallel.os, "getloadavg", lambda: (2.0, 0.2, 0.2))  # both busy: workers only add CPU
    assert parallel.worker_count(200) == 1
    assert parallel.worker_count(4, jobs=3) == 3
    assert parallel.worker_count(2, jobs=8) == 2
    monkeypatch.setenv(parallel.JOBS_ENV, "1")
    assert parallel.worker_count(200) == 1
    monkeypatch.setenv(parallel.JOBS_ENV, "two")
    with pytest.raises(UserError, match="GPUFLEET_SYNTH_JOBS='two': not a positive integer"):
        parallel.worker_count(200)


def test_a_worker_runs_this_process_code_whatever_the_working_directory(example_configs, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch, serial_out: Path) -> None:
    """``python -m`` puts the working directory first on sys.path: from inside another checkout (here a
    folder whose ``stacks.parallel`` fails), a worker must still import the code of the process that started it."""
    other = tmp_path / "other-checkout"
    (other / "stacks").mkdir(parents=True)
    (other / "stacks" / "__init__.py").write_text("")
    (other / "stacks" / "parallel.py").write_text("raise SystemExit(3)\n")
    (tmp_path / "imported").mkdir()  # none recorded, as for serial_out (the folder is not a repository to look in)
    monkeypatch.chdir(other)
    out = tmp_path / "cdktf.out"
    synthesize(example_configs, out, jobs=2, imported_dir=tmp_path / "imported")
    assert _tree(out) == _tree(serial_out)


def test_synthesis_runs_where_pinning_is_refused(serial_out: Path, example_configs, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Pinning is only for speed: a sandbox or seccomp profile that lets a process read its affinity but
    refuses to set it (EPERM), or a core taken away meanwhile (EINVAL), must not fail the synthesis."""
    def refuse(pid: int, mask: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(parallel.os, "sched_setaffinity", refuse)
    monkeypatch.setattr(parallel, "current_core", lambda: min(parallel.os.sched_getaffinity(0)))
    out = tmp_path / "cdktf.out"
    synthesize(example_configs, out, jobs=1)
    assert _tree(out) == _tree(serial_out)


def test_this_process_share_keeps_the_core_it_runs_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each synthesis pinned its own share to the first core it may use and its workers to the next: two
    ``gpufleet synth`` at once on an 8-core machine both ran on cores 0 and 1 and left six idle. Starting
    from the core this process is on, and going round from there, runs started on different cores stay apart."""
    allowed = sorted(parallel.os.sched_getaffinity(0))
    monkeypatch.setattr(parallel, "current_core", lambda: allowed[-1])  # the scheduler put this process on the last
    cores = parallel._cores()
    assert cores[0] == allowed[-1] and sorted(cores) == allowed


@pytest.mark.parametrize("jobs", [2, 3])
def test_workers_started_before_the_files_load_write_the_same_bytes(serial_out: Path, example_configs, tmp_path: Path,
                                                                     jobs: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``early_workers`` (gpufleet synth, cache off): the workers started first take the jobs, the output is serial's;
    on 2 cores one worker starts early, so ``--jobs 3`` hands one job to an early worker and starts the other late."""
    monkeypatch.setattr(parallel, "available_cores", lambda: 2)
    with parallel.early_workers(len(example_configs), jobs):
        early = list(parallel._early)
        assert len(early) == 1 and len(parallel._early_kernel) == 1
        synthesize(example_configs, tmp_path / "cdktf.out", jobs=jobs)
        assert parallel._early == [] and parallel._early_kernel == []  # synth_group waited for the kernel thread
    assert [proc.wait(timeout=60) for proc in early] == [0]
    serial, merged = _tree(serial_out), _tree(tmp_path / "cdktf.out")
    assert sorted(merged) == sorted(serial)
    assert [name for name in serial if merged[name] != serial[name]] == []


def test_an_early_worker_nobody_needs_exits_without_synthesizing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading failed, or the synthesis asked for fewer workers: closing its stdin ends it with code 0."""
    monkeypatch.setattr(parallel, "available_cores", lambda: 2)
    with parallel.early_workers(parallel.PARALLEL_MIN_CLUSTERS, 2):
        early = list(parallel._early)
        assert len(early) == 1
    assert early[0].wait(timeout=60) == 0
    with parallel.early_workers(parallel.PARALLEL_MIN_CLUSTERS, 1):
        assert parallel._early == []



def test_an_early_worker_whose_kernel_cannot_start_still_reports_through_its_job(
        example_configs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its warm-up failing (here: an unknown GPUFLEET_JSII_RUNTIME) must not end the worker: it takes its job and
    hands back the error a late-started worker reports (a one-line UserError), not "exited without a result"."""
    monkeypatch.setenv("GPUFLEET_JSII_RUNTIME", "bogus")
    monkeypatch.setattr(parallel, "available_cores", lambda: 2)
    names = parallel.partition(plan_stacks(example_configs), 2)[1]
    with parallel.early_workers(parallel.PARALLEL_MIN_CLUSTERS, 2):
        assert len(parallel._early) == 1
        proc = parallel._start_worker(example_configs, names, tmp_path / ".part-1", None, None)
        with pytest.raises(UserError, match="GPUFLEET_JSII_RUNTIME='bogus': not a jsii runtime gpufleet knows"):
            parallel._finish_worker(proc, tmp_path / ".part-1")


@pytest.mark.parametrize("jobs", [1, 2])
@pytest.mark.parametrize("cache", ["off", "on"])
def test_a_streamed_synthesis_is_byte_identical_and_tells_each_stack_once_with_its_final_bytes(
        serial_out: Path, example_configs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, jobs: int, cache: str) -> None:
    """``written`` (gpufleet check's scan) hears every stack once, while its files already hold the bytes the
    output ends with; one cluster per App (STREAM_CLUSTERS=1) so the example fleet takes several batches."""
    monkeypatch.setattr(parallel, "STREAM_CLUSTERS", 1)
    monkeypatch.setenv("GPUFLEET_SYNTH_CACHE", "off" if cache == "off" else str(tmp_path / "synth-cache"))
    heard: dict[str, bytes] = {}

    def written(stack_dir: Path) -> None:
        assert stack_dir.name not in heard
        heard[stack_dir.name] = (stack_dir / "cdk.tf.json").read_bytes()

    out = tmp_path / "cdktf.out"
    for _ in range(2 if cache == "on" else 1):  # a second run with the cache on tells the cached stacks too
        heard.clear()
        names = synthesize(example_configs, out, jobs=jobs, written=written)
        serial, streamed = _tree(serial_out), _tree(out)
        assert sorted(streamed) == sorted(serial)
        assert [name for name in serial if streamed[name] != serial[name]] == []
        assert names == tuple(s.name for s in plan_stacks(example_configs))
        assert sorted(heard) == sorted(names)
        assert {name: (out / "stacks" / name / "cdk.tf.json").read_bytes() for name in names} == heard
        assert not any(p.name.startswith((".part-", ".batch-")) for p in out.rglob("*"))


# Ctrl-C is a KeyboardInterrupt here as in a terminal's program, whatever this run inherited: a test run started as a
# script's background job (`make test &`, nohup) has SIGINT ignored, so Python installs no handler and the caller never
# ended. The loading is a loop of short sleeps, not signal.pause(): a SIGINT landing between the print and the pause()
# call only flags itself for the interpreter, which looks at the flag after pause() returns (CPython's signal_pause_impl),
# so pause() waited for a second signal.
_INTERRUPTED_LOADING = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
from stacks import parallel
parallel.available_cores = lambda: 4
try:
    with parallel.early_workers(parallel.PARALLEL_MIN_CLUSTERS, 3):
        print(" ".join(str(proc.pid) for proc in parallel._early), flush=True)
        while True:  # the cluster files load here; the terminal's Ctrl-C interrupts it
            time.sleep(0.05)
except KeyboardInterrupt:
    sys.exit(130)
"""


def test_ctrl_c_while_the_files_load_ends_the_early_workers_without_a_traceback() -> None:
    """The terminal sends Ctrl-C's SIGINT to its whole foreground process group. Early workers in the caller's group
    each printed a KeyboardInterrupt traceback (from their warm-up or their wait for a job) into what was a quiet
    interrupted loading before early workers; in a group of their own they see only their stdin close and exit."""
    caller = subprocess.Popen([sys.executable, "-P", "-c", _INTERRUPTED_LOADING], cwd=parallel.CODE_ROOT,
                              env=dict(os.environ, PYTHONPATH=str(parallel.CODE_ROOT)), start_new_session=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert caller.stdout is not None
    try:
        workers = [int(pid) for pid in caller.stdout.readline().split()]
        groups = {os.getpgid(pid) for pid in workers}
    finally:
        os.killpg(caller.pid, signal.SIGINT)
        _, stderr = caller.communicate(timeout=120)  # EOF once every worker, which shares this stderr, has exited
    assert len(workers) == 2 and not groups & {caller.pid, os.getpgrp()}  # Ctrl-C does not reach them
    assert caller.returncode == 130
    assert "KeyboardInterrupt" not in stderr, stderr


def test_an_early_worker_joins_its_callers_process_group_with_its_job(example_configs, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Out of the caller's group while it waits (Ctrl-C during loading), back in it once it synthesizes: a signal to
    the caller's group (``timeout``, a cancelled CI job, Ctrl-C) must end it as it ends a late-started worker."""
    monkeypatch.setattr(parallel, "available_cores", lambda: 2)
    names = parallel.partition(plan_stacks(example_configs), 2)[1]
    with parallel.early_workers(parallel.PARALLEL_MIN_CLUSTERS, 2):
        proc = parallel._early[0]
        assert os.getpgid(proc.pid) == proc.pid
        proc = parallel._start_worker(example_configs, names, tmp_path / ".part-1", None, None)
        groups = set()
        while proc.poll() is None and os.getpgrp() not in groups:  # it moves when it reads its job
            try:
                groups.add(os.getpgid(proc.pid))
            except ProcessLookupError:
                break
        parallel._finish_worker(proc, tmp_path / ".part-1")
    assert os.getpgrp() in groups


def test_an_early_start_that_fails_half_way_leaves_no_worker_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    """The second worker cannot start (EAGAIN: no more processes): the error propagates, and the first worker is
    neither left waiting on an open stdin for the life of this process nor handed the next synthesis's job."""
    real = subprocess.Popen
    started: list[subprocess.Popen] = []

    def second_fails(*args, **kwargs) -> subprocess.Popen:
        if started:
            raise BlockingIOError(11, "Resource temporarily unavailable")
        started.append(real(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(parallel.subprocess, "Popen", second_fails)
    monkeypatch.setattr(parallel, "available_cores", lambda: 4)
    with pytest.raises(BlockingIOError):
        with parallel.early_workers(parallel.PARALLEL_MIN_CLUSTERS, 3):
            pass
    assert parallel._early == [] and parallel._early_cores == [] and parallel._early_kernel == []
    assert started[0].wait(timeout=120) == 0  # its stdin closed: it exits without a job


def test_a_jobs_count_above_the_cores_starts_one_early_worker_per_other_core(monkeypatch: pytest.MonkeyPatch) -> None:
    """GPUFLEET_SYNTH_JOBS=64 left in a shell, 200 cluster files, one of them bad: before the files load, at most one
    worker per other core starts (the synthesis starts the rest after loading), not 63 jsii kernels booted for an
    error. The workers here are plain interpreters that wait on stdin, as an early worker does."""
    monkeypatch.setattr(parallel, "available_cores", lambda: 2)
    monkeypatch.setattr(parallel, "_worker_argv", lambda *args: ([sys.executable, "-c", "import sys; sys.stdin.read()"], None))
    monkeypatch.setenv(parallel.JOBS_ENV, "64")
    with parallel.early_workers(200):
        early = list(parallel._early)
    assert len(early) == 1
    assert [proc.wait(timeout=60) for proc in early] == [0]


def test_an_early_worker_takes_a_job_whose_path_holds_a_newline(example_configs, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The job's path went as one line on stdin: with ``--out`` under a directory whose name holds a newline the worker
    read only the part before it (here ``<tmp>/out``, a directory; a file there would have been unpickled as the job)
    and exited 1 without a result, where a worker started after loading gets its path in argv and synthesizes."""
    monkeypatch.setattr(parallel, "available_cores", lambda: 2)
    names = parallel.partition(plan_stacks(example_configs), 2)[1]
    staging = tmp_path / "out\nlet"
    (tmp_path / "out").mkdir()
    staging.mkdir()
    with parallel.early_workers(parallel.PARALLEL_MIN_CLUSTERS, 2):
        proc = parallel._start_worker(example_configs, names, staging / ".part-1", None, None)
        manifest, found = parallel._finish_worker(proc, staging / ".part-1")
    assert sorted(manifest["stacks"]) == sorted(names) and found == []  # not asked to check


@pytest.mark.parametrize("jobs,fails", [(1, False), (1, True), (2, True)], ids=["serial", "serial failing", "own share failing"])
def test_a_synthesis_in_this_process_leaves_its_garbage_collector_as_it_was(example_configs, tmp_path: Path, jobs: int,
                                                                             fails: bool) -> None:
    """``quiet_gc`` changes the whole process's collector (thresholds, objects frozen out of its reach) while this
    process synthesizes; a caller that synthesizes in its own process (the tests, ``gpufleet check`` with its scan
    threads) gets it back as it was, when the synthesis raises too: a threshold of 50,000 or a frozen heap left
    behind would hold back every later collection of that process."""
    import gc

    imported = tmp_path / "imported"
    imported.mkdir()
    if fails:
        failing = parallel.partition(plan_stacks(example_configs), jobs)[0][0]  # a stack of this process's share
        (imported / f"{failing}.json").write_text("[]")  # load_imports refuses it
    before = (gc.get_threshold(), gc.get_freeze_count(), gc.isenabled())
    try:
        synthesize(example_configs, tmp_path / "cdktf.out", jobs=jobs, imported_dir=imported)
    except UserError as exc:
        assert fails and "must be a JSON object" in str(exc)
    else:
        assert not fails
    assert (gc.get_threshold(), gc.get_freeze_count(), gc.isenabled()) == before
