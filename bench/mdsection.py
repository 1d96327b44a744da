"""Replace one generated section of BENCHMARKS.md between its own markers, leaving the rest as it is.

Several benchmarks write into the same file, and people edit the prose around them; a bench that
rewrote the whole file erased everyone else's figures. Each bench owns the text between
``<!-- BEGIN <name> -->`` and ``<!-- END <name> -->``; a file without those markers gets the section
appended at its end.
"""

from __future__ import annotations

from pathlib import Path


def markers(name: str) -> tuple[str, str]:
    return f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"


def replace_section(path: Path, name: str, body: str) -> Path:
    """Write ``body`` as the section ``name`` of ``path`` (created with a title if missing)."""
    begin, end = markers(name)
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmarks\n"
    block = f"{begin}\n{body.strip()}\n{end}"
    start = text.find(begin)
    stop = text.find(end, start + len(begin)) if start >= 0 else -1
    if start >= 0 and stop < 0:
        raise ValueError(f"{path}: {begin} has no {end}; restore the marker (git diff {path.name}) and rerun")
    if start >= 0:
        text = text[:start] + block + text[stop + len(end):]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text, encoding="utf-8")
    return path
