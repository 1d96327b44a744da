"""Files the secret scan found clean, remembered between runs, so ``gpufleet check`` after a
one-cluster edit walks only the stacks that changed instead of every stack of the fleet.

Only "no finding" is remembered: a file with a finding is scanned again every time, so a cached
answer can never hide or alter a report. The key is a SHA-256 of the file's bytes and of the
detector's code (``clusters/secrets.py``, the one detector, and ``safety/secret_scan.py``, which
walks the JSON) and Python's version (its ``re``, ``json`` and ``base64`` run it): a changed file or a
changed detector is another key. An entry is an empty file
named by its key. The cache lives outside the repository (``$GPUFLEET_SECRET_SCAN_CACHE``, else
``$XDG_CACHE_HOME/gpufleet/secret-scan``, else ``~/.cache/gpufleet/secret-scan``), is safe to
delete at any time, and ``GPUFLEET_SECRET_SCAN_CACHE=off`` turns it off. A mark hides a file from
the scan, so a cache another user could write is not used, and no link inside it is followed
(``clusters.cache_trust``).
"""

from __future__ import annotations

import functools
import hashlib
import sys
from pathlib import Path

from clusters import cache_trust

CACHE_ENV = "GPUFLEET_SECRET_SCAN_CACHE"
CACHE_VERSION = 1
DETECTOR_FILES = (Path(__file__).resolve().parent.parent / "clusters" / "secrets.py", Path(__file__).resolve().with_name("secret_scan.py"))


def cache_dir() -> Path | None:
    """Where clean files are remembered; None when turned off."""
    return cache_trust.configured_dir(CACHE_ENV, "secret-scan")


@functools.cache
def detector_digest() -> bytes:
    digest = hashlib.sha256(f"{CACHE_VERSION}\0{sys.version}".encode())
    for path in DETECTOR_FILES:
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.digest()


def key(data: bytes) -> str:
    return hashlib.sha256(detector_digest() + hashlib.sha256(data).digest()).hexdigest()


def _path(directory: Path, digest: str) -> Path | None:
    """The mark's file, or None when a step to it is a link or another user's (``clusters.cache_trust``)."""
    return cache_trust.entry(directory, digest[:2], digest)


def is_clean(directory: Path, digest: str) -> bool:
    path = _path(directory, digest)
    return path is not None and path.is_file()


def mark_clean(directory: Path, digest: str) -> None:
    """Remember one clean file; a read-only or full cache only costs speed."""
    target = _path(directory, digest)
    if target is None:
        return
    try:
        target.parent.mkdir(mode=0o700, exist_ok=True)
        target.touch(mode=0o600)  # never writable by others, whatever the umask: cache_trust would refuse it
    except OSError:
        pass
