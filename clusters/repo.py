"""Which gpufleet repository a command acts on: the one it is run in, never the one it was installed from.

A repository is a directory holding ``cdktf.json`` and ``clusters/``. ``gpufleet --repo PATH``
picks one explicitly; otherwise the current directory and its parents are searched. The
package's own location is never used to find user files: a second checkout (a git worktree)
using the first one's virtualenv must read its own cluster, job and Vault files.
"""

from __future__ import annotations

from pathlib import Path

from clusters.errors import UserError

MARKER_FILE = "cdktf.json"
MARKER_DIR = "clusters"

_explicit: Path | None = None


def is_repo(path: Path) -> bool:
    return (path / MARKER_FILE).is_file() and (path / MARKER_DIR).is_dir()


def discover(start: Path | None = None) -> Path | None:
    """The nearest directory at or above ``start`` (default: the current directory) that is a repository."""
    here = Path(start or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        if is_repo(candidate):
            return candidate
    return None


def use(path: Path | None) -> None:
    """Pin the repository for this process (``--repo``); ``None`` returns to discovery from the current directory."""
    global _explicit
    if path is None:
        _explicit = None
        return
    resolved = Path(path).expanduser().resolve()
    if not resolved.is_dir():
        what = "is a file, not a directory" if resolved.exists() else "directory not found"
        raise UserError(f"--repo {path}: {what}; pass the checkout that holds cdktf.json and clusters/")
    if not is_repo(resolved):
        raise UserError(f"--repo {path}: not a gpufleet repository (no {MARKER_FILE} and {MARKER_DIR}/ in it); pass the checkout root")
    _explicit = resolved


def root_or_none() -> Path | None:
    return _explicit or discover()


def root() -> Path:
    """The repository this command acts on; a one-line UserError when there is none."""
    found = root_or_none()
    if found is None:
        raise UserError(
            f"{Path.cwd()} is not inside a gpufleet repository (no directory above it holds {MARKER_FILE} and {MARKER_DIR}/);"
            " cd into your checkout or pass --repo PATH"
        )
    return found


def clusters_dir() -> Path:
    return root() / "clusters"


def jobs_dir() -> Path:
    return root() / "jobs"


def jobs_out_dir() -> Path:
    return root() / "jobs" / "out"


def vault_dir() -> Path:
    return root() / "vault_policies"
