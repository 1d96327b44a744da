"""Find secret values in synthesized JSON, rendered jobs and state; report where, never what.

Every key of the fleet comes from Vault or the environment at run time, so a secret value in
``cdktf.out``, ``jobs/out`` or Terraform state is always a leak. Three kinds of evidence:
formats that identify themselves anywhere (PEM private keys, service-account key JSON, and
tokens with a long, distinctive shape: GitHub, Slack, AWS access key ids, OpenAI, Hugging Face);
formats that only mean "secret" inside a sensitive-named field (Vault/OpenBao tokens: ``s.`` is
too common a prefix; Cloudflare API tokens have no prefix at all); and high-entropy strings in
sensitive-named fields. A finding carries the file, the JSON path and the kind; the value is
replaced by its format and length so the report itself cannot leak it.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PEM = re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----")
_EDGE = r"(?<![A-Za-z0-9_-])"
_END = r"(?![A-Za-z0-9_-])"
ANYWHERE: tuple[tuple[str, str, re.Pattern[str]], ...] = (
    ("github-token", "ghp_", re.compile(_EDGE + r"gh[pousr]_[A-Za-z0-9]{36}" + _END)),
    ("github-token", "github_pat_", re.compile(_EDGE + r"github_pat_[A-Za-z0-9_]{70,}" + _END)),
    ("slack-token", "xox", re.compile(_EDGE + r"xox[abposr]-[A-Za-z0-9-]{10,}" + _END)),
    ("aws-access-key-id", "AKIA", re.compile(r"(?<![A-Z0-9])(?:AKIA|ASIA)[0-9A-Z]{16}(?![A-Z0-9])")),
    ("openai-key", "sk-", re.compile(_EDGE + r"sk-(?:proj-|svcacct-)?[A-Za-z0-9_-]{32,}" + _END)),
    ("huggingface-token", "hf_", re.compile(_EDGE + r"hf_[A-Za-z0-9]{34,}" + _END)),
)
VAULT_TOKEN = re.compile(r"^(?:hv[sbr]\.[A-Za-z0-9_-]{20,}|[sbr]\.[A-Za-z0-9]{24})$")
CLOUDFLARE_TOKEN = re.compile(r"^[A-Za-z0-9_-]{40}$")
# Nomad ACL secret ids, Consul tokens and AppRole secret_ids are UUIDs: in a sensitive field the
# shape alone is evidence (a random UUID's entropy can dip below the generic bar).
UUID_TOKEN = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", re.IGNORECASE)

SENSITIVE_WORDS = ("password", "passwd", "secret", "token", "apikey", "privatekey", "credential", "accesskey", "clientkey", "wrapping")
"""Field names (lowercased, ``_``/``-`` removed) containing one of these hold secrets..."""
BENIGN_SUFFIXES = ("ttl", "ttls", "name", "names", "path", "paths", "file", "env", "length", "version", "uses", "type", "enabled", "mount", "role", "policy", "policies", "endpoint", "url", "format", "keyid", "ids", "field")
"""...unless they end in one of these: ``token_ttl``, ``secret_name``, ``api_key_env`` name a secret, they are not one."""
MIN_ENTROPY_BITS = 3.5
MIN_ENTROPY_BITS_HEX = 3.0
"""Hex has 16 symbols (at most 4 bits a character): a random 32-digit hex key scores 3.5-3.9, so it gets its own bar."""
_HEX = re.compile(r"^[0-9a-fA-F]+$")
MIN_LENGTH = 16
_PARTS = re.compile(r"[-_=#/:,.@]+")
_WORD_OR_NUMBER = re.compile(r"^(?:[A-Za-z]+|[0-9]+)$")


def is_reference(value: str) -> bool:
    """Names and references, not values: ``prod-hf-api-token``, ``OPENAI_API_KEY=ml-api-keys/openai#api_key``.

    Two or more parts, each only letters or only digits; a generated token mixes letters and
    digits inside its parts (and a UUID, e.g. a Nomad ACL secret, does too), so it stays suspect.
    """
    parts = [p for p in _PARTS.split(value) if p]
    return len(parts) >= 2 and all(_WORD_OR_NUMBER.match(p) for p in parts)


@dataclass(frozen=True)
class Finding:
    file: str
    path: str
    kind: str
    masked: str

    def __str__(self) -> str:
        return f"{self.file}: {self.path}: {self.kind} ({self.masked})"


def _mask(prefix: str, value: str) -> str:
    return f"{prefix}… {len(value)} chars"


def entropy_bits(value: str) -> float:
    """Shannon entropy per character: random tokens score ~4-6, words and names ~2.5-3.5."""
    counts = Counter(value)
    return -sum(n / len(value) * math.log2(n / len(value)) for n in counts.values())


def is_sensitive_field(name: str) -> bool:
    normalized = name.lower().replace("_", "").replace("-", "")
    return any(word in normalized for word in SENSITIVE_WORDS) and not normalized.endswith(BENIGN_SUFFIXES)


def _looks_random(value: str) -> bool:
    if len(value) < MIN_LENGTH or any(c.isspace() for c in value) or "${" in value or "{{" in value:
        return False
    if is_reference(value):
        return False
    return entropy_bits(value) >= (MIN_ENTROPY_BITS_HEX if _HEX.match(value) else MIN_ENTROPY_BITS)


def _service_account_key(value: Any) -> bool:
    return isinstance(value, dict) and value.get("type") == "service_account" and "private_key" in value


def _decoded_json(value: str) -> Any:
    """A string that is JSON, or base64 of JSON (google_service_account_key.private_key is the latter)."""
    text = value.strip()
    if not text.startswith("{") and len(text) >= 100 and re.fullmatch(r"[A-Za-z0-9+/=\s]+", text):
        try:
            text = base64.b64decode(text, validate=False).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
    if not text.startswith("{"):
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def check_string(value: str, field: str) -> tuple[str, str] | None:
    """(kind, masked) for a secret value, else None; ``field`` is the nearest enclosing key."""
    match = PEM.search(value)
    if match:
        return "private-key", _mask(match.group(0), value)
    if "service_account" in value or len(value) >= 100:
        if _service_account_key(_decoded_json(value)):
            return "gcp-service-account-key", _mask("service account key JSON", value)
    for kind, prefix, pattern in ANYWHERE:
        if pattern.search(value):
            return kind, _mask(prefix, value)
    if not is_sensitive_field(field):
        return None
    if VAULT_TOKEN.match(value):
        return "vault-token", _mask(value.split(".", 1)[0] + ".", value)
    if UUID_TOKEN.match(value):
        return "uuid-token", _mask("", value)
    if CLOUDFLARE_TOKEN.match(value) and _looks_random(value):
        return "api-token", _mask("", value)
    if _looks_random(value):
        return "high-entropy-secret", _mask("", value)
    return None


def _segment(key: str) -> str:
    return f".{key}" if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", key) else f"[{json.dumps(key)}]"


def walk(node: Any, path: str = "$", field: str = "") -> Iterator[tuple[str, str, str]]:
    """(json path, kind, masked) for every secret under ``node``."""
    if isinstance(node, dict):
        if _service_account_key(node):
            yield path, "gcp-service-account-key", "service account key JSON object"
            return
        for key in sorted(node):
            if key == "//":
                continue
            yield from walk(node[key], path + _segment(str(key)), str(key))
    elif isinstance(node, list):
        for index, item in enumerate(node):
            yield from walk(item, f"{path}[{index}]", field)
    elif isinstance(node, str):
        hit = check_string(node, field)
        if hit:
            yield (path, *hit)


def scan_text(text: str, file: str) -> list[Finding]:
    """For files that are not JSON: self-identifying formats only, located by line."""
    findings = []
    for number, line in enumerate(text.splitlines(), start=1):
        hit = check_string(line, "")
        if hit:
            findings.append(Finding(file, f"line {number}", *hit))
    return findings


def scan_file(path: Path) -> list[Finding]:
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return scan_text(text, str(path))
    return [Finding(str(path), *hit) for hit in walk(data)]


def _files(paths: Iterable[Path]) -> Iterator[Path]:
    for path in paths:
        path = Path(path)
        if path.is_dir():
            yield from sorted(p for p in path.rglob("*.json") if p.is_file() and ".terraform" not in p.parts)
        elif path.is_file():
            yield path


def scan_paths(paths: Iterable[Path]) -> list[Finding]:
    """Scan files and directories (every ``*.json`` below, skipping ``.terraform``); missing paths are skipped.

    Missing paths are not an error because ``check`` passes the default locations
    (``cdktf.out``, ``jobs/out``) whether or not they were generated yet.
    """
    return [finding for file in _files(paths) for finding in scan_file(file)]
