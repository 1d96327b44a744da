"""The OIDC issuer's signing keys, fetched by one background thread and served from memory.

Why not ``jwt.PyJWKClient`` in the request: it fetches under its lock inside the request thread,
so while the identity provider is slow every OIDC request queues on that lock, and enough
unauthenticated garbage JWTs (any ``kid``) fill the whole request thread pool, so token callers
stalled too (security round three: a tenant's GET took 17.5 s instead of 23 ms). Here only the
``gpufleet-jwks`` thread touches the network (one GET bounded in time and size, jwks_fetch); a
request either finds its key in memory, or waits a bounded time for the thread, and at most
``max_waiters`` requests wait at once (the rest are answered 503 at once), so OIDC callers get a
bounded error and API-token callers, who never come here, keep their threads.

Why a parsed JWK Set with no usable key is a *successful* fetch: that is how an issuer withdraws
its keys (emergency rotation after a leak). PyJWKClient raises on it, and treating it as an outage
kept the withdrawn key valid forever. And why a maximum staleness: keys outlive an issuer outage,
but an issuer unreachable for longer than ``max_stale_seconds`` (default one hour) may well have
rotated meanwhile, so its old keys are dropped and OIDC callers get 503 until it answers again.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from experiments.jwks_fetch import fetch_json

log = logging.getLogger("gpufleet.jwks")


@dataclass(frozen=True)
class JwksTiming:
    refresh_seconds: float = 300.0  # keys are re-read this often while the issuer answers
    retry_seconds: float = 10.0  # ... and this often while it does not
    min_interval_seconds: float = 5.0  # an unknown kid forces a fetch at most this often
    fetch_timeout_seconds: float = 5.0  # the whole fetch (connect, headers, body), not each socket read
    wait_seconds: float = 3.0  # the most an OIDC request waits for a fetch
    max_stale_seconds: float = 3600.0  # cached keys are dropped this long after the last successful fetch
    max_waiters: int = 4  # requests waiting at once; more are answered 503 without waiting


class KeysUnavailable(Exception):
    """The issuer's keys could not be read in time: the caller should retry (503)."""


class UnknownKey(Exception):
    """The issuer's current keys have no key for this token (401)."""


def signing_keys(data: object) -> dict[str, Any]:
    """The signing keys of a JWK Set by ``kid``, as PyJWKClient picks them (``use`` sig or absent,
    a ``kid``; jwt/jwks_client.py ``_get_signing_keys_from_jwk_set``, PyJWT 2.15.1), except that no
    usable key is an empty answer, not an error. Raises ValueError when ``data`` is no JWK Set (RFC
    7517 section 5: an object whose ``keys`` member is an array)."""
    import jwt

    if not isinstance(data, dict) or not isinstance(data.get("keys"), list):
        raise ValueError("the answer is not a JWK Set (a JSON object with a keys array)")
    keys: dict[str, Any] = {}
    for item in data["keys"]:
        if not isinstance(item, dict):
            continue
        try:
            key = jwt.PyJWK(item)
        except jwt.PyJWTError:  # an unusable key (unknown kty, bad parameters) is skipped, as PyJWKSet does
            continue
        if key.public_key_use in ("sig", None) and isinstance(key.key_id, str) and key.key_id:
            keys[key.key_id] = key
    return keys


class JwksCache:
    def __init__(self, url: str, timing: JwksTiming | None = None) -> None:
        self.url = url
        self.timing = timing or JwksTiming()
        self._keys: dict[str, Any] = {}
        self._fetched_at: float | None = None  # monotonic time of the last successful fetch
        self._attempt_started: float | None = None
        self._generation = 0  # completed fetch attempts, success or not
        self._last_ok = False
        self._changed = threading.Condition()
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._waiters = threading.BoundedSemaphore(self.timing.max_waiters)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gpufleet-jwks", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Does not wait for a fetch in flight: the thread is a daemon and drops its result."""
        self._stopped.set()
        self._wake.set()

    def _run(self) -> None:
        while not self._stopped.is_set():
            self._fetch_once()
            self._wake.wait(self.timing.refresh_seconds if self._last_ok else self.timing.retry_seconds)
            self._wake.clear()
            since = time.monotonic() - (self._attempt_started or 0.0)
            self._stopped.wait(max(0.0, self.timing.min_interval_seconds - since))

    def _fetch_once(self) -> None:
        self._attempt_started = time.monotonic()
        try:
            keys = signing_keys(fetch_json(self.url, self.timing.fetch_timeout_seconds))
            ok = True
        except Exception as exc:  # noqa: BLE001 - any answer (not JSON, no keys, a reset) is a failed attempt; the thread must live on
            log.warning("OIDC JWKS fetch from %s failed: %s: %s", self.url, type(exc).__name__, exc)
            keys, ok = {}, False
        if ok and not keys:
            log.warning("OIDC JWKS from %s lists no signing key: every OIDC token is refused until it does", self.url)
        with self._changed:
            if ok:
                self._keys, self._fetched_at = keys, time.monotonic()
            self._last_ok = ok
            self._generation += 1
            self._changed.notify_all()

    def _drop_stale_keys(self) -> None:
        """Called with ``_changed`` held."""
        if self._keys and self._fetched_at is not None and time.monotonic() - self._fetched_at >= self.timing.max_stale_seconds:
            log.warning("OIDC keys from %s are older than %gs (no successful fetch since): dropped until the issuer answers",
                        self.url, self.timing.max_stale_seconds)
            self._keys = {}

    def key(self, kid: object) -> Any:
        """The key for ``kid``, from memory when it is there (cached keys outlive an issuer outage)."""
        if not isinstance(kid, str):  # the header is the caller's: a list or object is no key id
            raise UnknownKey(repr(kid))
        with self._changed:
            self._drop_stale_keys()
            if kid in self._keys:
                return self._keys[kid]
            fresh = self._fetched_at is not None and time.monotonic() - self._fetched_at < self.timing.min_interval_seconds
            if fresh:
                raise UnknownKey(kid)
            generation = self._generation
        if not self._waiters.acquire(blocking=False):
            raise KeysUnavailable(f"{self.timing.max_waiters} requests already wait for the issuer's keys")
        try:
            self._wake.set()
            with self._changed:
                self._changed.wait_for(lambda: self._generation > generation, timeout=self.timing.wait_seconds)
                if kid in self._keys:
                    return self._keys[kid]
                if self._generation > generation and self._last_ok:
                    raise UnknownKey(kid)
        finally:
            self._waiters.release()
        raise KeysUnavailable(f"the issuer's keys did not arrive within {self.timing.wait_seconds:g}s")
