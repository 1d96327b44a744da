"""The one secret detector: reviewed-file loaders, job checks, dispatch meta and the scanner all ask it.

It lives in ``clusters`` (the bottom layer, pure functions, standard library only) so the loaders,
``jobs`` and ``safety.secret_scan`` can all import it without reversing dependencies.

Every key of the fleet comes from Vault at run time, so a secret value in a reviewed file, a
dispatch parameter, synthesized JSON or Terraform state is always a leak. Evidence, strongest first:

- formats that identify themselves anywhere in a string (unanchored): private key blocks (PEM,
  OpenSSH, PGP), service-account key JSON, GitHub/GitLab/npm/Hugging Face/OpenAI/Stripe/Slack/
  Google (``AIza``, ``ya29.``)/Vault (``hvs.``/``hvb.``) tokens, AWS access key ids, JWTs, Slack
  webhooks and passwords in URL userinfo (``https://user:<password>@host``);
- a value in a key-ish context: a sensitive field name (``api_token``, ``--wandb-key``,
  ``WANDB_API_KEY=``, ``Bearer``) followed by a token-shaped value (legacy ``s.`` Vault tokens,
  UUIDs, 40-hex W&B keys, 40-character AWS secret keys, high-entropy strings);
- base64 that decodes to text holding any of the above (decoded and rescanned, twice at most).

A hit carries the kind and a mask (prefix and length), never the value, so no message can leak it.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

_EDGE = r"(?<![A-Za-z0-9_-])"
_END = r"(?![A-Za-z0-9_-])"
PRIVATE_KEY = re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----")
SELF_IDENTIFYING: tuple[tuple[str, str, re.Pattern[str]], ...] = (
    ("github-token", "ghp_", re.compile(_EDGE + r"gh[pousr]_[A-Za-z0-9]{30,}" + _END)),
    ("github-token", "github_pat_", re.compile(_EDGE + r"github_pat_[A-Za-z0-9_]{30,}" + _END)),
    ("gitlab-token", "glpat-", re.compile(_EDGE + r"glpat-[A-Za-z0-9_-]{20,}" + _END)),
    ("npm-token", "npm_", re.compile(_EDGE + r"npm_[A-Za-z0-9]{36}" + _END)),
    ("huggingface-token", "hf_", re.compile(_EDGE + r"hf_[A-Za-z0-9]{20,}" + _END)),
    ("openai-key", "sk-", re.compile(_EDGE + r"sk-(?:proj-|svcacct-|ant-)?[A-Za-z0-9_-]{20,}" + _END)),
    ("stripe-key", "sk_live_", re.compile(_EDGE + r"[rs]k_live_[A-Za-z0-9]{16,}" + _END)),
    ("slack-token", "xox", re.compile(_EDGE + r"xox[abposr]-[A-Za-z0-9-]{10,}" + _END)),
    ("slack-webhook", "https://hooks.slack.com/", re.compile(r"hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9_/-]{20,}")),
    ("aws-access-key-id", "AKIA", re.compile(r"(?<![A-Z0-9])(?:AKIA|ASIA)[0-9A-Z]{16}(?![A-Z0-9])")),
    ("google-api-key", "AIza", re.compile(_EDGE + r"AIza[0-9A-Za-z_-]{35}" + _END)),
    ("google-oauth-token", "ya29.", re.compile(_EDGE + r"ya29\.[0-9A-Za-z_-]{20,}")),
    ("vault-token", "hvs.", re.compile(_EDGE + r"hv[sbr]\.[A-Za-z0-9_-]{20,}" + _END)),
    ("jwt", "eyJ", re.compile(_EDGE + r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{10,}" + _END)),
)
# Quantifiers are bounded so a megabyte of base64 in state cannot make a pattern quadratic.
URL_PASSWORD = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]{1,20}://[^/\s:@]{0,256}:(?P<value>[^/\s@]{1,256})@")
# A name then '=' or ':' then a value, as in '--wandb-key=...', 'WANDB_API_KEY=...', 'password: ...'.
# The match starts at the keyword (a literal the engine can search for); the name's left part is
# found by _name_before, so no pattern begins with an unbounded character class.
KEYISH = re.compile(r"(?i:key|token|secret|passw(?:or)?d|pwd|credential)(?P<rest>[A-Za-z0-9_.-]{0,40})\s{0,4}[=:]\s{0,4}[\"']?(?P<value>[^\s\"',;&]{1,512})")
_NAME_CHAR = re.compile(r"[A-Za-z0-9_.-]")
BEARER = re.compile(r"(?i)\b(?:bearer|token|basic)\s+(?P<value>[A-Za-z0-9._~+/=-]{16,})")
BASE64_RUN = re.compile(r"[A-Za-z0-9+/_-]{24,}={0,2}")
PLACEHOLDER = re.compile(r"^(\$\{[^}]*\}|\$[A-Za-z_][A-Za-z0-9_]*|\{\{.*\}\}|<[^>]*>|\*+|x+|X+|\.\.\.)$")

VAULT_LEGACY = re.compile(r"^[sbr]\.[A-Za-z0-9]{24}$")
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", re.IGNORECASE)
HEX40 = re.compile(r"^[0-9a-f]{40}$")
AWS_SECRET = re.compile(r"^[A-Za-z0-9/+]{40}$")
TOKEN40 = re.compile(r"^[A-Za-z0-9_-]{40}$")
SENSITIVE_WORDS = ("password", "passwd", "secret", "token", "apikey", "privatekey", "credential", "accesskey", "clientkey", "wrapping", "wandb", "bearer")
"""Field names (lowercased, ``_``/``-``/``.`` removed) containing one of these, or ending in ``key``, hold secrets..."""
BENIGN_SUFFIXES = ("ttl", "ttls", "name", "names", "path", "paths", "file", "env", "length", "version", "uses", "type", "enabled", "mount", "role",
                   "policy", "policies", "endpoint", "url", "format", "keyid", "ids", "field", "project", "entity", "mode", "host", "dir", "id")
"""...unless they end in one of these: ``token_ttl``, ``secret_name``, ``api_key_env``, ``wandb_project`` name a secret, they are not one."""
MIN_ENTROPY_BITS = 3.5
MIN_ENTROPY_BITS_HEX = 3.0
"""Hex has 16 symbols (at most 4 bits a character): a random 32-digit hex key scores 3.5-3.9, so it gets its own bar."""
_HEX = re.compile(r"^[0-9a-fA-F]+$")
MIN_LENGTH = 16
_PARTS = re.compile(r"[-_=#/:,.@]+")
_WORD_OR_NUMBER = re.compile(r"^(?:[A-Za-z]+|[0-9]+)$")
MAX_DEPTH = 2


@dataclass(frozen=True)
class Hit:
    kind: str
    masked: str


def mask(prefix: str, value: str) -> str:
    return f"{prefix}… {len(value)} chars"


def entropy_bits(value: str) -> float:
    """Shannon entropy per character: random tokens score ~4-6, words and names ~2.5-3.5."""
    counts = Counter(value)
    return -sum(n / len(value) * math.log2(n / len(value)) for n in counts.values())


def is_reference(value: str) -> bool:
    """Names and references, not values: ``prod-hf-api-token``, ``OPENAI_API_KEY=ml-api-keys/openai#api_key``.

    Two or more parts, each only letters or only digits; a generated token mixes letters and
    digits inside its parts (and a UUID, e.g. a Nomad ACL secret, does too), so it stays suspect.
    """
    parts = [p for p in _PARTS.split(value) if p]
    return len(parts) >= 2 and all(_WORD_OR_NUMBER.match(p) for p in parts)


def is_sensitive_field(name: str) -> bool:
    normalized = re.sub(r"[-_.\s]", "", name.lower())
    if not normalized or normalized.endswith(BENIGN_SUFFIXES):
        return False
    return any(word in normalized for word in SENSITIVE_WORDS) or normalized.endswith("key")


def looks_random(value: str) -> bool:
    if len(value) < MIN_LENGTH or any(c.isspace() for c in value) or "${" in value or "{{" in value:
        return False
    if is_reference(value):
        return False
    return entropy_bits(value) >= (MIN_ENTROPY_BITS_HEX if _HEX.match(value) else MIN_ENTROPY_BITS)


def is_service_account_key(value: Any) -> bool:
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


def _valued(value: str, field: str) -> Hit | None:
    """A whole value next to a sensitive name: token shapes that only mean "secret" in that context."""
    value = value.strip().strip("\"'")
    if not value or PLACEHOLDER.match(value) or not is_sensitive_field(field):
        return None
    if VAULT_LEGACY.match(value):
        return Hit("vault-token", mask(value.split(".", 1)[0] + ".", value))
    if UUID.match(value):
        return Hit("uuid-token", mask("", value))
    if HEX40.match(value):
        return Hit("hex40-key", mask("", value))
    if AWS_SECRET.match(value) and re.search(r"[/+]", value) and looks_random(value):
        return Hit("aws-secret-access-key", mask("", value))
    if TOKEN40.match(value) and looks_random(value):
        return Hit("api-token", mask("", value))
    if looks_random(value):
        return Hit("high-entropy-secret", mask("", value))
    return None


def _name_before(text: str, end: int) -> str:
    start = end
    while start > 0 and end - start < 40 and _NAME_CHAR.match(text[start - 1]):
        start -= 1
    return text[start:end]


def _decoded_text(run: str) -> str | None:
    padded = run + "=" * (-len(run) % 4)
    for decode in (base64.b64decode, base64.urlsafe_b64decode):
        try:
            text = decode(padded).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            continue
        if text and sum(ch.isprintable() or ch.isspace() for ch in text) >= 0.95 * len(text):
            return text
    return None


def detect(value: str, field: str = "", *, depth: int = 0) -> Hit | None:
    """A Hit if ``value`` holds a secret anywhere; ``field`` is the nearest name (JSON key, env name, previous arg)."""
    if not isinstance(value, str) or not value:
        return None
    match = PRIVATE_KEY.search(value)
    if match:
        return Hit("private-key", mask(match.group(0), value))
    if "service_account" in value or len(value) >= 100:
        if is_service_account_key(_decoded_json(value)):
            return Hit("gcp-service-account-key", mask("service account key JSON", value))
    for kind, prefix, pattern in SELF_IDENTIFYING:
        if pattern.search(value):
            return Hit(kind, mask(prefix, value))
    for match in URL_PASSWORD.finditer(value):
        if not PLACEHOLDER.match(match.group("value")):
            return Hit("url-password", mask("://user:", value))
    hit = _valued(value, field)
    if hit:
        return hit
    for match in KEYISH.finditer(value):
        hit = _valued(match.group("value"), _name_before(value, match.start()) + value[match.start():match.end("rest")])
        if hit:
            return hit
    for match in BEARER.finditer(value):
        hit = _valued(match.group("value"), "bearer")
        if hit:
            return hit
    if depth < MAX_DEPTH:
        for run in BASE64_RUN.findall(value):
            text = _decoded_text(run)
            inner = detect(text, field, depth=depth + 1) if text else None
            if inner:
                return Hit(f"base64-{inner.kind}", mask("base64 of " + inner.masked.split("…")[0], run))
    return None
