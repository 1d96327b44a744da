"""The one place gpufleet decides whether it may write, replace or delete a path.

Every command that writes goes through here: ``synth``/``check`` (``--out``), ``jobs render
--out-dir``, ``plan``/``gate --summary-out``, ``ci comment --out``, ``import generate|apply``.

Rules:

- An output *directory* is replaced only if gpufleet made it: it holds the marker file
  ``.gpufleet-output`` (written when gpufleet creates the directory), or it is absent or holds no
  file at all (only empty directories).
  A non-empty directory without the marker is someone else's and is refused.
- Never, marker or not: the repository root or any parent of it, the reviewed source
  directories (``clusters/``, ``jobs/`` except ``jobs/out``, ``vault_policies/``, ``stacks/``,
  ``.git/``) or anything inside them, the home directory or a parent of it.
- An output *file* is overwritten only if it is in a gpufleet-made directory or its writer
  recognises it as its own (``owned``); it is written to a temp file beside it and renamed, so a
  reader sees the old file or the new one, never half of one.

Every refusal is a one-line UserError (exit 2) that names the path, why, and what to do instead.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from clusters import repo as repo_mod
from clusters import termination
from clusters.errors import UserError

MARKER = ".gpufleet-output"
MARKER_TEXT = "gpufleet made this directory and may replace or delete it; do not keep your own files here.\n"
SOURCE_DIRS = ("clusters", "jobs", "vault_policies", "stacks", ".git")
OUTPUT_INSIDE_SOURCE = (("jobs", "out"),)
FIX = "pass a new or empty directory (e.g. --out cdktf.out) or remove it yourself"


def _resolve(path: Path) -> Path:
    return Path(path).expanduser().resolve()


def _forbidden(resolved: Path, repo: Path | None) -> str | None:
    """Why ``resolved`` may never be written as gpufleet output, or None."""
    home = Path.home().resolve()
    if resolved == Path(resolved.anchor) or resolved == home or home.is_relative_to(resolved):
        return "is the filesystem root, your home directory or a parent of it"
    if repo is None:
        return None
    if resolved == repo or repo.is_relative_to(resolved):
        return f"is the repository root {repo} or a parent of it"
    if any(resolved.is_relative_to(repo.joinpath(*allowed)) for allowed in OUTPUT_INSIDE_SOURCE):
        return None
    for name in SOURCE_DIRS:
        if resolved.is_relative_to(repo / name):
            return f"is {'' if resolved == repo / name else 'inside '}{name}/, which holds the repository's reviewed files"
    return None


def is_gpufleet_dir(path: Path) -> bool:
    return (Path(path) / MARKER).is_file()


def claim_dir(path: Path, *, option: str = "--out") -> Path:
    """Resolved ``path`` if gpufleet may (re)place it; else a UserError naming the path, the reason and the fix."""
    resolved = _resolve(path)
    reason = _forbidden(resolved, repo_mod.root_or_none())
    if reason:
        raise UserError(f"{option} {path}: refused: it {reason}; gpufleet only replaces directories it made; {FIX}")
    if resolved.exists() and not resolved.is_dir():
        raise UserError(f"{option} {path}: is a file, not a directory; pass a directory path")
    if resolved.is_dir() and not is_gpufleet_dir(resolved) and _holds_data(resolved):
        raise UserError(f"{option} {path}: refused: the directory holds files gpufleet did not write (no {MARKER} marker); {FIX}")
    return resolved


def _holds_data(directory: Path) -> bool:
    """Any file or symlink below ``directory``: a tree of empty directories holds nothing to lose."""
    return any(not p.is_dir() or p.is_symlink() for p in directory.rglob("*"))


def mark(directory: Path) -> None:
    marker = Path(directory) / MARKER
    if not marker.is_file():
        marker.write_text(MARKER_TEXT, encoding="utf-8")


def ensure_dir(path: Path, *, option: str = "--out") -> Path:
    """Create (or reuse) a gpufleet output directory and mark it; returns the resolved path."""
    resolved = claim_dir(path, option=option)
    resolved.mkdir(parents=True, exist_ok=True)
    mark(resolved)
    return resolved


def staging_dir(target: Path) -> Path:
    """A marked temp directory beside ``target`` (same filesystem, so the swap is one rename)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.new.", dir=target.parent))
    mark(tmp)
    return tmp


def replace_dir(new: Path, target: Path, *, option: str = "--out") -> None:
    """Swap the fully written ``new`` into ``target``; the previous ``target`` is deleted only if gpufleet made it."""
    target = claim_dir(target, option=option)
    mark(new)
    if not target.exists():
        os.replace(new, target)
        return
    # Held (clusters.termination): a SIGTERM between the renames would leave no ``target``, and the
    # caller's ``finally`` then deletes ``new``; the swap completes and the signal acts after it.
    with termination.held():
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=target.parent))
        os.replace(target, old)  # onto the empty temp dir: POSIX rename replaces an empty directory
        os.replace(new, target)
        shutil.rmtree(old, ignore_errors=True)


def refuse_symlinks(directory: Path, *relative: str, option: str = "--out") -> None:
    """Refuse when a path gpufleet is about to replace inside its own ``directory`` is a symlink:
    a marked directory may hold links (a checkout can commit one), and replacing through a link
    would delete wherever it points."""
    for rel in relative:
        for depth in range(1, len(Path(rel).parts) + 1):
            path = Path(directory).joinpath(*Path(rel).parts[:depth])
            if path.is_symlink():
                raise UserError(f"{option} {directory}: refused: {path} is a symlink (to {os.readlink(path)}); gpufleet replaces only directories it made, never through a link; remove the link")


def require_gpufleet_dir(path: Path, *, option: str) -> Path:
    """A directory gpufleet wrote (``synth``), before a command writes inside it (plan files, .terraform)."""
    resolved = _resolve(path)
    if not resolved.is_dir():
        raise UserError(f"{option} {path}: directory not found; run `gpufleet synth` first")
    if not is_gpufleet_dir(resolved):
        raise UserError(f"{option} {path}: not a directory gpufleet wrote (no {MARKER} marker); run `gpufleet synth --out {path}` into a new directory")
    return resolved


def write_file(path: Path, data: str | bytes, *, option: str, owned: Callable[[Path], bool] | None = None,
               source_ok: bool = False) -> Path:
    """Write ``path`` atomically (temp file + rename); refuses paths gpufleet must not overwrite.

    ``owned`` recognises a previous output of the same writer (e.g. a plan summary); a file in a
    gpufleet-made directory is always ours. ``source_ok`` lets the reviewed records gpufleet keeps
    in the repository (``stacks/imported``) be written inside a source directory.
    """
    resolved = _resolve(path)
    if resolved.is_dir():
        raise UserError(f"{option} {path}: is a directory; pass a file path")
    reason = None if source_ok else _forbidden(resolved, repo_mod.root_or_none())
    if reason:
        raise UserError(f"{option} {path}: refused: it {reason}; write it outside the repository's source directories")
    if resolved.exists() and not (is_gpufleet_dir(resolved.parent) or (owned is not None and _safe(owned, resolved))):
        raise UserError(f"{option} {path}: refused: the file exists and gpufleet did not write it; pass a new path or remove it yourself")
    if resolved.parent.exists() and not resolved.parent.is_dir():
        raise UserError(f"{option} {path}: {resolved.parent} is a file, not a directory; pass a path in a directory")
    resolved.parent.mkdir(parents=True, exist_ok=True)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{resolved.name}.", suffix=".tmp", dir=resolved.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
        os.replace(tmp, resolved)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return resolved


def _safe(owned: Callable[[Path], bool], path: Path) -> bool:
    try:
        return bool(owned(path))
    except (OSError, ValueError, UnicodeDecodeError):
        return False


def json_with_keys(*keys: str) -> Callable[[Path], bool]:
    """``owned`` for JSON outputs: a JSON object holding all of ``keys`` is one gpufleet wrote."""
    import json

    def check(path: Path) -> bool:
        data = json.loads(path.read_text(encoding="utf-8"))
        return isinstance(data, dict) and all(k in data for k in keys)

    return check


def starts_with(prefix: str) -> Callable[[Path], bool]:
    def check(path: Path) -> bool:
        return path.read_text(encoding="utf-8").startswith(prefix)

    return check
