"""A stalled OIDC issuer costs only OIDC callers (security round three).

The issuer's JWKS endpoint is a real socket on 127.0.0.1 whose thread accepts connections and
never answers; the service runs under uvicorn (its real request thread pool). Before the change,
PyJWKClient fetched under its lock inside request threads: 60 unauthenticated garbage JWTs filled
the pool and a tenant's token GET waited behind them."""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from experiments.app import ServiceSettings, create_app
from experiments.auth import OidcSettings, create_token
from experiments.jwks import JwksCache, JwksTiming, KeysUnavailable, UnknownKey
from tests.experiments.conftest import FakeClock, UnusedRunner
from tests.experiments.uvicorn_server import serve

ISSUER = "https://ci.example.test"
AUDIENCE = "gpufleet"
GARBAGE = 60  # more than the request thread pool (anyio's default: 40)


class Issuer:
    """A JWKS endpoint that answers ``body`` (one RSA key, ``ci-1``, at first) until ``stall()``,
    then accepts every connection and never answers (a thread that accepts and sleeps). With
    ``drip`` set it sends the status and headers at once and then the body one byte every 0.2 s
    (each byte well inside a per-read socket timeout); with ``drip_headers`` it drips a header."""

    def __init__(self) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.body = self.jwks(("ci-1", self.key))
        self.stalled = threading.Event()
        self.garbage = threading.Event()  # answers 200 with a body that is not JSON
        self.drip = threading.Event()
        self.drip_headers = threading.Event()
        self.drips_started = 0
        self.done = threading.Event()
        self.held: list[socket.socket] = []
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                return

            def handle(self) -> None:
                if issuer.stalled.is_set():
                    issuer.held.append(self.connection)
                    issuer.done.wait()  # accepted, never answered
                    return
                super().handle()

            def _slowly(self, data: bytes) -> None:
                issuer.drips_started += 1
                for byte in data:
                    if issuer.done.is_set():
                        return
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(0.2)

            def do_GET(self) -> None:
                answer = b"<html>maintenance</html>" if issuer.garbage.is_set() else issuer.body
                try:
                    if issuer.drip_headers.is_set():
                        self.wfile.write(b"HTTP/1.1 200 OK\r\n")
                        self._slowly(b"X-Padding: " + b"a" * 4000 + b"\r\n")
                        return
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(answer)))
                    self.end_headers()
                    if issuer.drip.is_set():
                        self._slowly(answer)
                    else:
                        self.wfile.write(answer)
                except OSError:
                    return  # the fetcher hung up

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/jwks"

    @staticmethod
    def jwks(*pairs: tuple[str, rsa.RSAPrivateKey], **extra: object) -> bytes:
        keys = [{**json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key())), "kid": kid, "use": "sig", "alg": "RS256"} for kid, key in pairs]
        return json.dumps({"keys": keys, **extra}).encode()

    def token(self, key=None, kid: str = "ci-1", **claims) -> str:
        now = int(time.time())
        payload = {"iss": ISSUER, "aud": AUDIENCE, "sub": "repo:acme/train", "iat": now, "exp": now + 300, "repository_owner": "acme-finetune", **claims}
        return jwt.encode(payload, key or self.key, algorithm="RS256", headers={"kid": kid})

    def close(self) -> None:
        self.done.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def issuer() -> Iterator[Issuer]:
    instance = Issuer()
    yield instance
    instance.close()


def _service(sqlite_url: str, catalog, issuer: Issuer):
    oidc = OidcSettings(issuer=ISSUER, audience=AUDIENCE, jwks_url=issuer.url, claim="repository_owner", tenants=(("acme-finetune", "finetune"),))
    clock = FakeClock()
    app = create_app(ServiceSettings(db_url=sqlite_url, worker=False, oidc=oidc), runner=UnusedRunner(), catalog=catalog, clock=clock)
    with app.state.ctx.sessions() as session, session.begin():
        token = create_token(session, tenant="finetune", admin=False, name="t", now=clock())[1]
    return app, {"Authorization": f"Bearer {token}"}


def _flood(base: str, count: int) -> ThreadPoolExecutor:
    """Unauthenticated garbage JWTs, each with a kid of its own (the issuer knows none of them)."""
    pool = ThreadPoolExecutor(max_workers=count)

    def one(i: int) -> None:
        junk = jwt.encode({"sub": "x"}, "not-a-key-of-anyone-000000000000", algorithm="HS256", headers={"kid": f"junk-{i}"})
        try:
            httpx.get(f"{base}/api/v1/experiments", headers={"Authorization": f"Bearer {junk}"}, timeout=20)
        except httpx.HTTPError:
            pass

    for i in range(count):
        pool.submit(one, i)
    return pool


def _timed(call) -> tuple[httpx.Response, float]:
    start = time.monotonic()
    answer = call()
    return answer, time.monotonic() - start


def test_token_callers_answer_promptly_while_garbage_jwts_wait_on_a_stalled_issuer(sqlite_url, catalog, issuer):
    issuer.stalled.set()  # stalled from the start: the service has no keys at all
    app, tenant = _service(sqlite_url, catalog, issuer)
    with serve(app) as base:
        flood = _flood(base, GARBAGE)
        time.sleep(1.0)  # the garbage is in flight
        answer, seconds = _timed(lambda: httpx.get(f"{base}/api/v1/experiments", headers=tenant, timeout=30))
        assert answer.status_code == 200
        assert seconds < 2.0, f"a token caller waited {seconds:.1f}s behind garbage JWTs (the issuer stalls for good)"
        oidc, seconds = _timed(lambda: httpx.get(f"{base}/api/v1/experiments", headers={"Authorization": f"Bearer {issuer.token()}"}, timeout=30))
        assert oidc.status_code == 503 and "signing keys are not available" in oidc.json()["error"], oidc.text
        assert seconds < 8.0, f"an OIDC caller waited {seconds:.1f}s"
        flood.shutdown(wait=False, cancel_futures=True)


def test_cached_keys_keep_oidc_callers_working_while_the_issuer_stalls(sqlite_url, catalog, issuer):
    app, _tenant = _service(sqlite_url, catalog, issuer)
    with serve(app) as base:
        bearer = {"Authorization": f"Bearer {issuer.token()}"}
        assert httpx.get(f"{base}/api/v1/experiments", headers=bearer, timeout=30).status_code == 200
        issuer.stalled.set()
        flood = _flood(base, GARBAGE)
        time.sleep(1.0)
        answer, seconds = _timed(lambda: httpx.get(f"{base}/api/v1/experiments", headers=bearer, timeout=30))
        assert answer.status_code == 200 and seconds < 2.0, (answer.status_code, seconds)
        forged = httpx.get(f"{base}/api/v1/experiments", headers={"Authorization": f"Bearer {issuer.token(key=rsa.generate_private_key(public_exponent=65537, key_size=2048))}"}, timeout=30)
        assert forged.status_code == 401  # a known kid with the wrong signature: refused from memory
        flood.shutdown(wait=False, cancel_futures=True)


@pytest.mark.parametrize("kid", [["a"], {"k": 1}, 7])
def test_fails_with_401_when_the_kid_is_not_a_string(make_service, sqlite_url, issuer, kid):
    oidc = OidcSettings(issuer=ISSUER, audience=AUDIENCE, jwks_url=issuer.url, claim="repository_owner", tenants=(("acme-finetune", "finetune"),))
    svc = make_service(sqlite_url, UnusedRunner(), oidc=oidc)
    def part(value: object) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    token = f"{part({'alg': 'RS256', 'typ': 'JWT', 'kid': kid})}.{part({'sub': 'x'})}.c2ln"  # PyJWT will not encode such a kid
    assert svc.client.get("/api/v1/experiments", headers={"Authorization": f"Bearer {token}"}).status_code == 401


def test_the_key_thread_lives_on_when_the_issuer_answers_garbage(issuer):
    """A maintenance page instead of JSON raised out of PyJWKClient's fetch (not a PyJWTError) and
    would have ended the thread: every later OIDC caller 503 until a restart."""
    issuer.garbage.set()
    cache = JwksCache(issuer.url, JwksTiming(retry_seconds=0.2, min_interval_seconds=0.1, wait_seconds=2.0))
    cache.start()
    try:
        with pytest.raises(KeysUnavailable):
            cache.key("ci-1")
        issuer.garbage.clear()
        assert cache.key("ci-1").key_id == "ci-1"
        with pytest.raises(UnknownKey):
            cache.key("not-a-key-of-the-issuer")
    finally:
        cache.stop()


def _quick(**overrides: float) -> JwksTiming:
    """Production spacing (300 s / 10 s / 5 s) shrunk so a test sees several fetches."""
    return JwksTiming(**{"refresh_seconds": 0.2, "retry_seconds": 0.2, "min_interval_seconds": 0.1, "fetch_timeout_seconds": 1.0, "wait_seconds": 0.5, **overrides})


def _oidc_service(make_service, sqlite_url: str, issuer: Issuer, timing: JwksTiming):
    oidc = OidcSettings(issuer=ISSUER, audience=AUDIENCE, jwks_url=issuer.url, claim="repository_owner", tenants=(("acme-finetune", "finetune"),),
                        jwks_timing=timing)
    return make_service(sqlite_url, UnusedRunner(), oidc=oidc)


def _status_within(svc, token: str, wanted: int, seconds: float = 10.0) -> int:
    """The status of an OIDC GET, asked again until it is ``wanted`` or ``seconds`` pass."""
    deadline = time.monotonic() + seconds
    while True:
        status = svc.client.get("/api/v1/experiments", headers={"Authorization": f"Bearer {token}"}).status_code
        if status == wanted or time.monotonic() > deadline:
            return status
        time.sleep(0.1)


def _withdrawn(issuer: Issuer) -> dict[str, bytes]:
    jwk = json.loads(Issuer.jwks(("ci-1", issuer.key)))["keys"][0]
    return {
        "no-keys": b'{"keys": []}',
        "encryption-only": json.dumps({"keys": [{**jwk, "use": "enc"}]}).encode(),
        "no-kid": json.dumps({"keys": [{k: v for k, v in jwk.items() if k != "kid"}]}).encode(),
        "not-a-key": json.dumps({"keys": [{"kty": "RSA", "kid": "ci-1", "n": "AQAB"}]}).encode(),
    }


@pytest.mark.parametrize("answer", ["no-keys", "encryption-only", "no-kid", "not-a-key"])
def test_fails_with_401_once_the_issuer_withdraws_its_signing_key(make_service, sqlite_url, issuer, answer):
    """Second red team: an issuer's emergency rotation (the JWKS now lists no usable key) was taken
    for a failed fetch, so the withdrawn key stayed valid forever. A JWK Set that parses is a
    successful fetch, whatever keys it holds."""
    svc = _oidc_service(make_service, sqlite_url, issuer, _quick())
    token = issuer.token()
    assert _status_within(svc, token, 200) == 200
    issuer.body = _withdrawn(issuer)[answer]
    assert _status_within(svc, token, 401) == 401, "a JWT signed with the withdrawn key is still accepted"


def test_cached_keys_are_dropped_after_the_maximum_staleness_and_oidc_callers_get_503(make_service, sqlite_url, issuer):
    """Cached keys outlive an outage, but not forever (default one hour): an issuer that stays
    unreachable past the limit leaves no key to accept, so OIDC callers get 503 (retry)."""
    assert JwksTiming().max_stale_seconds == 3600
    svc = _oidc_service(make_service, sqlite_url, issuer, _quick(max_stale_seconds=1.0))
    token = issuer.token()
    assert _status_within(svc, token, 200) == 200
    issuer.stalled.set()
    assert _status_within(svc, token, 503) == 503, "keys last fetched long ago are still accepted"
    answer = svc.client.get("/api/v1/experiments", headers={"Authorization": f"Bearer {token}"})
    assert "signing keys are not available" in answer.json()["error"]


@pytest.mark.parametrize("where", ["body", "headers"])
def test_a_dripped_answer_does_not_hold_the_key_thread_past_its_deadline(make_service, sqlite_url, issuer, where):
    """Second red team: the fetch timeout was urllib's per-read socket timeout, so an answer
    dripped one byte every 0.2 s held the one key thread for minutes (no refresh, no retry: a
    rotated-in key stayed 503). Here the issuer rotates to ``ci-2`` and drips one answer; once the
    path is healthy again the new key must work within seconds, not after the drip ends."""
    svc = _oidc_service(make_service, sqlite_url, issuer, _quick())
    assert _status_within(svc, issuer.token(), 200) == 200
    second = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    issuer.body = Issuer.jwks(("ci-2", second))
    (issuer.drip if where == "body" else issuer.drip_headers).set()
    deadline = time.monotonic() + 10
    while issuer.drips_started == 0:
        assert time.monotonic() < deadline, "the key thread never fetched"
        time.sleep(0.05)
    issuer.drip.clear()
    issuer.drip_headers.clear()
    assert _status_within(svc, issuer.token(key=second, kid="ci-2"), 200) == 200, "the key thread is still inside the dripped fetch"


def test_fails_to_take_keys_from_an_answer_over_one_mib(make_service, sqlite_url, issuer):
    """A size cap: the fetcher stops reading past 1 MiB and keeps no key from such an answer."""
    issuer.body = Issuer.jwks(("ci-1", issuer.key), padding=" " * (1 << 20))
    svc = _oidc_service(make_service, sqlite_url, issuer, _quick())
    assert _status_within(svc, issuer.token(), 503, seconds=3) == 503
