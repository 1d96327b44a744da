"""Which origin a state-changing dashboard POST came from.

Why beside the CSRF tokens: cookies ignore ports, and ``SameSite=Strict`` counts every port of a
host as the same site, so a page on ``http://127.0.0.1:<other port>`` (another service, a dev
server) can plant a ``__Host-`` cookie of its choosing and post the matching form token (security
round three, second red team: login CSRF from another port). The browser's ``Origin`` header does
carry the port, and a page cannot forge it; so a POST must name exactly this service's origin, or,
from a browser that sends no ``Origin``, say ``Sec-Fetch-Site: same-origin``. (A
``Referrer-Policy: no-referrer`` on the pages would make browsers send ``Origin: null`` even on
same-origin POSTs, and sign-in would be refused: the pages set none.)
"""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.requests import Request

DEFAULT_PORTS = {"http": 80, "https": 443}


def origin_key(origin: str) -> tuple[str, str, int] | None:
    """``(scheme, host, port)`` of a serialized origin (default port made explicit), or None when
    it is no http(s) origin: ``null``, a path, a query, user info or a port that is no number."""
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname or parts.path not in ("", "/") or parts.query or parts.fragment or "@" in parts.netloc:
        return None
    return scheme, parts.hostname.lower(), port if port is not None else DEFAULT_PORTS[scheme]


def same_origin(request: Request, public_origin: str | None) -> bool:
    """Whether the request comes from a page of this service: ``public_origin`` when the operator
    set one (behind a proxy the request's own scheme and Host are the proxy's), else the scheme and
    ``Host`` the request arrived with."""
    sent = request.headers.get("origin")
    if sent is None:
        return request.headers.get("sec-fetch-site") == "same-origin"
    own = public_origin or f"{request.url.scheme}://{request.headers.get('host', '')}"
    key = origin_key(sent)
    return key is not None and key == origin_key(own)
