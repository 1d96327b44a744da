"""checkov over every synthesized stack, one process per stack in parallel, one summary.

One process per stack keeps each stack's findings attributable without parsing paths back out
of a combined run, and lets the stacks share the machine's cores: checkov spends ~4 s of CPU
starting up, so a serial run over a fleet grows linearly with the stack count. Skips come from
the reviewed ``.checkov-skips.yaml`` (each with a reason), never from inline comments, which
checkov ignores for ``terraform_json``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusters.errors import UserError


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


def scan_stack(directory: Path, skip_ids: tuple[str, ...], binary: str) -> StackResult:
    stack = Path(directory).name
    args = [binary, "-d", str(directory), "--framework", "terraform_json", "--output", "json", "--compact", "--quiet", "--skip-download"]
    if skip_ids:
        args += ["--skip-check", ",".join(skip_ids)]
    env = dict(os.environ, BC_SKIP_MAPPING="TRUE")
    done = subprocess.run(args, capture_output=True, text=True, env=env, check=False)
    try:
        reports = _reports(done.stdout) if done.returncode in (0, 1) else None
    except json.JSONDecodeError:
        reports = None
    if reports is None:
        last = next((line for line in reversed(done.stderr.splitlines()) if line.strip()), f"exit {done.returncode}")
        return StackResult(stack, 0, (), error=last.strip())
    parsing_errors = sum(int(report.get("summary", {}).get("parsing_errors", 0)) for report in reports)
    if parsing_errors:
        return StackResult(stack, 0, (), error=f"checkov could not parse {parsing_errors} file(s); a stack it cannot read is not a pass")
    source = (Path(directory) / "cdk.tf.json").read_text(encoding="utf-8").splitlines()
    failed = [f for report in reports for f in report.get("results", {}).get("failed_checks", [])]
    failures = tuple(
        sorted(
            (
                Failure(stack, f["check_id"], f.get("check_name", ""), _address(source, f.get("resource", ""), line), line)
                for f in failed
                for line in [(f.get("file_line_range") or [None])[0]]
            ),
            key=lambda f: (f.check_id, f.resource),
        )
    )
    passed = sum(int(report.get("summary", {}).get("passed", 0)) for report in reports)
    return StackResult(stack, passed, failures)


def run(stack_dirs: Iterable[Path], skip_ids: Iterable[str] | None = None, *, max_workers: int | None = None) -> CheckovSummary:
    """Scan every stack directory concurrently; ``skip_ids`` defaults to the reviewed skip file."""
    if skip_ids is None:
        from gpufleet.checkov_skips import load_skips

        skip_ids = [s.check_id for s in load_skips()]
    skips = tuple(sorted(skip_ids))
    directories = sorted(Path(d) for d in stack_dirs)
    binary = checkov_binary()
    workers = max_workers or max(1, min(len(directories), os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = tuple(pool.map(lambda d: scan_stack(d, skips, binary), directories))
    return CheckovSummary(results, skips)
