"""Find secret values in synthesized JSON, rendered jobs and state; report where, never what.

Every key of the fleet comes from Vault or the environment at run time, so a secret value in
``cdktf.out``, ``jobs/out`` or Terraform state is always a leak. What counts as a secret is
decided by ``clusters.secrets`` (the one detector, shared with job checks and dispatch
meta); this module walks files: every string value and every map key, with the nearest key as
context, and in Terraform state every attribute terraform itself marks sensitive
(``sensitive_values`` in ``terraform show -json``, ``sensitive_attributes`` in a state file)
that holds a value. A finding carries the file, the JSON path and the kind; the value is
replaced by its format and length so the report itself cannot leak it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusters.errors import UserError
from clusters.secrets import detect, is_reference, is_sensitive_field, is_service_account_key, mask

__all__ = ["DEFAULT_TARGETS", "Finding", "check_string", "is_reference", "is_sensitive_field", "require_state_files", "scan_file", "scan_paths",
           "scan_targets", "scan_text", "walk"]

# Where generated files land, relative to the repository: what `gpufleet scan` reads by default.
DEFAULT_TARGETS = (Path("cdktf.out"), Path("jobs/out"))


@dataclass(frozen=True)
class Finding:
    file: str
    path: str
    kind: str
    masked: str

    def __str__(self) -> str:
        return f"{self.file}: {self.path}: {self.kind} ({self.masked})"


def check_string(value: str, field: str) -> tuple[str, str] | None:
    """(kind, masked) for a secret value, else None; ``field`` is the nearest enclosing key."""
    hit = detect(value, field)
    return (hit.kind, hit.masked) if hit else None


def _segment(key: str) -> str:
    return f".{key}" if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", key) else f"[{json.dumps(key)}]"


def _holds_value(value: Any) -> bool:
    return value not in (None, "", [], {}) and not isinstance(value, bool)


def _marked(values: Any, marks: Any, path: str) -> Iterator[tuple[str, str, str]]:
    """Attributes ``terraform show -json`` marks sensitive (``sensitive_values``: the same shape, leaves true)."""
    if marks is True:
        if _holds_value(values):
            yield path, "terraform-sensitive", mask("", json.dumps(values) if not isinstance(values, str) else values)
    elif isinstance(marks, dict) and isinstance(values, dict):
        for key in sorted(marks):
            yield from _marked(values.get(key), marks[key], path + _segment(str(key)))
    elif isinstance(marks, list) and isinstance(values, list):
        for index, (value, mark) in enumerate(zip(values, marks, strict=False)):
            yield from _marked(value, mark, f"{path}[{index}]")


def _state_attribute(attributes: Any, steps: list[dict[str, Any]], path: str) -> tuple[Any, str]:
    """Follow a ``sensitive_attributes`` path in a state file; dynamic values sit under {"value", "type"}."""
    node = attributes
    for step in steps:
        key = step.get("value")
        if isinstance(node, dict) and key not in node and set(node) == {"value", "type"}:
            node, path = node["value"], path + ".value"
        if isinstance(node, dict) and isinstance(key, str) and key in node:
            node, path = node[key], path + _segment(key)
        elif isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node):
            node, path = node[key], f"{path}[{key}]"
        else:
            return None, path
    return node, path


def walk(node: Any, path: str = "$", field: str = "") -> Iterator[tuple[str, str, str]]:
    """(json path, kind, masked) for every secret under ``node``: values, map keys, marked state attributes."""
    if isinstance(node, dict):
        if is_service_account_key(node):
            yield path, "gcp-service-account-key", "service account key JSON object"
            return
        if isinstance(node.get("sensitive_values"), dict) and isinstance(node.get("values"), dict):
            yield from _marked(node["values"], node["sensitive_values"], path + ".values")
        if isinstance(node.get("sensitive_attributes"), list) and isinstance(node.get("attributes"), dict):
            for steps in node["sensitive_attributes"]:
                value, at = _state_attribute(node["attributes"], steps if isinstance(steps, list) else [], path + ".attributes")
                if _holds_value(value):
                    yield at, "terraform-sensitive", mask("", json.dumps(value) if not isinstance(value, str) else value)
        for key in sorted(node, key=str):
            if key == "//":  # cdktf's own metadata block
                continue
            key_hit = detect(str(key))
            segment = f"[<{key_hit.kind}>]" if key_hit else _segment(str(key))  # a path must not print the key it reports
            if key_hit:
                yield f"{path}{segment} (a key)", key_hit.kind, key_hit.masked
            yield from walk(node[key], path + segment, str(key))
    elif isinstance(node, list):
        previous = field
        for index, item in enumerate(node):
            yield from walk(item, f"{path}[{index}]", previous)
            # An argv list: '--wandb-key', '<value>' puts the name in the item before the value.
            previous = item if isinstance(item, str) and item.startswith("-") else field
    elif isinstance(node, str):
        hit = detect(node, field)
        if hit:
            yield path, hit.kind, hit.masked


def _dedupe(hits: Iterable[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """A marked state attribute that is also a known format is reported once, as the format."""
    found: dict[str, tuple[str, str, str]] = {}
    for hit in hits:
        if hit[0] not in found or found[hit[0]][1] == "terraform-sensitive":
            found[hit[0]] = hit
    return sorted(found.values())


def scan_text(text: str, file: str) -> list[Finding]:
    """For files that are not JSON: every detector, located by line."""
    findings = []
    for number, line in enumerate(text.splitlines(), start=1):
        hit = detect(line)
        if hit:
            findings.append(Finding(file, f"line {number}", hit.kind, hit.masked))
    return findings


def scan_file(path: Path) -> list[Finding]:
    return _scan(Path(path).read_bytes(), path)


def _scan(data: bytes, path: Path) -> list[Finding]:
    text = data.decode("utf-8", errors="replace")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return scan_text(text, str(path))
    return [Finding(str(path), *hit) for hit in _dedupe(walk(data))]


def _files(paths: Iterable[Path]) -> Iterator[Path]:
    for path in paths:
        path = Path(path)
        if path.is_dir():
            yield from sorted(p for p in path.rglob("*.json") if p.is_file() and ".terraform" not in p.parts)
        elif path.is_file():
            yield path


def scan_paths(paths: Iterable[Path], cache: Path | None = None) -> list[Finding]:
    """Scan files and directories (every ``*.json`` below, skipping ``.terraform``); missing paths are skipped.

    Missing paths are not an error because ``check`` passes the default locations
    (``cdktf.out``, ``jobs/out``) whether or not they were generated yet. ``cache``
    (``safety.scan_cache``, what ``check`` passes) skips files whose exact bytes this detector
    found clean before and remembers the clean ones; a file with a finding is always scanned.
    """
    from clusters import cache_trust
    from safety import scan_cache

    cache = cache_trust.prepare(cache, scan_cache.CACHE_ENV) if cache is not None else None
    findings: list[Finding] = []
    for file in _files(paths):
        data = file.read_bytes()
        digest = scan_cache.key(data) if cache is not None else ""
        if cache is not None and scan_cache.is_clean(cache, digest):
            continue
        found = _scan(data, file)
        if cache is not None and not found:
            scan_cache.mark_clean(cache, digest)
        findings += found
    return findings


def require_state_files(files: Iterable[Path]) -> None:
    """A ``--state`` file that is not there is a mistake, not an empty scan (``scan`` and ``check``)."""
    for file in files:
        if not Path(file).is_file():
            raise UserError(f"--state {file}: file not found; write it with `terraform show -json > {file}`")


def scan_targets(paths: Sequence[Path], state: Sequence[Path], base: Path | None = None) -> list[Path]:
    """What ``gpufleet scan`` reads: the given paths (each must exist), else the default locations
    that exist under ``base`` (the repository, or the working directory outside one), plus the state
    files. Nothing at all to scan is refused: a clean report of no files would read as a pass."""
    require_state_files(state)
    for path in paths:
        if not Path(path).exists():
            raise UserError(f"{path}: not found; pass an existing file or directory (e.g. cdktf.out after `gpufleet synth`)")
    if base is None:
        from clusters import repo

        base = repo.root_or_none() or Path.cwd()
    targets = list(paths) if paths else [base / p for p in DEFAULT_TARGETS if (base / p).exists()]
    if not targets and not state:
        raise UserError("nothing to scan: neither cdktf.out nor jobs/out exists; run `gpufleet synth` and `gpufleet jobs render` first, or pass paths")
    return [*targets, *state]
