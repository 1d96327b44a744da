"""The OIDC issuer's signing keys, fetched by one background thread and served from memory.

Why not ``jwt.PyJWKClient`` in the request: it fetches under its lock inside the request thread,
so while the identity provider is slow every OIDC request queues on that lock, and enough
unauthenticated garbage JWTs (any ``kid``) fill the whole request thread pool, so token callers
stalled too (security round three: a tenant's GET took 17.5 s instead of 23 ms). Here only the
``gpufleet-jwks`` thread touches the network (PyJWKClient's own fetch and parsing, no cache of its
own); a request either finds its key in memory, or waits a bounded time for the thread, and at
most ``max_waiters`` requests wait at once (the rest are answered 503 at once), so OIDC callers get
a bounded error and API-token callers, who never come here, keep their threads.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("gpufleet.jwks")


@dataclass(frozen=True)
class JwksTiming:
    refresh_seconds: float = 300.0  # keys are re-read this often while the issuer answers
    retry_seconds: float = 10.0  # ... and this often while it does not
    min_interval_seconds: float = 5.0  # an unknown kid forces a fetch at most this often
    fetch_timeout_seconds: float = 5.0
    wait_seconds: float = 3.0  # the most an OIDC request waits for a fetch
    max_waiters: int = 4  # requests waiting at once; more are answered 503 without waiting


class KeysUnavailable(Exception):
    """The issuer's keys could not be read in time: the caller should retry (503)."""


class UnknownKey(Exception):
    """The issuer's current keys have no key for this token (401)."""


class JwksCache:
    def __init__(self, url: str, timing: JwksTiming | None = None) -> None:
        import jwt

        self.timing = timing or JwksTiming()
        self._client = jwt.PyJWKClient(url, cache_jwk_set=False, timeout=self.timing.fetch_timeout_seconds)
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
            keys = {k.key_id: k for k in self._client.get_signing_keys(refresh=True)}
            ok = True
        except Exception as exc:  # noqa: BLE001 - any answer (not JSON, no keys, a reset) is a failed attempt; the thread must live on
            log.warning("OIDC JWKS fetch from %s failed: %s: %s", self._client.uri, type(exc).__name__, exc)
            keys, ok = {}, False
        with self._changed:
            if ok:
                self._keys, self._fetched_at = keys, time.monotonic()
            self._last_ok = ok
            self._generation += 1
            self._changed.notify_all()

    def key(self, kid: object) -> Any:
        """The key for ``kid``, from memory when it is there (cached keys outlive an issuer outage)."""
        if not isinstance(kid, str):  # the header is the caller's: a list or object is no key id
            raise UnknownKey(repr(kid))
        with self._changed:
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
