"""The ``--oidc-config`` file of ``gpufleet serve``: issuer, audience, JWKS URL, claim and the
claim value -> tenant map, read and checked before the service starts.

Kept apart from ``experiments.auth`` (which verifies tokens with these settings) so reading
the file does not depend on how tokens are checked.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from clusters.errors import UserError
from experiments.auth import OidcSettings

REQUIRED = ("issuer", "audience", "jwks_url", "claim", "tenants")


def trusted_jwks_url(url: str) -> bool:
    """https anywhere, plain http only to this machine's loopback (a local test issuer). The host
    is parsed, not prefix-matched: ``http://127.0.0.1@attacker.example/`` is attacker.example."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
        parts.port  # noqa: B018  (raises on a malformed port)
    except ValueError:
        return False
    if not host or parts.username is not None or parts.password is not None:
        return False
    return parts.scheme == "https" or (parts.scheme == "http" and host in ("127.0.0.1", "::1", "localhost"))


def load_oidc_settings(path: Path | None) -> OidcSettings | None:
    """The settings in ``path``, or None without one; a bad file is one UserError line."""
    if path is None:
        return None
    from ruamel.yaml import YAML

    if not path.is_file():
        raise UserError(f"--oidc-config {path} is not a file; write issuer, audience, jwks_url, claim and tenants (claim value: tenant) in YAML")
    data = YAML(typ="safe").load(path.read_text()) or {}
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise UserError(f"{path}: missing {', '.join(missing)}; required: issuer, audience, jwks_url, claim, tenants (claim value -> tenant), optional admin_values")
    if not trusted_jwks_url(str(data["jwks_url"])):
        raise UserError(f"{path}: jwks_url {data['jwks_url']!r} must be https:// (keys fetched over plain http could be swapped); use the issuer's https JWKS URL")
    return OidcSettings(issuer=str(data["issuer"]), audience=str(data["audience"]), jwks_url=str(data["jwks_url"]), claim=str(data["claim"]),
                        tenants=tuple(sorted((str(k), str(v)) for k, v in dict(data["tenants"]).items())),
                        admin_values=tuple(sorted(str(v) for v in data.get("admin_values") or ())))
