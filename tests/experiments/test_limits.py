"""An unauthenticated client cannot make the service buffer a large body (security round three:
one 150 MB POST raised the service from 97 MB to 558 MB). The service runs under a real uvicorn
on 127.0.0.1 in this process; its peak memory is read from /proc (VmHWM) around each request."""

from __future__ import annotations

import http.client
import threading

import pytest

from experiments.app import ServiceSettings, create_app
from experiments.limits import MAX_BODY_BYTES
from tests.experiments.uvicorn_server import serve

CHUNK = b"x" * (64 * 1024)
TOTAL = 150 * 1024 * 1024


def _rss_kb() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


class PeakRss:
    """The largest growth of this process's resident memory while the block runs (sampled every 5 ms)."""

    def __enter__(self) -> "PeakRss":
        self.base, self.peak, self._stop = _rss_kb(), 0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, _rss_kb() - self.base)

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self.grown_mb = self.peak / 1024


@pytest.fixture
def server(sqlite_url, nomad_runner, request):
    """The port of the service under uvicorn. Through ``serve``: it binds port 0 itself and fails when uvicorn has
    not started within 20 s; this fixture used to pick a free port that uvicorn bound later (another process could
    take it first) and went on after 4 s whether or not uvicorn had started (a connection refused on a loaded host)."""
    limit = getattr(request, "param", MAX_BODY_BYTES)
    app = create_app(ServiceSettings(db_url=sqlite_url, worker=False, max_body_bytes=limit), runner=nomad_runner)
    with serve(app) as base:
        yield int(base.rsplit(":", 1)[1])


def _post_streamed(port: int, path: str, *, declared: bool) -> tuple[int, bytes]:
    """POST 150 MB in 64 KiB chunks (chunked, or with a Content-Length); the status the server
    answered and its body (the server may close before the client has sent everything)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.putrequest("POST", path)
    connection.putheader("Content-Type", "application/json")
    if declared:
        connection.putheader("Content-Length", str(TOTAL))
    else:
        connection.putheader("Transfer-Encoding", "chunked")
    connection.endheaders()
    try:
        for _ in range(TOTAL // len(CHUNK)):
            connection.send(CHUNK if declared else b"%x\r\n%s\r\n" % (len(CHUNK), CHUNK))
        if not declared:
            connection.send(b"0\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass
    response = connection.getresponse()
    body = response.read()
    connection.close()
    return response.status, body


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
@pytest.mark.parametrize("path", ["/api/v1/experiments", "/login"])
def test_a_150_mb_body_is_refused_with_413_before_authentication_and_memory_stays_flat(server, path, declared):
    with PeakRss() as memory:
        status, body = _post_streamed(server, path, declared=declared)
    assert status == 413, body[:300]
    assert b"request body larger than" in body
    assert memory.grown_mb < 20, f"the service's memory grew {memory.grown_mb:.0f} MB for a refused body"


def test_a_normal_submission_still_fits(server):
    connection = http.client.HTTPConnection("127.0.0.1", server, timeout=10)
    connection.request("POST", "/api/v1/experiments", body=b'{"job": "finetune-llama"}', headers={"Content-Type": "application/json"})
    assert connection.getresponse().status == 401  # reaches authentication: not cut off
    assert MAX_BODY_BYTES >= 16 * 1024


@pytest.mark.parametrize("server", [10**12], indirect=True)
def test_the_measurement_sees_a_buffered_body(server):
    """Without the limit (as before) the service reads the whole chunked body: the same probe sees it."""
    with PeakRss() as memory:
        status, _body = _post_streamed(server, "/api/v1/experiments", declared=False)
    assert status != 413 and memory.grown_mb > 100, memory.grown_mb
