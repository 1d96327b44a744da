"""Synthesized stacks kept between runs, per cluster, so a one-cluster edit re-synthesizes only that cluster.

What a cluster's stacks depend on (``stacks.fleet.build_fleet``): its infra stack and its
scheduler stack are built from that cluster's ``ClusterConfig`` alone; the scheduler stack reads
the infra stack's outputs (a cross-stack reference inside the cluster, so both are one unit) and
nothing of another cluster. The only stack built from several clusters is ``tfc-workspaces``
(every cluster's config), which is its own unit keyed on all of them. ``manifest.json`` is not
cached as a file: it is rebuilt from each stack's cached entry the way parallel synthesis
rebuilds it (``stacks.parallel.manifest_json``), so the tree is byte-for-byte a cold synthesis's.

A unit's key is a SHA-256 over everything its stacks are a function of:

- the cluster's validated config, serialised with every model's class and every field's value
  (``canonical``): the cluster file as it was parsed and validated, so what the file references
  or derives (defaults, shared tables) is in it, and a comment or reformatting is not;
- the recorded imports of each of its stacks (``stacks/imported/<stack>.json``, or their absence);
- gpufleet's code: the bytes of every file of the packages synthesis imports or reads
  (``CODE_PACKAGES``: Python modules and their data, e.g. ``clusters/gpudirect_manifests``,
  ``clusters/gcp_zones.json``), but not the user's files among them (cluster files, recorded
  imports, Vault policies); ``tests/stacks/test_synth_cache.py`` records every file a synthesis
  opens and checks each is one of these;
- gpufleet's version and the versions of cdktf, constructs, jsii and its requirements, ruamel.yaml
  and every prebuilt provider binding installed, Python's version and the Node binary jsii starts;
- today's date (``clusters.clock``: a GKE maintenance exclusion renews by the quarter) and the
  environment cdktf reads while synthesizing (``CDKTF_*`` but the output directory,
  ``SYNTH_HCL_OUTPUT``, ``TERRAFORM_BINARY_NAME``).

An entry is one JSON file holding the stacks' files, their manifest entries and a SHA-256 of
each file; an entry that does not parse, names another key or fails a digest is a miss, never an
error. The cache lives outside the repository (``$GPUFLEET_SYNTH_CACHE``, else
``$XDG_CACHE_HOME/gpufleet/synth``, else ``~/.cache/gpufleet/synth``), is safe to delete at any
time, and ``GPUFLEET_SYNTH_CACHE=off`` turns it off. Its stacks skip the template check, so a cache
another user could write is not used, and no link inside it is followed (``clusters.cache_trust``).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import sys
from collections.abc import Iterable
from datetime import date, datetime
from pathlib import Path

from pydantic import BaseModel

from clusters import cache_trust, clock
from clusters.schema import ClusterConfig
from stacks.layout import StackInfo

CACHE_ENV = "GPUFLEET_SYNTH_CACHE"
CACHE_VERSION = 1
CODE_ROOT = Path(__file__).resolve().parent.parent
# The packages a synthesis imports or reads files of (checked by tests/stacks/test_synth_cache.py).
CODE_PACKAGES = ("clusters", "constructs_lib", "stacks", "vault_policies")
CODE_FILES = ("main.py",)
# Distributions whose code writes the stacks: cdktf's JavaScript, the provider bindings, the jsii runtime
# and what it requires (attrs/cattrs serialize every value sent to the kernel), and ruamel.yaml, which
# parses the vendored GPUDirect manifests the admission policies embed (clusters/gpudirect_upstream.py).
BINDINGS = ("cdktf", "constructs", "jsii", "ruamel.yaml")
# Environment cdktf's JavaScript reads while synthesizing (lib/ of cdktf 0.21.0), bar the output directory.
CDKTF_ENV_PREFIX = "CDKTF_"
CDKTF_ENV = ("SYNTH_HCL_OUTPUT", "TERRAFORM_BINARY_NAME")
CDKTF_ENV_IGNORED = ("CDKTF_OUTDIR",)


def cache_dir() -> Path | None:
    """Where entries are kept; None when turned off."""
    return cache_trust.configured_dir(CACHE_ENV, "synth")


def _user_file(relative: Path) -> bool:
    """Files inside the code packages that are the user's input, not gpufleet's code."""
    top = relative.parts[0]
    if top == "clusters" and len(relative.parts) == 2 and relative.suffix in (".yaml", ".yml"):
        return True  # the example/user cluster files; their content is keyed as each cluster's config
    if relative.parts[:2] == ("stacks", "imported"):
        return True  # keyed per stack
    return top == "vault_policies" and relative.suffix != ".py"  # policies and roles: synthesis reads none


def code_files(root: Path = CODE_ROOT) -> tuple[Path, ...]:
    """gpufleet's files that a synthesis may run or read, relative to ``root``, sorted."""
    found: list[Path] = [Path(name) for name in CODE_FILES if (root / name).is_file()]
    for package in CODE_PACKAGES:
        for path in (root / package).rglob("*"):
            relative = path.relative_to(root)
            if path.is_file() and "__pycache__" not in relative.parts and not path.name.endswith((".pyc", ".pyo")) \
                    and not _user_file(relative):
                found.append(relative)
    return tuple(sorted(found))


def _normal(name: str) -> str:
    """A distribution's name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _versions() -> list[str]:
    names = {dist.metadata["Name"] for dist in importlib.metadata.distributions() if dist.metadata["Name"]}
    runtime = {_normal(re.split(r"[\s<>=!~;\[(]", req, maxsplit=1)[0]) for req in importlib.metadata.requires("jsii") or ()}
    bindings = {_normal(n) for n in BINDINGS} | runtime | {"gpufleet"}
    wanted = sorted(n for n in names if _normal(n).startswith("cdktf-cdktf-provider-") or _normal(n) in bindings)
    return [f"{name}=={importlib.metadata.version(name)}" for name in wanted]


def _node() -> str:
    """The Node binary jsii starts (``JSII_NODE``, else ``node`` on PATH): its path, size and mtime
    stand for its version without starting it."""
    binary = os.environ.get("JSII_NODE") or shutil.which("node") or "node"
    try:
        real = Path(binary).resolve()
        stat = real.stat()
        return f"{real}:{stat.st_size}:{stat.st_mtime_ns}"
    except OSError:
        return binary


@functools.cache
def code_digest() -> str:
    """gpufleet's code, its version and the bindings' versions; computed once per process."""
    digest = hashlib.sha256()
    for relative in code_files():
        data = (CODE_ROOT / relative).read_bytes()
        for part in (str(relative).encode(), data):
            digest.update(len(part).to_bytes(8, "big") + part)
    for part in (*_versions(), sys.version, _node()):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()


def canonical(value: object) -> object:
    """A JSON-able picture of a config that names every model's and enum's class, so two values
    that would build different constructs never serialise alike."""
    if isinstance(value, BaseModel):
        return {"__model__": f"{type(value).__module__}.{type(value).__qualname__}",
                **{name: canonical(getattr(value, name)) for name in type(value).model_fields}}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"__dataclass__": f"{type(value).__module__}.{type(value).__qualname__}",
                **{f.name: canonical(getattr(value, f.name)) for f in dataclasses.fields(value)}}
    if isinstance(value, enum.Enum):
        return {"__enum__": f"{type(value).__module__}.{type(value).__qualname__}", "value": canonical(value.value)}
    if isinstance(value, dict):
        return {"__dict__": sorted(([canonical(k), canonical(v)] for k, v in value.items()), key=json.dumps)}
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return {"__set__": sorted((canonical(v) for v in value), key=json.dumps)}
    if isinstance(value, (date, datetime)):
        return {"__date__": value.isoformat()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return {"__repr__": f"{type(value).__module__}.{type(value).__qualname__}", "value": repr(value)}


def _environment() -> list[str]:
    names = sorted(n for n in os.environ if (n.startswith(CDKTF_ENV_PREFIX) or n in CDKTF_ENV) and n not in CDKTF_ENV_IGNORED)
    return [f"{n}={os.environ[n]}" for n in names]


def unit_key(configs: Iterable[ClusterConfig], stacks: tuple[StackInfo, ...], imported_dir: Path) -> str:
    """The key of one unit: ``configs`` are what its stacks are built from (one cluster's, or every
    cluster's for ``tfc-workspaces``), ``stacks`` its stacks in build order."""
    digest = hashlib.sha256()
    parts: list[bytes] = [str(CACHE_VERSION).encode(), code_digest().encode(), clock.today().isoformat().encode(),
                          "\n".join(_environment()).encode()]
    parts += [json.dumps(canonical(c), sort_keys=True, separators=(",", ":")).encode() for c in configs]
    for stack in stacks:
        imports = imported_dir / f"{stack.name}.json"
        parts += [json.dumps(dataclasses.asdict(stack), sort_keys=True).encode(),
                  imports.read_bytes() if imports.is_file() else b"\0absent"]
    for part in parts:
        digest.update(len(part).to_bytes(8, "big") + part)
    return digest.hexdigest()


def _path(directory: Path, key: str) -> Path | None:
    """The entry's file, or None when a step to it is a link or another user's (``clusters.cache_trust``)."""
    return cache_trust.entry(directory, key[:2], f"{key}.json")


def load(directory: Path, key: str, stacks: tuple[str, ...]) -> dict | None:
    """``{"top": <manifest without stacks>, "stacks": {name: {"manifest": entry, "files": {relative path: text}}}}``
    for exactly ``stacks``, or None: absent, unreadable, another key's or a file whose digest does not match
    (a corrupted entry is a miss, never an error)."""
    try:
        path = _path(directory, key)
        if path is None:
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
        if data["key"] != key or sorted(data["stacks"]) != sorted(stacks) or not isinstance(data["top"], dict):
            return None
        for entry in data["stacks"].values():
            if not isinstance(entry["manifest"], dict) or not entry["files"]:
                return None
            for relative, text in entry["files"].items():
                parts = Path(relative).parts
                if Path(relative).is_absolute() or ".." in parts or not parts:
                    return None
                if hashlib.sha256(text.encode("utf-8")).hexdigest() != entry["sha256"][relative]:
                    return None
        return data
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def read_unit(tree: Path, manifest: dict, stacks: tuple[str, ...]) -> dict:
    """A freshly synthesized unit out of ``tree`` (a synthesis output directory) and its ``manifest``."""
    entries = {}
    for name in stacks:
        stack_dir = tree / "stacks" / name
        # bytes decoded, not read_text: no newline translation between what cdktf wrote and what is kept
        files = {str(p.relative_to(stack_dir)): p.read_bytes().decode("utf-8") for p in sorted(stack_dir.rglob("*")) if p.is_file()}
        entries[name] = {"manifest": manifest["stacks"][name], "files": files,
                         "sha256": {k: hashlib.sha256(v.encode("utf-8")).hexdigest() for k, v in files.items()}}
    return {"top": {k: v for k, v in manifest.items() if k != "stacks"}, "stacks": entries}


def store(directory: Path, key: str, unit: dict) -> None:
    """Write one entry atomically; a read-only or full cache only costs speed."""
    target = _path(directory, key)
    if target is not None:
        cache_trust.write(target, json.dumps({"key": key, **unit}))


def write_unit(unit: dict, tree: Path) -> None:
    """Put a cached unit's stack directories into ``tree/stacks``."""
    for name, entry in unit["stacks"].items():
        for relative, text in entry["files"].items():
            path = tree / "stacks" / name / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(text.encode("utf-8"))
