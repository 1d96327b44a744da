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
import urllib.parse
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
    # Taken from public pattern sets (upstream body kept; our own edge lookarounds in front, and no
    # end anchor where upstream fixes a length, so a longer run is still refused). Sources, pinned:
    #   G = gitleaks/gitleaks config/gitleaks.toml @ b58d3f102cf3a2c84cb7f923d05c25c9b1aed84b
    #   T = trufflesecurity/trufflehog pkg/detectors/<name>/<name>.go @ 3ab759fef4bb5935d4fe9ac68b503d05346b8364
    #   N = praetorian-inc/noseyparker crates/noseyparker/data/default/builtin/rules/<file>.yml @ 2e6e7f36ce36619852532bbe698d8cb7a26d2da7
    ("nvidia-api-key", "nvapi-", re.compile(_EDGE + r"nvapi-[a-zA-Z0-9_-]{64}")),  # T nvapi/nvapi.go:28
    ("terraform-cloud-token", ".atlasv1.", re.compile(r"(?<![A-Za-z0-9])[A-Za-z0-9]{14}\.atlasv1\.[A-Za-z0-9_=-]{60,70}")),  # G :2329 hashicorp-tf-api-token; T terraformcloudpersonaltoken.go:24
    ("pypi-token", "pypi-AgEI", re.compile(r"pypi-AgEIcHlwaS5vcmc[\w-]{50,1000}")),  # G :2811 pypi-upload-token; T pypi/pypi.go:28
    ("dockerhub-token", "dckr_", re.compile(_EDGE + r"(?:dckr_pat_[a-zA-Z0-9_-]{27}|dckr_oat_[a-zA-Z0-9_-]{32})")),  # T dockerhub/v2/dockerhub.go:36
    ("databricks-token", "dapi", re.compile(_EDGE + r"dapi[a-f0-9]{32}(?:-\d)?(?![A-Za-z0-9_])")),  # G :384 databricks-api-token; T databrickstoken/databrickstoken.go:29
    ("google-oauth-client-secret", "GOCSPX-", re.compile(_EDGE + r"GOCSPX-[a-zA-Z0-9_-]{28}")),  # N google.yml:23 np.google.2 (neither G nor T has it)
    ("sendgrid-key", "SG.", re.compile(_EDGE + r"SG\.[\w-]{20,24}\.[\w-]{39,50}")),  # T sendgrid/sendgrid.go:29 (G :2857 is the same 66 characters)
    ("slack-app-token", "xapp-", re.compile(_EDGE + r"(?i:xapp-\d-[A-Z0-9]+-\d+-[a-z0-9]+)")),  # G :2966 slack-app-token
    ("groq-key", "gsk_", re.compile(_EDGE + r"gsk_[a-zA-Z0-9]{52}")),  # T groq/groq.go:25
    ("replicate-token", "r8_", re.compile(_EDGE + r"r8_[0-9A-Za-z_-]{37}")),  # T replicate/replicate.go:25
    ("age-secret-key", "AGE-SECRET-KEY-1", re.compile(r"AGE-SECRET-KEY-1[QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L]{58}")),  # G :108 age-secret-key (bech32 alphabet)
    # More, chosen for an ML/GPU fleet's neighbours:
    ("xai-key", "xai-", re.compile(_EDGE + r"xai-[0-9a-zA-Z_]{80}")),  # T xai/xai.go:28
    ("langsmith-key", "lsv2_", re.compile(_EDGE + r"lsv2_(?:pt|sk)_[a-f0-9]{32}_[a-f0-9]{10}")),  # T langsmith/langsmith.go:26
    ("perplexity-key", "pplx-", re.compile(_EDGE + r"pplx-[a-zA-Z0-9]{48}")),  # G :2720 perplexity-api-key
    ("pinecone-key", "pcsk_", re.compile(_EDGE + r"pcsk_[A-Za-z0-9]{5,6}_[A-Za-z0-9]{63}")),  # T pinecone/pinecone.go:35
    ("huggingface-org-token", "api_org_", re.compile(_EDGE + r"api_org_(?i:[a-z]{34})")),  # G :2373 huggingface-organization-api-token
    ("aws-bedrock-key", "ABSK", re.compile(_EDGE + r"ABSK[A-Za-z0-9+/]{109,269}={0,2}")),  # G :225 aws-amazon-bedrock-api-key-long-lived
    ("gitlab-token", "glrt-", re.compile(_EDGE + r"(?:(?:glrt-|gldt-|glsoat-|glft-)[0-9a-zA-Z_-]{20}|glptt-[0-9a-f]{40})")),  # G :2256 glrt, :2186 gldt, :2270 glsoat, :2200 glft, :2242 glptt
    ("pulumi-token", "pul-", re.compile(_EDGE + r"pul-[a-f0-9]{40}")),  # G :2804 pulumi-api-token
    ("digitalocean-token", "dop_v1_", re.compile(_EDGE + r"do[opr]_v1_[a-f0-9]{64}")),  # G :403 doo_v1, :410 dop_v1, :417 dor_v1
    ("grafana-token", "glsa_", re.compile(_EDGE + r"(?i:glsa_[A-Za-z0-9]{32}_[A-Fa-f0-9]{8})")),  # G :2313 grafana-service-account-token
    ("sentry-token", "sntryu_", re.compile(_EDGE + r"sntryu_[a-f0-9]{64}")),  # G :2885 sentry-user-token
    ("heroku-key", "HRKU-AA", re.compile(_EDGE + r"HRKU-AA[0-9a-zA-Z_-]{58}")),  # G :2353 heroku-api-key-v2
    ("1password-token", "ops_eyJ", re.compile(r"ops_eyJ[a-zA-Z0-9+/]{250,}={0,3}")),  # G :81 1password-service-account-token
)
# An AWS secret access key names nothing: 40 base64 characters (T aws/common.go:16 SecretPat, the same
# run noseyparker's np.aws.2 takes after an ``aws_secret_access_key`` name, N aws.yml:30). It counts
# when an AWS context is near (the field, or ``aws``/``amazon``/an access key id within 100 characters),
# or when it is a whole value shaped like no hash: hex (git, sha1) never qualifies, base64 of a sha256
# is 44 characters, and a whole value also needs both cases, a digit and no word-long letter run.
AWS_SECRET_RUN = re.compile(r"(?<![A-Za-z0-9+/])[A-Za-z0-9+/]{40}(?![A-Za-z0-9+/=])")
AWS_CONTEXT = re.compile(r"(?i:(?<![a-z])(?:aws|amazon))|(?:AKIA|ASIA|ABIA|ACCA)[A-Z2-7]{16}")
AWS_NEAR = 100
_LETTER_RUN = re.compile(r"[a-z]{9,}|[A-Z]{9,}")
PERCENT = re.compile(r"%[0-9A-Fa-f]{2}")
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


def _aws_shaped(run: str) -> bool:
    return (any(c.isupper() for c in run) and any(c.islower() for c in run) and any(c.isdigit() for c in run)
            and not _HEX.match(run) and entropy_bits(run) >= 4.0)


def _aws_secret(value: str, field: str) -> Hit | None:
    whole = value.strip().strip("\"'")
    for match in AWS_SECRET_RUN.finditer(value):
        run = match.group(0)
        if not _aws_shaped(run):
            continue
        near = value[max(0, match.start() - AWS_NEAR):match.end() + AWS_NEAR]
        if AWS_CONTEXT.search(field) or AWS_CONTEXT.search(near.replace(run, " ")):
            return Hit("aws-secret-access-key", mask("", run))
        if run == whole and entropy_bits(run) >= 4.2 and not _LETTER_RUN.search(run) and not is_reference(run):
            return Hit("aws-secret-access-key", mask("", run))
    return None


# Terminal colours and JSON/shell escapes glue a letter to the front of a token ("\x1b[1m" + "gsk_...",
# a JSON log line's literal "\n" + "nvapi-..."), which the edge lookbehind reads as part of a longer
# word. Such text is scanned once more with the sequences turned into the separators they stand for.
_ANSI = re.compile(r"\x1b(?:\[[0-9;?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
_ESCAPE = re.compile(r"\\(?:u[0-9a-fA-F]{4}|[nrtbf\"'/\\])")


def _unescaped(match: re.Match[str]) -> str:
    text = match.group(0)
    if text[1] == "u":
        char = chr(int(text[2:], 16))
        return char if char.isprintable() else " "
    return {"/": "/", '"': '"', "'": "'"}.get(text[1], " ")


def _separated(value: str) -> str:
    """``value`` with terminal control sequences and backslash escapes replaced by what they stand for."""
    if "\x1b" not in value and "\\" not in value:
        return value
    return _ESCAPE.sub(_unescaped, _ANSI.sub(" ", value))


def detect(value: str, field: str = "", *, depth: int = 0) -> Hit | None:
    """A Hit if ``value`` holds a secret anywhere; ``field`` is the nearest name (JSON key, env name, previous arg)."""
    if not isinstance(value, str) or not value:
        return None
    hit = _detect(value, field, depth)
    separated = _separated(value)
    if hit is None and separated != value:
        hit = _detect(separated, field, depth)
    return hit


def _detect(value: str, field: str, depth: int) -> Hit | None:
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
    hit = _valued(value, field) or _aws_secret(value, field)
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
        if PERCENT.search(value):  # percent-encoded (a URL query, a form body): decoded and rescanned
            inner = detect(urllib.parse.unquote(value), field, depth=depth + 1)
            if inner:
                return Hit(f"percent-encoded-{inner.kind}", mask("percent-encoding of " + inner.masked.split("…")[0], value))
        for run in BASE64_RUN.findall(value):
            text = _decoded_text(run)
            inner = detect(text, field, depth=depth + 1) if text else None
            if inner:
                return Hit(f"base64-{inner.kind}", mask("base64 of " + inner.masked.split("…")[0], run))
    return None
