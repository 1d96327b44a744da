"""checkov over every synthesized stack, in parallel worker processes, with one result per stack and one summary.

Measured on the 6 example stacks (2 shared, busy cores): one checkov process per stack took
38 s serial and 42 s two at a time, because each process spends ~4-5 s of CPU starting. So a
few long-lived worker processes (``safety/checkov_worker.py``: checkov's own CLI entry, run in
process once per stack, handed ``STACKS_PER_CHUNK`` stacks at a time, with the rendering it repeats
across stacks remembered) take the chunks one at a time; results are split back per stack by file path,
and a second process starts only for a fleet large enough to repay its start-up. A chunk holds
one small graph at a time, where one process over a whole 200-cluster fleet held 200 stacks'
(about 1 GB each for two processes). Skips come from the reviewed ``.checkov-skips.yaml`` (each
with a reason), never from inline comments, which checkov ignores for ``terraform_json``.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusters import cache_trust
from clusters.errors import ConfigError, UserError
from clusters.tools import installed_tool

STACKS_PER_PROCESS = 8
# Stacks handed to a worker at a time. Each is its own checkov run (``checkov_worker.scan``), so a chunk only
# saves messages; a small one evens the last chunks out between workers and lets ``Stream.finish`` wait
# for little.
STACKS_PER_CHUNK = 4
WORKER = Path(__file__).with_name("checkov_worker.py")
# How long a worker may take to answer one chunk before it is stopped and the chunk's stacks are reported as errors.
# A chunk is a few stacks of about 0.1 s of checkov each (a 200-cluster fleet's largest well under a second), so
# only a hung checkov (a deadlock, a pathological regex or rendering loop) reaches it; without it `gpufleet check`
# waited forever.
TIMEOUT_ENV = "GPUFLEET_CHECKOV_TIMEOUT_SECONDS"
DEFAULT_TIMEOUT_SECONDS = 600.0


def answer_timeout() -> float:
    """``$GPUFLEET_CHECKOV_TIMEOUT_SECONDS`` (a positive number of seconds), else ``DEFAULT_TIMEOUT_SECONDS``."""
    from clusters.errors import UserError

    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT_SECONDS
    try:
        seconds = float(raw)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < float("inf"):
        raise UserError(f"{TIMEOUT_ENV}={raw!r}: not a positive number of seconds; set it to a bound such as 600, or unset it")
    return seconds


@dataclass(frozen=True)
class Failure:
    stack: str
    check_id: str
    check_name: str
    resource: str
    line: int | None

    def __str__(self) -> str:
        where = f" (cdk.tf.json:{self.line})" if self.line else ""
        return f"checkov: {self.stack}: {self.check_id} {self.check_name}: {self.resource}{where}"


@dataclass(frozen=True)
class StackResult:
    stack: str
    passed: int
    failures: tuple[Failure, ...]
    error: str | None = None
    exempted: tuple[Failure, ...] = ()


@dataclass(frozen=True)
class CheckovSummary:
    stacks: tuple[StackResult, ...]
    skipped_ids: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return all(not s.failures and s.error is None for s in self.stacks)

    @property
    def summary_line(self) -> str:
        passed = sum(s.passed for s in self.stacks)
        failed = sum(len(s.failures) for s in self.stacks)
        errors = [s.stack for s in self.stacks if s.error]
        line = f"{len(self.stacks)} stack(s): {passed} passed, {failed} failed"
        if errors:
            line += f", checkov errored on {', '.join(errors)}"
        exempted = sum(len(s.exempted) for s in self.stacks)
        if exempted:
            line += f", {exempted} exempted per resource (safety/checkov_exempt.py)"
        return line + (f"; {len(self.skipped_ids)} check(s) skipped by .checkov-skips.yaml" if self.skipped_ids else "")

    @property
    def failure_lines(self) -> list[str]:
        lines = [str(f) for s in self.stacks for f in s.failures]
        return lines + [f"checkov: {s.stack}: error: {s.error}" for s in self.stacks if s.error]


def checkov_binary() -> str:
    return installed_tool("checkov", "install it with: pip install -e '.[dev]'")


_KEY = re.compile(r'^(\s*)"([^"]+)"\s*:\s*\{')


def _address(lines: list[str], resource: str, line: int | None) -> str:
    """checkov names a terraform_json resource ``resource.<name>``; the type is the enclosing key above its line."""
    name = resource.removeprefix("resource.")
    if not line or line > len(lines) or not resource.startswith("resource."):
        return resource
    own = _KEY.match(lines[line - 1])
    if own is None or own.group(2) != name:
        return resource
    for text in reversed(lines[: line - 1]):
        parent = _KEY.match(text)
        if parent and len(parent.group(1)) < len(own.group(1)):
            return f"{parent.group(2)}.{name}"
    return resource


def _stack_result(directory: Path, checks: list[dict[str, Any]], passed: int, unparsed: bool) -> StackResult:
    stack = directory.name
    if unparsed:
        return StackResult(stack, 0, (), error="checkov could not parse cdk.tf.json; a stack it cannot read is not a pass")
    from safety.checkov_exempt import exemptions

    text = (directory / "cdk.tf.json").read_text(encoding="utf-8")
    source = text.splitlines()
    exempt = {(check, address) for check, address, _ in exemptions(json.loads(text))}
    found = sorted(
        (
            Failure(stack, f["check_id"], f.get("check_name", ""), _address(source, f.get("resource", ""), line), line)
            for f in checks
            for line in [(f.get("file_line_range") or [None])[0]]
        ),
        key=lambda f: (f.check_id, f.resource),
    )
    failures = tuple(f for f in found if (f.check_id, f.resource) not in exempt)
    return StackResult(stack, passed, failures, exempted=tuple(f for f in found if (f.check_id, f.resource) in exempt))


def checkov_args(skip_ids: tuple[str, ...]) -> list[str]:
    """The options every scan passes checkov (besides ``-f`` per stack file)."""
    args = ["--framework", "terraform_json", "--output", "json", "--compact", "--skip-download"]
    return args + (["--skip-check", ",".join(skip_ids)] if skip_ids else [])


def checkov_env() -> dict[str, str]:
    """checkov's environment: ours, without its download of the platform's check-id mapping (offline)."""
    return dict(os.environ, BC_SKIP_MAPPING="TRUE")


def checkov_python(binary: str) -> str:
    """The interpreter checkov is installed in: its script's ``#!`` line, else this interpreter."""
    try:
        with open(binary, "rb") as script:
            first = script.readline(512).decode("utf-8", "replace").strip()
    except OSError:
        return sys.executable
    interpreter = first.removeprefix("#!").split()[0] if first.startswith("#!") and len(first) > 2 else ""
    return interpreter if "python" in Path(interpreter).name and Path(interpreter).is_file() else sys.executable


def split_reports(directories: tuple[Path, ...], reports: list[dict[str, Any]]) -> list[StackResult]:
    """checkov's JSON report(s) over several stack files, split back per stack by file path."""
    files = {(d / "cdk.tf.json").resolve(): d for d in directories}
    passed: dict[Path, int] = dict.fromkeys(files, 0)
    failed: dict[Path, list[dict[str, Any]]] = {path: [] for path in files}
    unparsed: set[Path] = set()
    for report in reports:
        results = report.get("results", {})
        for check in results.get("passed_checks", []):
            passed[Path(check["file_abs_path"]).resolve()] += 1
        for check in results.get("failed_checks", []):
            failed[Path(check["file_abs_path"]).resolve()].append(check)
        unparsed.update(Path(p).resolve() for p in results.get("parsing_errors", []))
    return [_stack_result(d, failed[path], passed[path], path in unparsed) for path, d in files.items()]


class _Worker:
    """One ``checkov_worker`` process: a chunk of stack files in, that chunk's report out."""

    def __init__(self, python: str, skip_ids: tuple[str, ...]) -> None:
        self.python, self.skip_ids, self.env, self.ended = python, skip_ids, checkov_env(), False
        self.timeout, self.timed_out = answer_timeout(), False
        self.stderr = tempfile.TemporaryFile(mode="w+", encoding="utf-8")
        self.process = subprocess.Popen([python, str(WORKER), *checkov_args(skip_ids)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self.stderr, text=True, env=self.env)

    def scan(self, directories: tuple[Path, ...]) -> list[StackResult]:
        """The chunk's results; a worker that gives no answer within ``timeout`` is killed (``timed_out``) and
        the chunk's stacks get that as their error."""
        assert self.process.stdin is not None and self.process.stdout is not None
        timer = threading.Timer(self.timeout, self._time_out)
        timer.daemon = True
        timer.start()
        try:
            self.process.stdin.write(json.dumps([str((d / "cdk.tf.json").resolve()) for d in directories]) + "\n")
            self.process.stdin.flush()
            answer = json.loads(self.process.stdout.readline() or "null")
        except (OSError, ValueError):
            answer = None
        finally:
            timer.cancel()
            # A timer that fired as the answer came (it had checked ``finished`` before ``cancel``) is still to kill
            # the worker: wait for it, so ``timed_out`` is settled before the worker is given another chunk.
            timer.join()
        if answer is None and self.timed_out:
            error = f"checkov gave no answer within {self.timeout:g} s ({TIMEOUT_ENV}); its worker was stopped"
            return [StackResult(d.name, 0, (), error=error) for d in directories]
        error = answer.get("error") if isinstance(answer, dict) else self._last_error()
        if error is None and isinstance(answer, dict) and isinstance(answer.get("reports"), list):
            return split_reports(directories, answer["reports"])
        return [StackResult(d.name, 0, (), error=str(error or self._last_error())) for d in directories]

    def _time_out(self) -> None:
        self.timed_out = True
        self.process.kill()

    def _last_error(self) -> str:
        """Why a chunk got no answer: the signal that killed the worker (its last stderr line is then just
        whatever checkov logged last), else that last line, else its exit status."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)  # it closed its answers: let it be reaped, so its status is known
        code = self.process.returncode
        if code is not None and code < 0:
            return f"checkov worker killed by signal {-code}"
        self.stderr.seek(0)
        lines = [line.strip() for line in self.stderr.read().splitlines() if line.strip()]
        return lines[-1] if lines else f"checkov worker exited {code}"

    def close(self) -> None:
        """End of input ends the worker; one that already died has nothing left to flush."""
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        self.process.wait()
        self.stderr.close()
        self.ended = True

    def discard(self) -> None:
        """A worker that got no chunk: ended at once, not after its imports (nothing of it is wanted)."""
        self.process.kill()
        self.close()


def prestart(skip_ids: Iterable[str] | None = None) -> _Worker:
    """One worker started before the stacks exist, so checkov's imports (seconds) run on another core
    while the fleet synthesizes; ``run(..., warm=)`` scans with it, or discards it when nothing needs a scan."""
    return _Worker(checkov_python(checkov_binary()), _skips(skip_ids))


@contextlib.contextmanager
def warmed(enabled: bool, *, defer_errors: bool = False) -> Iterator[_Worker | None]:
    """``prestart`` when ``enabled``; whatever happens before ``run`` takes the worker, it never outlives the block.
    ``defer_errors``: a worker that cannot start (no checkov, a wrong skip file) gives None instead of the error,
    for a caller that starts one again later, where that error is reported after the cluster files'."""
    try:
        warm = prestart() if enabled else None
    except (UserError, ConfigError):
        if not defer_errors:
            raise
        warm = None
    try:
        yield warm
    finally:
        if warm is not None and not warm.ended:
            warm.discard()


def _skips(skip_ids: Iterable[str] | None) -> tuple[str, ...]:
    if skip_ids is None:
        from safety.checkov_skips import load_skips

        skip_ids = [s.check_id for s in load_skips()]
    return tuple(sorted(skip_ids))


def scan_chunks(chunks: list[tuple[Path, ...]], skip_ids: tuple[str, ...], binary: str, workers: int,
                done: Callable[[tuple[Path, ...], list[StackResult]], None], warm: _Worker | None = None) -> None:
    """``workers`` checkov worker processes take the chunks one at a time; ``done`` hears each chunk's results.
    ``warm`` (started by ``prestart``) is the first of them when it has the same interpreter, skips and environment
    (checkov reads options from it, and the cache key hashes the scan's): else it is discarded unused."""
    todo: queue.SimpleQueue[tuple[Path, ...]] = queue.SimpleQueue()
    for chunk in chunks:
        todo.put(chunk)
    python = checkov_python(binary)
    if warm is not None and (warm.python, warm.skip_ids, warm.env) != (python, skip_ids, checkov_env()):
        warm.discard()
        warm = None
    started = iter([warm] if warm is not None else [])
    stopped = threading.Event()
    running: list[_Worker] = []

    def work() -> None:
        worker = next(started, None) or _Worker(python, skip_ids)
        running.append(worker)
        if stopped.is_set():  # started as the scan was abandoned: ``_abandon`` may have missed it
            worker.process.kill()
        try:
            while True:
                try:
                    chunk = todo.get_nowait()
                except queue.Empty:
                    return
                if worker.timed_out:  # stopped on an earlier chunk: the rest get a fresh one (a worker that died of its
                    worker.close()     # own accord, a broken install say, is not restarted chunk after chunk)
                    worker = _Worker(python, skip_ids)
                done(chunk, worker.scan(chunk))
        finally:
            worker.close()

    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(work) for _ in range(workers)]
        try:
            for future in futures:
                future.result()
        except BaseException:
            _abandon(todo, running, stopped)
            raise


def _abandon(todo: queue.SimpleQueue[tuple[Path, ...]], running: list[_Worker], stopped: threading.Event) -> None:
    """The caller is unwinding (SIGTERM, Ctrl-C, an error in ``done``): leaving the pool waits for its threads,
    which would otherwise scan every chunk left, for nobody, with workers no signal reached (SIGTERM to the
    command alone), until the grace timer ended the process with its temporary files still there. The threads
    take no further chunk and the workers are killed, so the chunk each scans ends at once (an error result,
    which the checkov cache never stores)."""
    stopped.set()
    while True:
        try:
            todo.get_nowait()
        except queue.Empty:
            break
    for worker in list(running):
        worker.process.kill()


def default_workers(stacks: int) -> int:
    """One process per ``STACKS_PER_PROCESS`` stacks, at most one per core: a second process pays off only once
    its share of scanning outweighs its own start-up."""
    return max(1, min(os.cpu_count() or 1, -(-stacks // STACKS_PER_PROCESS)))


def run(stack_dirs: Iterable[Path], skip_ids: Iterable[str] | None = None, *, workers: int | None = None,
        warm: _Worker | None = None) -> CheckovSummary:
    """Scan every stack directory, split over ``workers`` concurrent checkov processes (default: ``default_workers``).

    Stacks whose result is in ``safety.checkov_cache`` (same JSON bytes, checkov version, skips and
    rules) are not scanned again. ``warm`` (``prestart``) is used as the first process, or discarded
    when every stack's result is cached.
    """
    try:
        directories = sorted(Path(d) for d in stack_dirs)
        return _run(directories, _skips(skip_ids), workers, warm, {}, _cache() if directories else None)
    finally:
        _discard_unused(warm)


def _cache() -> Path | None:
    """The checkov cache directory, made and trusted (``cache_trust.prepare`` says once on stderr why not), or None."""
    from safety import checkov_cache

    cache = checkov_cache.cache_dir()
    return cache_trust.prepare(cache, checkov_cache.CACHE_ENV) if cache is not None else None


def _discard_unused(warm: _Worker | None) -> None:
    if warm is not None and not warm.ended:
        warm.discard()  # nothing was left to scan (or the scan failed before it started)


def _run(directories: list[Path], skips: tuple[str, ...], workers: int | None, warm: _Worker | None,
         known: dict[Path, StackResult], cache: Path | None, served: tuple[StackResult, ...] = (),
         version: str | None = None, common: tuple[bytes, bytes] | None = None) -> CheckovSummary:
    """``run``'s scan, with the cache already prepared (``Stream`` prepares it when it starts, so a refused cache
    is reported once). ``known`` are results ``Stream`` scanned already, of stacks with these very bytes: they
    go into the summary and, like every scanned result, the cache. ``served``: results ``Stream`` took from the
    cache for stacks with these very bytes; they go into the summary only. ``version`` and ``common``: checkov's
    version and the keys' shared part, when the caller already read them (``checkov_cache.checkov_version``,
    ``checkov_cache.shared``)."""
    from safety import checkov_cache

    if not directories and not known and not served:
        return CheckovSummary((), skips)
    binary = checkov_binary()
    keys: dict[Path, str] = {}
    results: list[StackResult] = [*served, *known.values()]
    if cache is not None and (directories or known):
        version = version if version is not None else checkov_cache.checkov_version(binary)
        common = common or checkov_cache.shared()
        for directory, result in known.items():
            checkov_cache.store(cache, checkov_cache.key(directory, version, skips, common), result)
        keys = {d: checkov_cache.key(d, version, skips, common) for d in directories}
        cached = {d: checkov_cache.load(cache, keys[d], d.name) for d in directories}
        results += [r for r in cached.values() if r is not None]
        directories = [d for d in directories if cached[d] is None]
    if directories:
        chunks = [tuple(directories[i:i + STACKS_PER_CHUNK]) for i in range(0, len(directories), STACKS_PER_CHUNK)]
        count = max(1, min(len(chunks), workers or default_workers(len(directories))))
        lock = threading.Lock()

        def done(chunk: tuple[Path, ...], scanned: list[StackResult]) -> None:
            with lock:
                results.extend(scanned)
            if cache is not None:
                for directory, result in zip(chunk, scanned):
                    checkov_cache.store(cache, keys[directory], result)

        scan_chunks(chunks, skips, binary, count, done, warm)
    return CheckovSummary(tuple(sorted(results, key=lambda r: r.stack)), skips)


class Stream:
    """Stacks scanned while the fleet still synthesizes: ``add`` (``synthesize(written=)``) looks each stack file
    up in the checkov cache as it is written, copies each miss, and one worker scans the copies meanwhile;
    ``finish`` returns what ``run`` over the final stacks returns.

    Why copies: the staging tree is renamed into place after synthesis, so a path handed to checkov
    meanwhile would vanish. A copied result, or a hit, is used only for a final stack of the same name
    and the same bytes (compared in ``finish``), which is everything its result is a function of (the
    worker runs checkov once per stack, ``checkov_worker.scan``); any other stack is scanned as
    ``run`` scans it, with this worker as the first process. Results are stored in the checkov
    cache only in ``finish``, so a synthesis that fails leaves the cache as it was.
    One worker scans during synthesis (it runs on the core the synthesis leaves; a second would
    take time from synthesis, pinned to its own core), and ``finish`` adds the others."""

    def __init__(self, skip_ids: Iterable[str] | None = None, warm: _Worker | None = None) -> None:
        from safety import checkov_cache

        self.skips = _skips(skip_ids)
        self.binary = checkov_binary()
        python = checkov_python(self.binary)
        if warm is not None and (warm.python, warm.skip_ids, warm.env) != (python, self.skips, checkov_env()):
            warm.discard()
            warm = None
        self.worker = warm
        self.python = python
        self.cache = _cache()
        self.version = checkov_cache.checkov_version(self.binary) if self.cache is not None else ""
        self.common = checkov_cache.shared()  # the rules and checkov's settings this stream's results are of
        self.root = Path(tempfile.mkdtemp(prefix="gpufleet-checkov-stream-"))
        self.copied: dict[str, bytes | None] = {}  # stack name -> the bytes its copy holds (None: not to be used)
        self.results: dict[str, StackResult] = {}
        self.served: dict[str, StackResult] = {}  # stack name -> the cache's result for the bytes in ``copied``
        self.todo: queue.SimpleQueue[Path | None] = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self.stopping = False

    def add(self, stack_dir: Path) -> None:
        """Look one written stack up in the checkov cache (a hit is kept for ``finish``), else copy it and queue it.
        A stack told twice, or one that cannot be read or copied, is left to ``finish``: no result of this stream
        is used for it. Only a miss is copied: in a one-cluster edit most of the fleet is a hit."""
        name = Path(stack_dir).name
        if name in self.copied:
            self.copied[name] = None
            self.served.pop(name, None)
            return
        self.copied[name] = None
        try:
            data = (Path(stack_dir) / "cdk.tf.json").read_bytes()
        except OSError:
            return
        if self.cache is not None:
            from safety import checkov_cache

            hit = checkov_cache.load(self.cache, checkov_cache.key_of(name, data, self.version, self.skips, self.common), name)
            if hit is not None:
                self.copied[name] = data
                self.served[name] = hit
                return
        copy = self.root / name
        try:
            copy.mkdir()
            (copy / "cdk.tf.json").write_bytes(data)
        except OSError:
            return
        self.copied[name] = data
        if self.thread is None:
            self.thread = threading.Thread(target=self._work, name="checkov-stream", daemon=True)
            self.thread.start()
        self.todo.put(copy)

    def _work(self) -> None:
        worker = self.worker or _Worker(self.python, self.skips)
        self.worker = worker
        while True:
            first = self.todo.get()
            if first is None or self.stopping:  # what is still queued is scanned by every worker in ``finish``
                return
            chunk = [first]
            while len(chunk) < STACKS_PER_CHUNK:
                try:
                    more = self.todo.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self.todo.put(None)
                    break
                chunk.append(more)
            for result in worker.scan(tuple(chunk)):
                self.results[result.stack] = result

    def finish(self, stack_dirs: Iterable[Path], *, workers: int | None = None) -> CheckovSummary:
        """The summary ``run(stack_dirs)`` gives: results of copies, and cache hits, whose bytes are the final
        stack's, the rest (and any stack the stream's worker failed on) scanned now; none of them when the rules,
        checkov's settings or its version changed while the stream ran."""
        self._stop()
        final = sorted(Path(d) for d in stack_dirs)
        # The rules, checkov's settings (a .checkov.yaml) or checkov itself changed since the stream started: its scans
        # and hits are results of the old ones, and a scan would be stored under the new key. Every stack is decided
        # now instead.
        from safety import checkov_cache

        version = checkov_cache.checkov_version(self.binary) if self.cache is not None else None
        common = checkov_cache.shared()
        changed = common != self.common or (version is not None and version != self.version)
        # an error (the worker died beside synthesis, say) is no result of the bytes: that stack is scanned again
        same = set() if changed else {d for d in final if self.copied.get(d.name) is not None
                                      and self.copied[d.name] == (d / "cdk.tf.json").read_bytes()}
        streamed = {d: self.results[d.name] for d in final
                    if d in same and d.name in self.results and self.results[d.name].error is None}
        served = {d: self.served[d.name] for d in final if d in same and d.name in self.served}
        warm, self.worker = self.worker, None
        if warm is not None and warm.process.poll() is not None:
            warm.close()  # it died: its stacks and the rest get a fresh worker
            warm = None
        try:
            return _run([d for d in final if d not in streamed and d not in served], self.skips, workers, warm, streamed,
                        self.cache, tuple(served.values()), version, common)
        finally:
            _discard_unused(warm)

    def _stop(self) -> None:
        """Let the worker end the chunk it scans; it takes no other."""
        self.stopping = True
        if self.thread is not None:
            self.todo.put(None)
            self.thread.join()
            self.thread = None

    def close(self) -> None:
        """Stop scanning (after ``finish``, or a synthesis that failed): no worker or copy outlives the check."""
        try:
            self._stop()
        finally:
            if self.worker is not None and not self.worker.ended:
                self.worker.discard()
            self.worker = None
            shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def streamed(enabled: bool, warm: _Worker | None = None) -> Iterator[Stream | None]:
    """A ``Stream`` when ``enabled`` (else None), closed however the block ends."""
    stream = Stream(warm=warm) if enabled else None
    try:
        yield stream
    finally:
        if stream is not None:
            stream.close()
