"""Per-stack checkov results kept between runs, so a one-cluster edit re-scans only its stacks.

The key is a SHA-256 over everything a stack's result depends on: the stack's name and the
bytes of its ``cdk.tf.json``, checkov's version (with asteval's, PyYAML's and libyaml's), the skipped check ids (``.checkov-skips.yaml``),
checkov's own settings (its environment variables and ``.checkov.yaml`` files, ``_checkov_settings``)
and the source of the code that runs checkov and turns its report into a result (``checkov_scan.py``,
``checkov_worker.py``, and
``checkov_exempt.py`` whose per-resource exemptions are derived from the stack). Any change to
one of them is a different key, so a changed input is never served an old result; results with
a checkov error are not stored. The cache lives outside the repository
(``$GPUFLEET_CHECKOV_CACHE``, else ``$XDG_CACHE_HOME/gpufleet/checkov``, else
``~/.cache/gpufleet/checkov``), holds one small JSON file per key, and is safe to delete at any
time; a result is checkov's verdict, so a cache another user could write is not used and no link
inside it is followed (``clusters.cache_trust``). ``GPUFLEET_CHECKOV_CACHE=off`` turns it off.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

from clusters import cache_trust
from safety import checkov_exempt
from safety.checkov_scan import Failure, StackResult

CACHE_ENV = "GPUFLEET_CHECKOV_CACHE"
CACHE_VERSION = 1
_RULES = (Path(__file__).with_name("checkov_scan.py"), Path(__file__).with_name("checkov_worker.py"), Path(checkov_exempt.__file__))


def cache_dir() -> Path | None:
    """Where results are kept; None when turned off."""
    return cache_trust.configured_dir(CACHE_ENV, "checkov")


# Libraries whose version can change a result without checkov's changing: the worker renders expressions
# with asteval and parses plain ASCII JSON with PyYAML's libyaml loader (docs/checkov-workers.md).
RESULT_LIBRARIES = ("asteval", "PyYAML")


def checkov_version(binary: str) -> str:
    """The installed checkov's version: from package metadata when it is this interpreter's (with the versions of
    ``RESULT_LIBRARIES`` and libyaml, which the worker uses in the same interpreter), else ``--version``."""
    if Path(binary).parent == Path(sys.executable).parent:
        try:
            return ";".join([importlib.metadata.version("checkov"), *_library_versions()])
        except importlib.metadata.PackageNotFoundError:
            pass
    done = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    return f"{binary}:{done.stdout.strip() or done.returncode}"


# What else checkov reads its options from (checkov 3.3.30): variables named by the ``env_var=`` of its
# arguments (checkov/common/util/ext_argument_parser.py: CKV_SKIP_CHECK, CKV_CHECK, BC_API_KEY, ...)
# and checkov/common/util/env_vars_config.py (CHECKOV_*, CKV_*, BC_*, and the graph switches below),
# and .checkov.yaml/.checkov.yml in the working and the home directory (config_utils.py
# get_default_config_paths; checkov_scan runs it with neither --directory nor --config-file).
CHECKOV_ENV_PREFIXES = ("CKV_", "BC_", "CHECKOV_", "PRISMA_")
CHECKOV_ENV = ("CREATE_COMPLEX_VERTICES", "CREATE_EDGES", "RAW_TF_IN_GRAPH", "MAX_WILDCARD_ARR_SIZE", "ENABLE_DEFINITION_KEY",
               "RENDER_EDGES_DUPLICATE_ITER_COUNT", "RENDER_EDGES_DUPLICATE_PERCENT", "RENDER_VARIABLES_ASYNC",
               "DOWNLOAD_EXTERNAL_MODULES", "EXTERNAL_MODULES_DIR", "HCL_PARSE_TIMEOUT_SEC", "ENABLE_CONFIG_FILE_VALIDATION")
CHECKOV_CONFIG_FILES = (".checkov.yaml", ".checkov.yml")


def _library_versions() -> list[str]:
    versions = []
    for name in RESULT_LIBRARIES:
        try:
            versions.append(f"{name}={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{name}=absent")
    try:
        from yaml import _yaml  # libyaml's binding; absent when PyYAML was built without it

        versions.append(f"libyaml={_yaml.get_version_string()}")
    except ImportError:
        versions.append("libyaml=absent")
    return versions


def _checkov_settings() -> bytes:
    """checkov's environment and default config files (their bytes, or that there are none) as one digest."""
    digest = hashlib.sha256()
    for name in sorted(n for n in os.environ if n.startswith(CHECKOV_ENV_PREFIXES) or n in CHECKOV_ENV):
        digest.update(f"{name}={os.environ[name]}".encode() + b"\0")
    for directory in (Path.cwd(), Path.home()):
        for name in CHECKOV_CONFIG_FILES:
            path = directory / name
            digest.update(hashlib.sha256(path.read_bytes()).digest() if path.is_file() else b"absent")  # content, not where
    return digest.digest()


def shared() -> tuple[bytes, bytes]:
    """The parts of a key every stack of one scan shares: the rules' source and checkov's settings (``key``).
    Read once per scan, not once per stack (three files and checkov's config files at every stack)."""
    return b"".join(hashlib.sha256(p.read_bytes()).digest() for p in _RULES), _checkov_settings()


def key(stack_dir: Path, version: str, skip_ids: tuple[str, ...], common: tuple[bytes, bytes] | None = None) -> str:
    """The key of the stack in ``stack_dir``; ``common``: ``shared()``, read once for a whole scan."""
    return key_of(stack_dir.name, (stack_dir / "cdk.tf.json").read_bytes(), version, skip_ids, common)


def key_of(stack: str, data: bytes, version: str, skip_ids: tuple[str, ...], common: tuple[bytes, bytes] | None = None) -> str:
    """``key`` of a stack named ``stack`` whose ``cdk.tf.json`` holds ``data``, wherever that file is."""
    rules, settings = common or shared()
    digest = hashlib.sha256()
    for part in (str(CACHE_VERSION).encode(), stack.encode(), version.encode(),
                 "\n".join(sorted(skip_ids)).encode(), rules, settings, data):
        digest.update(len(part).to_bytes(8, "big") + part)
    return digest.hexdigest()


def _failure(stack: str, row: list) -> Failure:
    return Failure(stack, row[0], row[1], row[2], row[3])


def load(directory: Path, digest: str, stack: str) -> StackResult | None:
    """The stored result, or None (absent, unreadable or not this stack's: a miss, never an error)."""
    try:
        path = cache_trust.entry(directory, digest[:2], f"{digest}.json")  # no link, nothing another user wrote
        if path is None:
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
        if data["key"] != digest or data["stack"] != stack:
            return None
        return StackResult(stack, int(data["passed"]), tuple(_failure(stack, r) for r in data["failures"]),
                           exempted=tuple(_failure(stack, r) for r in data["exempted"]))
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None


def store(directory: Path, digest: str, result: StackResult) -> None:
    """Write one result atomically; errors are never stored and a read-only cache only costs speed."""
    if result.error is not None:
        return
    rows = lambda failures: [[f.check_id, f.check_name, f.resource, f.line] for f in failures]  # noqa: E731
    payload = json.dumps({"key": digest, "stack": result.stack, "passed": result.passed,
                          "failures": rows(result.failures), "exempted": rows(result.exempted)})
    target = cache_trust.entry(directory, digest[:2], f"{digest}.json")
    if target is not None:
        cache_trust.write(target, payload)
