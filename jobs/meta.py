"""Dispatch-time parameters (``--meta key=value``), checked before anything reaches Nomad.

Nomad only checks that required keys are present; a dataset URI without a version would
train on whatever the bucket holds that day, so runs would not be reproducible. Known keys
get a format; every value is refused if it looks like a credential, because dispatch meta
is stored in the child job and shown by ``nomad job status``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from clusters.errors import UserError
from clusters.source import did_you_mean
from clusters.secrets import detect
from jobs.spec import FinetuneSpec

DATASET_SCHEMES = ("gs://", "s3://", "hf://")
# A version is either a suffix '@v3' / '@<git sha>' or a path segment 'v3' / 'version=3'.
_VERSION_SUFFIX = re.compile(r"@(v\d+(\.\d+)*|[0-9a-f]{7,40})$")
_VERSION_SEGMENT = re.compile(r"/(v\d+(\.\d+)*|version=[A-Za-z0-9._-]+)(/|$)")
_URI_BODY = re.compile(r"^[A-Za-z0-9._~/=@-]+$")
RUN_ID = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
MAX_VALUE_CHARS = 1024


def parse_pairs(pairs: Iterable[str]) -> dict[str, str]:
    """``key=value`` strings from the command line; a malformed or repeated key is one line."""
    meta: dict[str, str] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if detect(key) or (not eq and detect(pair)):
            raise UserError("--meta: a key looks like a credential (not shown); dispatch meta is visible in Nomad: rotate it, put it in Vault and list it in secrets.env")
        if not eq or not key:
            raise UserError(f"--meta {pair!r} is not key=value; write e.g. --meta dataset_uri=hf://datasets/acme/chat@v3")
        if key in meta:
            raise UserError(f"--meta {key} is given twice; give each key once")
        meta[key] = value
    return meta


def _dataset_uri(value: str) -> str | None:
    scheme = next((s for s in DATASET_SCHEMES if value.startswith(s)), None)
    if scheme is None:
        return f"dataset_uri {value!r} has no allowed scheme; allowed: {', '.join(DATASET_SCHEMES)}; e.g. hf://datasets/acme/chat@v3"
    body = value[len(scheme):]
    if not body or not _URI_BODY.match(body) or "//" in body:
        return f"dataset_uri {value!r} is not a plain bucket/path; use letters, digits and ._-~/=@, e.g. gs://acme-data/chat/v3/"
    if not (_VERSION_SUFFIX.search(value) or _VERSION_SEGMENT.search(body)):
        return f"dataset_uri {value!r} names no version, so the run is not reproducible; add '@v3' (or '@<commit>') or a version path like '/v3/'"
    return None


def _run_id(value: str) -> str | None:
    if not RUN_ID.match(value):
        return f"run_id {value!r} is not allowed; use 1-63 lowercase letters, digits, '.', '_' or '-', starting with a letter or digit, e.g. llama-chat-7"
    return None


FORMATS = {"dataset_uri": _dataset_uri, "run_id": _run_id}


def validate_meta(spec: FinetuneSpec, meta: dict[str, str]) -> dict[str, str]:
    """The user's dispatch meta, checked against the job's declaration; returns it sorted."""
    allowed = (*spec.meta_required, *spec.meta_optional)
    for key, value in meta.items():
        # Before any message that names a key or shows a value: neither may echo a credential.
        hit = detect(key) or detect(value, key)
        if hit:
            shown = "a key" if detect(key) else f"--meta {key}"
            raise UserError(f"{shown} looks like a credential (not shown); dispatch meta is visible in Nomad: rotate it, put the key"
                            f" in Vault and list it in secrets.env; detected: {hit.kind}, {hit.masked}")
    for key in meta:
        if key not in allowed:
            raise UserError(f"--meta {key} is not declared by job {spec.name}{did_you_mean(key, allowed)}; allowed: {', '.join(allowed) or '(none)'}; add it to meta_optional in {spec.source.name} or drop it")
    missing = [key for key in spec.meta_required if key not in meta]
    if missing:
        raise UserError(f"job {spec.name} needs --meta {', '.join(f'{k}=...' for k in missing)}; required: {', '.join(spec.meta_required)}")
    for key, value in meta.items():
        if not value or len(value) > MAX_VALUE_CHARS or any(ch.isspace() or not ch.isprintable() for ch in value):
            raise UserError(f"--meta {key} must be 1-{MAX_VALUE_CHARS} printable characters without spaces")
        problem = FORMATS.get(key, lambda _v: None)(value)
        if problem:
            raise UserError(problem)
    return dict(sorted(meta.items()))
