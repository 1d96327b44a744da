"""A local Prometheus HTTP API double for the GKE utilization tests.

No Prometheus runs here, so this speaks the documented API on 127.0.0.1 (prometheus/docs/querying/
api.md): ``GET`` or form-encoded ``POST /api/v1/query`` with ``query``; success is
``{"status": "success", "data": {"resultType": "vector", "result": [{"metric": {...}, "value":
[<unix seconds>, "<value as a string>"]}]}}``, a bad query ``400 {"status": "error", "errorType":
"bad_data", "error": "..."}``. It evaluates exactly one PromQL form, an instant vector selector of
label matchers (``{__name__=~"A|B", label=~"x|y", other="z"}``; ``=~`` anchored as Prometheus
anchors it), over the samples a test sets in ``series`` (as dcgm-exporter exposes them after the
scrape). It records every query, and ``down`` answers 503 like an unavailable frontend.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')


def _unquote(text: str) -> str:
    """A PromQL double-quoted string's escapes, as Go's strconv.Unquote takes them (PromQL's lexer
    uses Go string rules): any other backslash sequence is "unknown escape sequence". The numeric
    escapes (\\x, \\u, octal) are not modelled and refused too."""
    simple = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\", '"': '"', "'": "'"}
    out, i = [], 0
    while i < len(text):
        if text[i] != "\\":
            out.append(text[i])
            i += 1
            continue
        nxt = text[i + 1] if i + 1 < len(text) else ""
        if nxt not in simple:
            raise ValueError(f"unknown escape sequence \\{nxt} in {text!r}")
        out.append(simple[nxt])
        i += 2
    return "".join(out)


def select(query: str, series: list[tuple[dict[str, str], float]]) -> list[dict[str, Any]]:
    """Evaluate ``{matchers}`` over ``series``; ValueError for anything else (the double's limit)."""
    text = query.strip()
    if not (text.startswith("{") and text.endswith("}")):
        raise ValueError(f"the double evaluates only a vector selector, not {query!r}")
    body, matchers, pos = text[1:-1], [], 0
    while pos < len(body):
        found = _MATCHER.match(body, pos)
        if found is None:
            raise ValueError(f"parse error at char {pos + 1}: unexpected {body[pos:pos + 10]!r}")
        matchers.append((found.group(1), found.group(2), _unquote(found.group(3))))
        pos = found.end()

    def ok(labels: dict[str, str], name: str, op: str, value: str) -> bool:
        have = labels.get(name, "")
        if op == "=":
            return have == value
        if op == "!=":
            return have != value
        hit = re.fullmatch(value, have) is not None
        return hit if op == "=~" else not hit

    return [{"metric": dict(labels), "value": [1_800_000_000.0, repr(value) if value == value else "NaN"]}
            for labels, value in series if all(ok(labels, *m) for m in matchers)]


def dcgm_gpu(*, namespace: str, pod: str, gpu: int, util: float, fb_used_mib: float) -> list[tuple[dict[str, str], float]]:
    """One GPU of a pod as the managed collection stores dcgm-exporter's series (the exporter's
    pod labels renamed exported_*, the target's own naming the exporter pod)."""
    base = {"exported_namespace": namespace, "exported_pod": pod, "gpu": str(gpu), "UUID": f"GPU-{pod}-{gpu}", "modelName": "NVIDIA H100 80GB HBM3",
            "namespace": "gke-managed-system", "pod": "dcgm-exporter-x7k2p", "Hostname": "gke-node-1"}
    return [({"__name__": "DCGM_FI_DEV_GPU_UTIL", **base}, util), ({"__name__": "DCGM_FI_DEV_FB_USED", **base}, fb_used_mib)]


class PrometheusDouble:
    def __init__(self) -> None:
        self.series: list[tuple[dict[str, str], float]] = []
        self.queries: list[str] = []
        self.down = False
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> PrometheusDouble:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def gpu(self, *, namespace: str, pod: str, gpu: int, util: float, fb_used_mib: float) -> None:
        self.series.extend(dcgm_gpu(namespace=namespace, pod=pod, gpu=gpu, util=util, fb_used_mib=fb_used_mib))

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        double = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return

            def _answer(self, form: dict[str, list[str]]) -> None:
                query = (form.get("query") or [""])[0]
                double.queries.append(query)
                if double.down:
                    return self._send(503, {"status": "error", "errorType": "unavailable", "error": "frontend unavailable"})
                try:
                    result = select(query, double.series)
                except ValueError as exc:
                    return self._send(400, {"status": "error", "errorType": "bad_data", "error": str(exc)})
                self._send(200, {"status": "success", "data": {"resultType": "vector", "result": result}})

            def _send(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                url = urlsplit(self.path)
                if url.path != "/api/v1/query":
                    return self._send(404, {"status": "error", "errorType": "not_found", "error": "not found"})
                self._answer(parse_qs(url.query))

            def do_POST(self) -> None:
                if urlsplit(self.path).path != "/api/v1/query":
                    return self._send(404, {"status": "error", "errorType": "not_found", "error": "not found"})
                length = int(self.headers.get("Content-Length") or 0)
                self._answer(parse_qs(self.rfile.read(length).decode()))

        return Handler
