"""One HTTP GET of an issuer's JWK Set, bounded in time and size.

Why not urllib (as PyJWKClient fetches): its timeout is per socket operation, so an answer
dripped one byte at a time, each byte inside the timeout, held the one key thread for as long as
the drip lasted (second red team: minutes, no refresh, a rotated-in key 503 throughout). Here the
whole exchange (connect, headers, body) has one deadline on the monotonic clock: a watchdog shuts
the socket down when it passes, which wakes a read blocked in the middle of the headers too, and
the body is read in pieces, checked against the deadline and ``MAX_JWKS_BYTES`` after each.
Redirects are not followed (as PyJWKClient's ``_NoRedirectHandler``) and no HTTP proxy is used.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from typing import Any
from urllib.parse import urlsplit

MAX_JWKS_BYTES = 1 << 20  # a JWK Set of a few dozen keys is a few KiB


class FetchFailed(Exception):
    """The issuer gave no JWK Set in time: a failed attempt (the cached keys stay)."""


def _cut(connection: http.client.HTTPConnection) -> None:
    """shutdown, not close: it wakes a thread blocked reading the socket (close would not)."""
    if connection.sock is not None:
        try:
            socket.socket.shutdown(connection.sock, socket.SHUT_RDWR)  # the plain socket's, under TLS too
        except OSError:
            pass


def fetch_json(url: str, deadline_seconds: float, max_bytes: int = MAX_JWKS_BYTES) -> Any:
    """The JSON document at ``url``, or FetchFailed; never more than ``deadline_seconds``."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise FetchFailed(f"jwks_url {url!r} is not an http(s) URL")
    deadline = time.monotonic() + deadline_seconds
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = kind(parts.hostname, parts.port, timeout=deadline_seconds)
    watchdog: threading.Timer | None = None
    try:
        connection.connect()
        watchdog = threading.Timer(max(0.0, deadline - time.monotonic()), _cut, args=(connection,))
        watchdog.daemon = True
        watchdog.start()
        connection.request("GET", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""),
                           headers={"Accept": "application/json", "User-Agent": "gpufleet-jwks"})
        response = connection.getresponse()
        if response.status != 200:
            raise FetchFailed(f"HTTP {response.status} {response.reason}")
        body = bytearray()
        while chunk := response.read1(64 * 1024):
            body += chunk
            if len(body) > max_bytes:
                raise FetchFailed(f"the answer is larger than {max_bytes} bytes")
            if time.monotonic() >= deadline:
                break
        if time.monotonic() >= deadline or (response.length or 0) > 0:
            raise FetchFailed(f"no complete answer within {deadline_seconds:g}s")
    except (OSError, http.client.HTTPException) as exc:
        if time.monotonic() >= deadline:
            raise FetchFailed(f"no complete answer within {deadline_seconds:g}s") from exc
        raise FetchFailed(f"{type(exc).__name__}: {exc}") from exc
    finally:
        if watchdog is not None:
            watchdog.cancel()
        connection.close()
    try:
        return json.loads(bytes(body))
    except ValueError as exc:
        raise FetchFailed(f"the answer is not JSON ({exc})") from exc
