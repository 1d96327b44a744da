"""SIGTERM during a synthesis or a check: the command unwinds, stops what it started and removes what it
wrote (clusters/termination.py). Real processes: the CLI, its synthesis worker, their jsii kernels (Node)
and the checkov worker, each with a private TMPDIR so every temporary file they leave is seen."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from clusters import termination
from tests.conftest import FLEET_CLUSTERS, copy_checkout

ROOT = Path(__file__).resolve().parents[2]
GPUFLEET = str(Path(sys.executable).with_name("gpufleet"))
FLEETGEN = ROOT / "bench" / "fleetgen.py"
# Written by lark (checkov's HCL parser) as a cache for every later run; not something gpufleet made.
NOT_OURS = (".lark_cache_",)


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """A throwaway checkout whose clusters/ holds the suite's fixture fleet (the job files name its clusters)
    and enough generated clusters that a synthesis over 2 processes still runs seconds after it starts."""
    spec = importlib.util.spec_from_file_location("bench_fleetgen", FLEETGEN)
    assert spec and spec.loader
    fleetgen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fleetgen)
    dest = copy_checkout(tmp_path_factory.mktemp("checkout"))
    for path in (dest / "clusters").glob("*.yaml"):
        path.unlink()
    for path in FLEET_CLUSTERS.glob("*.yaml"):
        shutil.copy2(path, dest / "clusters" / path.name)
    fleetgen.generated_fleet(dest / "clusters", range(36))
    return dest


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.add(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _terminate_mid_run(argv: list[str], cwd: Path, tmp_path: Path, *, group: bool, stage: str, busy: int,
                       sig: int = signal.SIGTERM) -> tuple[subprocess.Popen, str, set[int]]:
    """Start ``argv`` with a private TMPDIR, wait for its ``stage:`` line and until ``busy`` processes work
    under it, then SIGTERM it (or its whole process group, as ``timeout`` and a cancelled CI job do), or send
    ``sig``. SIGINT's disposition is reset for the command: a test run in the background inherits it ignored."""
    env = {k: v for k, v in os.environ.items() if k not in ("GPUFLEET_SYNTH_JOBS",)}
    env |= {"TMPDIR": str(tmp_path / "tmp"), "GPUFLEET_SYNTH_CACHE": "off", "GPUFLEET_CHECKOV_CACHE": str(tmp_path / "cache")}
    (tmp_path / "tmp").mkdir()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, process_group=0,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(f"stage: {stage}"):
            break
    else:
        pytest.fail(f"{argv[1]} ended before its {stage!r} stage: {proc.wait()} {proc.stderr.read() if proc.stderr else ''}")
    deadline = time.monotonic() + 60
    while len(_descendants(proc.pid)) < busy:
        assert time.monotonic() < deadline and proc.poll() is None, "the command's processes never started"
        time.sleep(0.05)
    time.sleep(1.0)  # well inside the synthesis: the processes are exchanging jsii messages
    started = _descendants(proc.pid)
    assert proc.poll() is None, "the command ended before the signal: make the fleet larger"
    if group:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    _, err = proc.communicate(timeout=termination.GRACE_SECONDS + 20)
    return proc, err, started


def _assert_clean(proc: subprocess.Popen, err: str, started: set[int], tmp_path: Path, out: Path,
                  interrupted: bool = False) -> None:
    if interrupted:  # Ctrl-C: typer's exit 130, quietly, as before any of this
        assert proc.returncode == 130 and err.strip() == "", err
    else:
        assert proc.returncode == -signal.SIGTERM, err  # as the default action ends it, after the clean-up
        assert err.strip() == "terminated"
    assert [pid for pid in started if _alive(pid)] == []
    left = sorted(name for name in os.listdir(tmp_path / "tmp") if not name.startswith(NOT_OURS))
    assert left == [], "temporary files left behind"
    assert sorted(os.listdir(out.parent)) == [], "a staging directory (or an output) left behind"


@pytest.mark.parametrize("group", [False, True], ids=["the command", "its process group"])
def test_sigterm_during_a_parallel_synthesis_leaves_nothing(checkout: Path, tmp_path: Path, group: bool) -> None:
    """Before: exit -15 at once, the staging directory beside --out, the worker synthesizing on for nobody,
    and each process's jsii launcher, jsii runtime and (group) Node kernel directories in TMPDIR."""
    out = tmp_path / "out" / "cdktf.out"
    out.parent.mkdir()
    argv = [GPUFLEET, "synth", "--jobs", "2", "--out", str(out), "--clusters-dir", str(checkout / "clusters")]
    proc, err, started = _terminate_mid_run(argv, checkout, tmp_path, group=group, stage="synthesizing", busy=3)
    _assert_clean(proc, err, started, tmp_path, out)


@pytest.mark.parametrize("group", [False, True], ids=["the command", "its process group"])
def test_sigterm_during_a_check_leaves_nothing(checkout: Path, tmp_path: Path, group: bool) -> None:
    """The check synthesizes while a checkov worker scans the stacks written so far."""
    out = tmp_path / "out" / "cdktf.out"
    out.parent.mkdir()
    argv = [GPUFLEET, "check", "--out", str(out), "--clusters-dir", str(checkout / "clusters")]
    proc, err, started = _terminate_mid_run(argv, checkout, tmp_path, group=group, stage="synth", busy=2)
    _assert_clean(proc, err, started, tmp_path, out)


@pytest.mark.parametrize("command", ["synth", "check"])
def test_ctrl_c_during_a_synthesis_or_a_check_leaves_nothing(checkout: Path, tmp_path: Path, command: str) -> None:
    """Ctrl-C in a terminal is SIGINT to the whole foreground group: the command, its synthesis workers (an early
    one joins the group with its job), their Node kernels and the checkov worker. Before: each kernel died of it
    at once, so the command printed a JSONDecodeError traceback, exited 1 and left the kernel's directory in
    TMPDIR; and a worker unwinding from its KeyboardInterrupt was killed by the SIGTERM its caller stops workers
    with, before its exit hooks stopped its kernel and removed the launcher's files."""
    out = tmp_path / "out" / "cdktf.out"
    out.parent.mkdir()
    argv = [GPUFLEET, command, *(["--jobs", "2"] if command == "synth" else []), "--out", str(out),
            "--clusters-dir", str(checkout / "clusters")]
    proc, err, started = _terminate_mid_run(argv, checkout, tmp_path, group=True, stage="synth", busy=3 if command == "synth" else 2,
                                            sig=signal.SIGINT)
    _assert_clean(proc, err, started, tmp_path, out, interrupted=True)


def _run_snippet(code: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess, float]:
    script = tmp_path / "snippet.py"
    script.write_text(textwrap.dedent(code))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(script), str(tmp_path)], env=env, capture_output=True, text=True, timeout=60)
    return done, time.monotonic() - started


def test_a_second_sigterm_does_not_cut_the_exit_hooks_short(tmp_path: Path) -> None:
    """A group SIGTERM reaches a synthesis worker, and its caller then stops it with one more: that one
    must not end the worker half-way through removing its files."""
    done, _ = _run_snippet("""
        import atexit, os, signal, sys, time
        from pathlib import Path
        from clusters.termination import Terminated, sigterm_unwinds, EXIT_TERMINATED

        def hook():
            os.kill(os.getpid(), signal.SIGTERM)  # the caller's second signal, during the clean-up
            time.sleep(0.2)
            Path(sys.argv[1], "cleaned").write_text("yes")

        try:
            with sigterm_unwinds():
                atexit.register(hook)  # as jsii's hooks are: after the block's own, so it runs first
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)
        except Terminated:
            sys.exit(EXIT_TERMINATED)
    """, tmp_path)
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert (tmp_path / "cleaned").read_text() == "yes"


def test_an_unwinding_that_hangs_is_ended_after_the_grace(tmp_path: Path) -> None:
    done, took = _run_snippet("""
        import atexit, os, signal, sys, time
        import clusters.termination as termination

        termination.GRACE_SECONDS = 0.5
        try:
            with termination.sigterm_unwinds():
                atexit.register(time.sleep, 30)  # a clean-up that never ends
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)
        except termination.Terminated:
            sys.exit(termination.EXIT_TERMINATED)
    """, tmp_path)
    assert done.returncode == termination.EXIT_TERMINATED, done.stderr
    assert took < 15


def test_the_handler_before_is_put_back_after_a_normal_exit() -> None:
    """``gpufleet.cli.main`` runs in-process in tests and tools: it must not leave its handler behind."""
    before = signal.getsignal(signal.SIGTERM)
    with termination.sigterm_unwinds():
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before
    with pytest.raises(ValueError):
        with termination.sigterm_unwinds():
            raise ValueError("a command's own error")
    assert signal.getsignal(signal.SIGTERM) is before


SWAP_SNIPPET = """
    import os, shutil, signal, sys
    from pathlib import Path
    from clusters import outputs
    from clusters.termination import EXIT_TERMINATED, Terminated, sigterm_unwinds
    from stacks.synth import _merge

    root = Path(sys.argv[1])
    target = outputs.ensure_dir(root / "out" / "cdktf.out")
    (target / "stacks" / "a").mkdir(parents=True)
    (target / "stacks" / "a" / "cdk.tf.json").write_text("previous")
    (target / "manifest.json").write_text('{"stacks": {"a": {}}}')
    new = outputs.staging_dir(target)
    (new / "stacks" / "a").mkdir(parents=True)
    (new / "stacks" / "a" / "cdk.tf.json").write_text("fresh")
    (new / "manifest.json").write_text('{"stacks": {"a": {}}}')
    rename = os.replace

    def replace(src, dst):
        rename(src, dst)
        if ".old." in Path(dst).name:  # the SIGTERM arrives while the previous tree is renamed away
            os.kill(os.getpid(), signal.SIGTERM)

    os.replace = replace
    try:
        with sigterm_unwinds():
            try:
                MERGE
            finally:  # as stacks.synth.synthesize's
                shutil.rmtree(new, ignore_errors=True)
    except Terminated:
        sys.exit(EXIT_TERMINATED)
"""


@pytest.mark.parametrize("merge", ["outputs.replace_dir(new, target)", "_merge(new, target, ('a',))"], ids=["synth", "synth <stack>"])
def test_a_sigterm_during_the_swap_leaves_an_output_in_place(tmp_path: Path, merge: str) -> None:
    """Before: Terminated raised between the two renames left no cdktf.out (the previous tree in a
    ``.cdktf.out.old.*`` directory) and the caller's ``finally`` deleted the new one; the default SIGTERM
    had at least left both trees. Now the swap completes, then the command dies of the signal."""
    done, _ = _run_snippet(SWAP_SNIPPET.replace("MERGE", merge), tmp_path)
    assert done.returncode == -signal.SIGTERM, done.stderr
    out = tmp_path / "out"
    assert sorted(os.listdir(out)) == ["cdktf.out"], "a staging or previous tree left beside --out"
    assert sorted(os.listdir(out / "cdktf.out" / "stacks")) == ["a"]
    assert (out / "cdktf.out" / "stacks" / "a" / "cdk.tf.json").read_text() == "fresh"


def test_sigterm_to_a_plan_lets_terraform_release_its_state_lock(tmp_path: Path) -> None:
    """A group SIGTERM (``timeout``, a cancelled CI job) during ``gpufleet plan`` reaches terraform, which
    stops and releases its state lock. Before: gpufleet's unwinding went through ``subprocess.run``, which
    SIGKILLs its child on any exception, so terraform died holding the lock (with the local backend, its
    ``.terraform.tfstate.lock.info`` stays; with GCS, S3 or Terraform Cloud, a lock to force-unlock).
    Real terraform 1.11 on its built-in ``terraform_data``, enough instances that the plan runs seconds."""
    out = tmp_path / "cdktf.out"
    stack = out / "stacks" / "big"
    stack.mkdir(parents=True)
    (out / ".gpufleet-output").write_text("gpufleet made this directory\n")
    (stack / "cdk.tf.json").write_text('{"resource": {"terraform_data": {"many": {"count": 4000, "input": "x"}}}}')
    lock = stack / ".terraform.tfstate.lock.info"
    env = dict(os.environ, TMPDIR=str(tmp_path))
    proc = subprocess.Popen([GPUFLEET, "plan", "big", "--out-dir", str(out)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, process_group=0)
    deadline = time.monotonic() + 120
    while not lock.exists():
        assert proc.poll() is None and time.monotonic() < deadline, f"terraform never took its lock: {proc.communicate()}"
        time.sleep(0.02)
    started = _descendants(proc.pid)
    assert started, "terraform is not running under gpufleet plan"
    os.killpg(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=termination.GRACE_SECONDS + 20)
    assert proc.returncode == -signal.SIGTERM, err
    deadline = time.monotonic() + 60  # terraform may outlive gpufleet's grace: it stops on its own then
    while [pid for pid in started if _alive(pid)]:
        assert time.monotonic() < deadline, "terraform never stopped"
        time.sleep(0.1)
    assert not lock.exists(), "terraform was killed while it held its state lock"


def test_sigterm_while_the_cluster_files_load_leaves_no_early_worker(checkout: Path, tmp_path: Path) -> None:
    """A worker started before the files load (``early_workers``) sits in a process group of its own and, on
    its caller's way out, only had its stdin closed: before, it went on warming up (Node and cdktf loading)
    after the command had exited, and a CI runner reaping that orphan with SIGKILL left its jsii files."""
    out = tmp_path / "out" / "cdktf.out"
    out.parent.mkdir()
    argv = [GPUFLEET, "synth", "--jobs", "2", "--out", str(out), "--clusters-dir", str(checkout / "clusters")]
    env = {k: v for k, v in os.environ.items() if k != "GPUFLEET_SYNTH_JOBS"} | {"TMPDIR": str(tmp_path / "tmp"), "GPUFLEET_SYNTH_CACHE": "off"}
    (tmp_path / "tmp").mkdir()
    proc = subprocess.Popen(argv, cwd=checkout, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, process_group=0)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("stage: loading"):
            break
    deadline = time.monotonic() + 30
    while not _descendants(proc.pid):
        assert time.monotonic() < deadline and proc.poll() is None, "no early worker started"
        time.sleep(0.01)
    started = _descendants(proc.pid)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=termination.GRACE_SECONDS + 20)
    _assert_clean(proc, err, started, tmp_path, out)


def test_sigterm_to_a_check_while_checkov_scans_leaves_nothing(checkout: Path, tmp_path: Path) -> None:
    """SIGTERM to the command alone once synthesis is done: before, leaving the scan's thread pool waited for its
    threads to scan every chunk left with checkov workers no signal reached, so the grace timer ended the check
    (exit 143, no ``terminated``) with a checkov worker still running and its jsii and stream files in TMPDIR."""
    out = tmp_path / "out" / "cdktf.out"
    out.parent.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "GPUFLEET_SYNTH_JOBS"}
    env |= {"TMPDIR": str(tmp_path / "tmp"), "GPUFLEET_SYNTH_CACHE": "off", "GPUFLEET_CHECKOV_CACHE": str(tmp_path / "cache")}
    (tmp_path / "tmp").mkdir()
    # On one core nothing is scanned during synthesis (checkov_scan.Stream needs two): every stack is left to the
    # checkov stage, long enough that a scan going on for nobody outlasts the grace on any machine.
    argv = [GPUFLEET, "check", "--out", str(out), "--clusters-dir", str(checkout / "clusters")]
    proc = subprocess.Popen(argv, cwd=checkout, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, process_group=0,
                            preexec_fn=lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}))
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("stage: checkov"):
            break
    else:
        pytest.fail(f"check ended before its checkov stage: {proc.wait()} {proc.stderr.read() if proc.stderr else ''}")
    time.sleep(0.2)  # the scan's threads have taken their first chunks
    started = _descendants(proc.pid)
    assert proc.poll() is None, "the check ended before the signal: make the fleet larger"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=termination.GRACE_SECONDS + 20)
    assert proc.returncode == -signal.SIGTERM, err
    assert err.strip() == "terminated"
    assert [pid for pid in started if _alive(pid)] == []
    left = sorted(name for name in os.listdir(tmp_path / "tmp") if not name.startswith(NOT_OURS))
    assert left == [], "temporary files left behind"
    assert sorted(os.listdir(out.parent)) == ["cdktf.out"], "a staging directory left beside --out"


def test_sigterm_during_a_preview_lets_the_base_synthesis_clean_up(tmp_path: Path) -> None:
    """``gpufleet preview`` synthesizes a side whose code differs from the running one in a subprocess with that
    side's own ``main.py``, which unwinds on SIGTERM too. Before: ``subprocess.run`` SIGKILLed it as the preview
    unwound from the group's SIGTERM, so its jsii files stayed in TMPDIR."""
    repo = copy_checkout(tmp_path / "repo")
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.com", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@example.com")
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-qm", "base"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=env)
    static_ips = repo / "constructs_lib" / "static_ips.py"  # a code edit: the working tree synthesizes in a subprocess
    static_ips.write_text(static_ips.read_text().replace('f"ip_{ip.name}"', 'f"static_ip_{ip.name}"', 1))
    (tmp_path / "tmp").mkdir()
    env |= {"TMPDIR": str(tmp_path / "tmp"), "GPUFLEET_SYNTH_CACHE": "off"}
    argv = [GPUFLEET, "--repo", str(repo), "preview", "--base", "HEAD", "--cache-dir", str(tmp_path / "cache")]
    proc = subprocess.Popen(argv, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, process_group=0)
    deadline = time.monotonic() + 120

    def side_synthesis() -> int | None:
        for pid in _descendants(proc.pid):
            try:
                if b"runpy.run_path('main.py'" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return pid
            except OSError:
                continue
        return None

    while (side := side_synthesis()) is None or not _descendants(side):  # main.py runs and its jsii kernel is up
        assert proc.poll() is None and time.monotonic() < deadline, f"no subprocess synthesis: {proc.communicate()}"
        time.sleep(0.05)
    time.sleep(1.0)
    started = _descendants(proc.pid)
    os.killpg(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=termination.GRACE_SECONDS + 20)
    assert proc.returncode == -signal.SIGTERM, err
    assert [pid for pid in started if _alive(pid)] == []
    left = sorted(name for name in os.listdir(tmp_path / "tmp") if not name.startswith(NOT_OURS))
    assert left == [], "temporary files left behind"


def test_a_sigterm_while_a_cache_entry_is_written_leaves_no_partial_file(tmp_path: Path) -> None:
    """Synthesis and checkov cache entries are written to a ``.partial.*`` file renamed into place; before, a
    SIGTERM between the two left that file in the cache for good (no later run removes it)."""
    done, _ = _run_snippet("""
        import os, signal, sys, tempfile
        from pathlib import Path
        from clusters import cache_trust
        from clusters.termination import EXIT_TERMINATED, Terminated, sigterm_unwinds

        made = tempfile.mkstemp

        def mkstemp(*args, **kwargs):
            handle = made(*args, **kwargs)
            os.kill(os.getpid(), signal.SIGTERM)  # the SIGTERM arrives while the entry is being written
            return handle

        tempfile.mkstemp = mkstemp
        Path(sys.argv[1], "cache").mkdir()
        try:
            with sigterm_unwinds():
                cache_trust.write(Path(sys.argv[1], "cache", "ab", "entry.json"), "{}")
        except Terminated:
            sys.exit(EXIT_TERMINATED)
    """, tmp_path)
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert os.listdir(tmp_path / "cache" / "ab") == ["entry.json"]


def test_a_hold_in_another_thread_leaves_sigterm_to_the_main_thread(tmp_path: Path) -> None:
    """``held`` counts the main thread's blocks only: a checkov scan thread writing a cache entry must not turn
    the main thread's SIGTERM into a ``Terminated`` raised later in that scan thread."""
    done, _ = _run_snippet("""
        import os, signal, sys, threading, time
        from pathlib import Path
        from clusters.termination import EXIT_TERMINATED, Terminated, held, sigterm_unwinds

        inside, release = threading.Event(), threading.Event()

        def scan():
            with held():
                inside.set()
                release.wait(5)

        try:
            with sigterm_unwinds():
                thread = threading.Thread(target=scan)
                thread.start()
                inside.wait(5)
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(3)
                sys.exit(0)  # not reached: the main thread unwinds at once
        except Terminated:
            Path(sys.argv[1], "unwound").write_text("yes")
            release.set()
            thread.join()
            sys.exit(EXIT_TERMINATED)
    """, tmp_path)
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert (tmp_path / "unwound").is_file(), "the main thread did not unwind on SIGTERM"


def test_a_kernel_that_does_not_exit_when_asked_is_killed_by_the_launchers_exit_hook(tmp_path: Path) -> None:
    """The launcher's Node kernel ignores SIGTERM, so jsii's fallback (a SIGTERM 5 s after an unanswered exit
    request) is void: the launcher's hook kills such a kernel, and only a running child of this process."""
    from constructs_lib.jsii_runtime import clean_up

    hung = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"])
    (tmp_path / "k" / "lib").mkdir(parents=True)
    (tmp_path / "k" / "lib" / "kernel.pid").write_text(str(hung.pid))
    clean_up(tmp_path / "k")
    assert not _alive(hung.pid) and not (tmp_path / "k").exists()  # killed and reaped by the hook
    hung.wait(timeout=5)
    (tmp_path / "n" / "lib").mkdir(parents=True)
    (tmp_path / "n" / "lib" / "kernel.pid").write_text(str(os.getppid()))  # not a child: left alone
    clean_up(tmp_path / "n")
    assert _alive(os.getppid()) and not (tmp_path / "n").exists()


def _ours_alive(tmp: Path) -> list[str]:
    """Processes still running that inherited this test's private TMPDIR: whatever the command started (its
    synthesis workers, early ones in their own process group included, their Node kernels, checkov workers)."""
    marker = f"TMPDIR={tmp}".encode() + b"\0"
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _alive(int(entry.name)):
            try:
                if marker in (entry / "environ").read_bytes():
                    found.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                continue
    return found


@pytest.mark.parametrize("command", ["synth", "check"])
def test_a_command_that_synthesized_ends_with_its_code_and_leaves_nothing(checkout: Path, tmp_path: Path, command: str) -> None:
    """The ``gpufleet`` script ends a process that synthesized without the interpreter's teardown
    (``termination.exit_now``, from ``cli.run``, and in the worker): what the teardown never did is all it may
    skip. The exit hooks still stop every jsii kernel and remove the launcher's, jsii's and (through their exit)
    the kernels' directories, early workers, late workers and checkov workers are gone, the code is the
    command's and its last output is there."""
    out = tmp_path / "out" / "cdktf.out"
    out.parent.mkdir()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "GPUFLEET_SYNTH_JOBS"}
    env |= {"TMPDIR": str(tmp), "GPUFLEET_SYNTH_CACHE": "off", "GPUFLEET_CHECKOV_CACHE": str(tmp_path / "cache")}
    argv = [GPUFLEET, command, "--out", str(out), "--clusters-dir", str(checkout / "clusters")]
    done = subprocess.run(argv + (["--jobs", "2"] if command == "synth" else []), cwd=checkout, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr + done.stdout[-3000:]
    assert done.stdout.splitlines()[-1].startswith("synthesized ") if command == "synth" else "│ checkov " in done.stdout
    deadline = time.monotonic() + 15  # an early worker left without a job ends on its own, unwaited for
    while _ours_alive(tmp) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _ours_alive(tmp) == []
    left = sorted(name for name in os.listdir(tmp) if not name.startswith(NOT_OURS))
    assert left == [], "temporary files left behind"
