"""The ``--oidc-config`` file of ``gpufleet serve``: issuer, audience, JWKS URL, claim and the
claim value -> tenant map, read and checked before the service starts.

Kept apart from ``experiments.auth`` (which verifies tokens with these settings) so reading
the file does not depend on how tokens are checked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from urllib.parse import urlsplit

from clusters.errors import ConfigError, Problem, UserError
from clusters.source import YamlDocument, did_you_mean, read_yaml
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


def shown_path(path: Path) -> str:
    """``path`` as the operator should read it: relative to the current directory when under it
    (absolute paths in messages do not match what the docs show), else as given."""
    absolute = path.absolute()
    return str(absolute.relative_to(Path.cwd())) if absolute.is_relative_to(Path.cwd()) else str(path)


def _read(path: Path) -> YamlDocument:
    """The file as a mapping with line numbers; bad YAML (a tab, a stray colon) is one line, not a traceback."""
    if not path.is_file():
        raise UserError(f"--oidc-config {shown_path(path)} is not a file; write issuer, audience, jwks_url, claim and tenants (claim value: tenant) in YAML")
    try:
        return read_yaml(path)
    except ConfigError as exc:
        problem = exc.problems[0]
        raise UserError(str(Problem(shown_path(path), problem.line, problem.field, problem.message))) from None


def load_oidc_settings(path: Path | None, known_tenants: Callable[[], Iterable[str]] | None = None) -> OidcSettings | None:
    """The settings in ``path``, or None without one; a bad file is one UserError line. With
    ``known_tenants`` every tenant the claim map names must be one of them: a typo would start the
    service and then answer every holder of that claim value 403, with nothing in the log saying why."""
    if path is None:
        return None
    doc = _read(path)
    data, where = doc.data, shown_path(path)

    def fail(field: tuple[str, ...], message: str) -> UserError:
        return UserError(str(Problem(where, doc.line_of(field), ".".join(field), message)))

    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise UserError(f"{where}: missing {', '.join(missing)}; required: issuer, audience, jwks_url, claim, tenants (claim value -> tenant), optional admin_values")
    if not trusted_jwks_url(str(data["jwks_url"])):
        raise fail(("jwks_url",), f"{data['jwks_url']!r} must be https:// (keys fetched over plain http could be swapped); use the issuer's https JWKS URL")
    tenants = data["tenants"]
    if not isinstance(tenants, dict) or not all(isinstance(v, str) for v in tenants.values()):
        raise fail(("tenants",), f"must map each claim value to one tenant (got a {type(tenants).__name__}); write it as a mapping,"
                   " e.g. 'tenants: {acme-ml: finetune}' or one 'claim-value: tenant' line per entry")
    admin_values = data.get("admin_values") or []
    if not isinstance(admin_values, list):
        raise fail(("admin_values",), "must be a list of claim values; write e.g. 'admin_values: [acme-platform]'")
    if known_tenants is not None:
        known = sorted(set(known_tenants()))
        for value, tenant in sorted(tenants.items()):
            if tenant not in known:
                raise fail(("tenants", str(value)), f"{tenant!r} is not a tenant of any cluster file{did_you_mean(tenant, known)};"
                           f" allowed: {', '.join(known)}; map {value} to one of them, or add the tenant to a cluster file first")
    return OidcSettings(issuer=str(data["issuer"]), audience=str(data["audience"]), jwks_url=str(data["jwks_url"]), claim=str(data["claim"]),
                        tenants=tuple(sorted((str(k), str(v)) for k, v in tenants.items())),
                        admin_values=tuple(sorted(str(v) for v in admin_values)))
