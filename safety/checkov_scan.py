"""checkov over every synthesized stack, in parallel processes, with one result per stack and one summary.

Measured on the 6 example stacks (2 shared, busy cores): one checkov process per stack took
38 s serial and 42 s two at a time, because each process spends ~4-5 s of CPU starting; one
process over all six files took 9 s, two processes of three 19 s. So each worker process scans
a share of the stacks (``-f`` per stack file), results are split back per stack by file path,
and a second process starts only for a fleet large enough to repay its start-up. Skips come from
the reviewed ``.checkov-skips.yaml`` (each with a reason), never from inline comments, which
checkov ignores for ``terraform_json``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusters import cache_trust
from clusters.tools import installed_tool

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


def _reports(stdout: str) -> list[dict[str, Any]]:
    data = json.loads(stdout)
    return data if isinstance(data, list) else [data]


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


def scan_group(directories: tuple[Path, ...], skip_ids: tuple[str, ...], binary: str) -> list[StackResult]:
    """One checkov process for a group of stacks (``-f`` per stack file), results split back per stack by file."""
    files = {(d / "cdk.tf.json").resolve(): d for d in directories}
    args = [binary, "--framework", "terraform_json", "--output", "json", "--compact", "--skip-download"]
    for path in files:
        args += ["-f", str(path)]
    if skip_ids:
        args += ["--skip-check", ",".join(skip_ids)]
    done = subprocess.run(args, capture_output=True, text=True, env=dict(os.environ, BC_SKIP_MAPPING="TRUE"), check=False)
    try:
        reports = _reports(done.stdout) if done.returncode in (0, 1) else None
    except json.JSONDecodeError:
        reports = None
    if reports is None:
        last = next((line for line in reversed(done.stderr.splitlines()) if line.strip()), f"exit {done.returncode}")
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


def default_workers(stacks: int) -> int:
    """One process per ``STACKS_PER_PROCESS`` stacks, at most one per core: a second process pays off only once
    its share of scanning outweighs its own start-up."""
    return max(1, min(os.cpu_count() or 1, -(-stacks // STACKS_PER_PROCESS)))


def run(stack_dirs: Iterable[Path], skip_ids: Iterable[str] | None = None, *, workers: int | None = None) -> CheckovSummary:
    """Scan every stack directory, split over ``workers`` concurrent checkov processes (default: ``default_workers``).

    Stacks whose result is in ``safety.checkov_cache`` (same JSON bytes, checkov version, skips and
    rules) are not scanned again.
    """
    from safety import checkov_cache

    if skip_ids is None:
        from safety.checkov_skips import load_skips

        skip_ids = [s.check_id for s in load_skips()]
    skips = tuple(sorted(skip_ids))
    directories = sorted(Path(d) for d in stack_dirs)
    if not directories:
        return CheckovSummary((), skips)
    binary = checkov_binary()
    cache = checkov_cache.cache_dir()
    cache = cache_trust.prepare(cache, checkov_cache.CACHE_ENV) if cache is not None else None
    keys: dict[Path, str] = {}
    results: list[StackResult] = []
    if cache is not None:
        version = checkov_cache.checkov_version(binary)
        keys = {d: checkov_cache.key(d, version, skips) for d in directories}
        cached = {d: checkov_cache.load(cache, keys[d], d.name) for d in directories}
        results = [r for r in cached.values() if r is not None]
        directories = [d for d in directories if cached[d] is None]
    if directories:
        count = max(1, min(len(directories), workers or default_workers(len(directories))))
        groups = [tuple(directories[i::count]) for i in range(count)]
        with ThreadPoolExecutor(max_workers=count) as pool:
            scanned = [result for group in pool.map(lambda g: scan_group(g, skips, binary), groups) for result in group]
        if cache is not None:
            for directory, result in zip([d for g in groups for d in g], scanned):
                checkov_cache.store(cache, keys[directory], result)
        results += scanned
    return CheckovSummary(tuple(sorted(results, key=lambda r: r.stack)), skips)
