"""Shared helpers of the adversarial suite and the per-class counts printed at the end of the run."""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path

RESULTS: list[tuple[str, str, str]] = []


def tree_hash(root: Path, only: tuple[str, ...] = (), skip: tuple[str, ...] = ("out", "__pycache__")) -> str:
    """SHA-256 over every path and file content below ``root`` (or its ``only`` children), ``skip`` dirs excluded."""
    digest = hashlib.sha256()
    tops = [root / name for name in only] if only else [root]
    for top in tops:
        for path in sorted(top.rglob("*")):
            if any(part in skip for part in path.relative_to(root).parts):
                continue
            digest.update(str(path.relative_to(root)).encode())
            if path.is_file():
                digest.update(path.read_bytes())
    return digest.hexdigest()


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # noqa: ARG001 - pytest hook signature
    if not RESULTS:
        return
    counts = Counter(RESULTS)
    terminalreporter.write_sep("-", f"adversarial cases: {len(RESULTS)}")
    for (kind, klass, outcome), n in sorted(counts.items()):
        terminalreporter.write_line(f"{kind:8} {klass:14} {outcome:9} {n}")
