"""Whether a cache directory outside the repository may be trusted, and reading inside it without following links.

The synthesis cache's stacks skip the template-sequence check, the secret scan's clean marks skip
the scan and a checkov cache entry is checkov's verdict, so an entry is as good as the check it stands
for: anyone who can write one can put ``${file(...)}`` into a stack, hide a secret or turn a failed
check into a pass (an entry's digest is no signature; whoever writes the
entry writes the digest). So a cache is used only when no other user can write it or swap it: the
directory and what is inside it belong to this user and are writable by no group or other, every
directory above it belongs to this user or root and is writable by no one else unless sticky
(``/tmp``), and nothing inside it is a symlink (a link reads from outside the cache). The same
rule ``ssh`` applies to ``~/.ssh`` (StrictModes).
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from pathlib import Path

from clusters import termination

_WRITABLE_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH


def configured_dir(env: str, name: str) -> Path | None:
    """A cache's directory: ``$<env>`` if set (``off`` turns the cache off), else
    ``$XDG_CACHE_HOME/gpufleet/<name>`` (default ``~/.cache``): outside the repository, safe to delete."""
    configured = os.environ.get(env, "").strip()
    if configured.lower() == "off":
        return None
    if configured:
        return Path(configured).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpufleet" / name


def _own(info: os.stat_result) -> bool:
    return info.st_uid == os.getuid() and not info.st_mode & _WRITABLE_BY_OTHERS


def _problem(directory: Path) -> str | None:
    """Why ``directory`` (absolute, resolved) is not trusted, or None."""
    try:
        info = directory.stat()
    except OSError as error:
        return f"cannot be read ({error.strerror})"
    if not stat.S_ISDIR(info.st_mode) or not _own(info):
        return "is not a directory only you can write"
    for parent in directory.parents:
        above = parent.stat()
        if above.st_uid not in (os.getuid(), 0) or (above.st_mode & _WRITABLE_BY_OTHERS and not above.st_mode & stat.S_ISVTX):
            return f"lies in {parent}, which another user can write"
    return None


def prepare(directory: Path, env: str) -> Path | None:
    """``directory`` made if missing (mode 0700) and resolved, or None when another user could write it;
    then one line on stderr names the directory, why, and the fix (``env`` is the variable that moves it)."""
    path = Path(directory).expanduser().absolute()
    try:
        missing = [p for p in (path, *path.parents) if not p.exists()]
        for part in reversed(missing):
            part.mkdir(mode=0o700)
        path = path.resolve(strict=True)
    except OSError:
        return None  # a cache that cannot be made only costs speed
    problem = _problem(path)
    if problem is None:
        return path
    print(f"gpufleet: cache {path} {problem}; not used (its entries stand for checks): "
          f"chmod go-w it and chown it to yourself, or set {env} to a directory of your own, or {env}=off", file=sys.stderr)
    return None


def entry(directory: Path, *relative: str) -> Path | None:
    """``directory/relative...`` when each step below ``directory`` is not a symlink and, where it exists,
    belongs to this user and no one else can write it; None otherwise (treated as a miss)."""
    path = Path(directory)
    for part in relative:
        path = path / part
        try:
            info = path.lstat()
        except FileNotFoundError:
            return Path(directory).joinpath(*relative)  # nothing below a missing step
        except OSError:
            return None
        if stat.S_ISLNK(info.st_mode) or not _own(info):
            return None
    return path


def write(target: Path, text: str) -> None:
    """Write one entry atomically (a reader sees the old file or the whole new one), its folder 0700;
    a read-only or full cache only costs speed, so an OSError is dropped."""
    # Held (clusters.termination): a SIGTERM between mkstemp and the rename left a ``.partial.*`` file for good.
    with termination.held():
        try:
            target.parent.mkdir(mode=0o700, exist_ok=True)
            handle, partial = tempfile.mkstemp(prefix=".partial.", dir=target.parent)
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                out.write(text)
            os.replace(partial, target)
        except OSError:
            pass
