"""checkov over every synthesized stack, in parallel processes, with one result per stack and one summary.

Measured on the 6 example stacks (2 shared, busy cores): one checkov process per stack took
38 s serial and 42 s two at a time, because each process spends ~4-5 s of CPU starting; one
process over all six files took 9 s, two processes of three 19 s. So each worker process scans
a share of the stacks (``-f`` per stack file), results are split back per stack by file path,
and a second process starts only for a fleet large enough to repay its start-up. Skips come from
the reviewed ``.checkov-skips.yaml`` (each with a reason), never from inline comments, which
checkov ignores for ``terraform_json``. ``prestart`` starts the workers before the stacks exist (see
``checkov_worker``) so that their import of checkov overlaps synthesis in ``gpufleet check``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusters.errors import UserError

STACKS_PER_PROCESS = 8


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
        return line + (f"; {len(self.skipped_ids)} check(s) skipped by .checkov-skips.yaml" if self.skipped_ids else "")

    @property
    def failure_lines(self) -> list[str]:
        lines = [str(f) for s in self.stacks for f in s.failures]
        return lines + [f"checkov: {s.stack}: error: {s.error}" for s in self.stacks if s.error]


def checkov_binary() -> str:
    """checkov installed next to this interpreter (the venv), else on PATH."""
    beside = Path(sys.executable).parent / "checkov"
    if beside.is_file():
        return str(beside)
    found = shutil.which("checkov")
    if found is None:
        raise UserError("checkov not found next to the Python interpreter or on PATH; pip install -e '.[dev]'")
    return found


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


def _reports(stdout: str) -> list[dict[str, Any]]:
    data = json.loads(stdout)
    return data if isinstance(data, list) else [data]


def _stack_result(directory: Path, checks: list[dict[str, Any]], passed: int, unparsed: bool) -> StackResult:
    stack = directory.name
    if unparsed:
        return StackResult(stack, 0, (), error="checkov could not parse cdk.tf.json; a stack it cannot read is not a pass")
    source = (directory / "cdk.tf.json").read_text(encoding="utf-8").splitlines()
    failures = sorted(
        (
            Failure(stack, f["check_id"], f.get("check_name", ""), _address(source, f.get("resource", ""), line), line)
            for f in checks
            for line in [(f.get("file_line_range") or [None])[0]]
        ),
        key=lambda f: (f.check_id, f.resource),
    )
    return StackResult(stack, passed, tuple(failures))


def _stack_files(directories: tuple[Path, ...]) -> dict[Path, Path]:
    return {(d / "cdk.tf.json").resolve(): d for d in directories}


def _checkov_args(files: Iterable[Path], skip_ids: tuple[str, ...]) -> list[str]:
    """checkov's arguments after the program name, the same for the console script and a prestarted worker."""
    args = ["--framework", "terraform_json", "--output", "json", "--compact", "--skip-download"]
    for path in files:
        args += ["-f", str(path)]
    if skip_ids:
        args += ["--skip-check", ",".join(skip_ids)]
    return args


def _checkov_env() -> dict[str, str]:
    return dict(os.environ, BC_SKIP_MAPPING="TRUE")


def _split_results(directories: tuple[Path, ...], files: dict[Path, Path], returncode: int, stdout: str, stderr: str) -> list[StackResult]:
    """One checkov run's JSON report, split back per stack by file path; a run without a report errors every stack."""
    try:
        reports = _reports(stdout) if returncode in (0, 1) else None
    except json.JSONDecodeError:
        reports = None
    if reports is None:
        last = next((line for line in reversed(stderr.splitlines()) if line.strip()), f"exit {returncode}")
        return [StackResult(d.name, 0, (), error=last.strip()) for d in directories]
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


def scan_group(directories: tuple[Path, ...], skip_ids: tuple[str, ...], binary: str) -> list[StackResult]:
    """One checkov process for a group of stacks (``-f`` per stack file), results split back per stack by file."""
    files = _stack_files(directories)
    done = subprocess.run([binary, *_checkov_args(files, skip_ids)], capture_output=True, text=True, env=_checkov_env(), check=False)
    return _split_results(directories, files, done.returncode, done.stdout, done.stderr)


def default_workers(stacks: int) -> int:
    """One process per ``STACKS_PER_PROCESS`` stacks, at most one per core: a second process pays off only once
    its share of scanning outweighs its own start-up."""
    return max(1, min(os.cpu_count() or 1, -(-stacks // STACKS_PER_PROCESS)))


def _skips(skip_ids: Iterable[str] | None) -> tuple[str, ...]:
    if skip_ids is None:
        from gpufleet.checkov_skips import load_skips

        skip_ids = [s.check_id for s in load_skips()]
    return tuple(sorted(skip_ids))


def _groups(stack_dirs: Iterable[Path], workers: int | None) -> list[tuple[Path, ...]]:
    directories = sorted(Path(d) for d in stack_dirs)
    if not directories:
        return []
    count = max(1, min(len(directories), workers or default_workers(len(directories))))
    return [tuple(directories[i::count]) for i in range(count)]


def _summary(groups: list[tuple[Path, ...]], skips: tuple[str, ...], scan: Callable[[int, tuple[Path, ...]], list[StackResult]]) -> CheckovSummary:
    with ThreadPoolExecutor(max_workers=max(1, len(groups))) as pool:
        results = [result for group in pool.map(scan, range(len(groups)), groups) for result in group]
    return CheckovSummary(tuple(sorted(results, key=lambda r: r.stack)), skips)


def run(stack_dirs: Iterable[Path], skip_ids: Iterable[str] | None = None, *, workers: int | None = None) -> CheckovSummary:
    """Scan every stack directory, split over ``workers`` concurrent checkov processes (default: ``default_workers``)."""
    skips = _skips(skip_ids)
    groups = _groups(stack_dirs, workers)
    if not groups:
        return CheckovSummary((), skips)
    binary = checkov_binary()
    return _summary(groups, skips, lambda _, group: scan_group(group, skips, binary))


class PrestartedCheckov:
    """checkov worker processes started before the stacks exist, so their ``import checkov.main`` (~4 s of the
    ~6.6 s a scan of the example fleet takes) overlaps input validation and synthesis.

    Use it as a context manager: leaving the block stops every worker still running, whether or not ``run``
    was reached, so a failed synthesis leaves no process behind.
    """

    def __init__(self, workers: int) -> None:
        self._workers: list[subprocess.Popen[str]] = []
        for _ in range(workers):
            self._workers.append(self._start())

    @staticmethod
    def _start() -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "gpufleet.safety.checkov_worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_checkov_env(),
        )

    @property
    def pids(self) -> tuple[int, ...]:
        return tuple(w.pid for w in self._workers)

    def run(self, stack_dirs: Iterable[Path], skip_ids: Iterable[str] | None = None, *, workers: int | None = None) -> CheckovSummary:
        """What ``run`` returns for the same arguments. Groups beyond the prestarted workers get a fresh worker;
        prestarted workers left over are stopped."""
        skips = _skips(skip_ids)
        groups = _groups(stack_dirs, workers)
        assigned, spare = self._workers[: len(groups)], self._workers[len(groups) :]
        self._workers = assigned
        for worker in spare:
            _stop(worker)
        self._workers += [self._start() for _ in range(len(groups) - len(assigned))]

        def scan(index: int, group: tuple[Path, ...]) -> list[StackResult]:
            worker, files = self._workers[index], _stack_files(group)
            stdout, stderr = worker.communicate(json.dumps(_checkov_args(files, skips)) + "\n")
            return _split_results(group, files, worker.returncode, stdout, stderr)

        try:
            return _summary(groups, skips, scan)
        finally:
            self.close()

    def close(self) -> None:
        """Stop every worker still running; after ``run`` they have all exited and this only reaps them."""
        for worker in self._workers:
            _stop(worker)
        self._workers = []

    def __enter__(self) -> PrestartedCheckov:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _stop(worker: subprocess.Popen[str]) -> None:
    if worker.poll() is None:
        # An idle worker holds nothing worth flushing; it is still importing or waiting on stdin.
        worker.kill()
    worker.communicate()


def prestart(workers: int = 1) -> PrestartedCheckov:
    """Start ``workers`` checkov processes now, for ``PrestartedCheckov.run`` once the stacks are written.

    One suits any fleet up to ``STACKS_PER_PROCESS`` stacks; ``run`` starts more itself if the fleet needs them.
    """
    if importlib.util.find_spec("checkov") is None:
        raise UserError(f"checkov is not installed for {sys.executable}; pip install -e '.[dev]'")
    return PrestartedCheckov(workers)
