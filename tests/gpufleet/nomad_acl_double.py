"""A local double of Nomad's ACL bootstrap and token-self endpoints (no Nomad binary runs here).

Behaviour read from hashicorp/nomad v1.10.5:
- ``POST /v1/acl/bootstrap`` (``command/agent/acl_endpoint.go:145-170``, ``nomad/acl_endpoint.go:485-573``):
  an optional body ``{"BootstrapSecret": "<uuid>"}`` becomes the management token's SecretID (not a UUID:
  400 "invalid acl token"); once bootstrapped, 400 "ACL bootstrap already done (reset index: N)"; the
  answer is the ACLToken (AccessorID, SecretID, Name "Bootstrap Token", Type "management", Global).
- ``GET /v1/acl/token/self`` with ``X-Nomad-Token``: the token, or 403 "ACL token not found"
  (``command/agent/http.go:704-706``).
- Before a leader is elected the servers answer 500 "No cluster leader" (``nomad/structs/errors.go``
  ``errNoLeader``): ``no_leader`` answers that many requests so, ``self_no_leader`` that many token-self
  lookups (a leader election between two requests).
- ``lose_bootstrap_answers``: that many bootstraps are applied but their connection drops before the
  answer (a timeout or reset the client sees as an error, though Raft committed the token).
"""

from __future__ import annotations

import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class NomadAclDouble:
    def __init__(self, *, no_leader: int = 0) -> None:
        self.self_no_leader = 0
        self.lose_bootstrap_answers = 0
        self.tokens: dict[str, dict[str, Any]] = {}  # SecretID -> ACLToken
        self.reset_index = 0
        self.no_leader = no_leader
        self.requests: list[tuple[str, str, dict[str, str], Any]] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def address(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> NomadAclDouble:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def bootstrap_by_hand(self) -> str:
        """What an operator's ``nomad acl bootstrap`` did before gpufleet: a token gpufleet never saw."""
        secret = str(uuid.uuid4())
        self._bootstrap(secret)
        return secret

    def _bootstrap(self, secret: str) -> dict[str, Any]:
        token = {"AccessorID": str(uuid.uuid4()), "SecretID": secret, "Name": "Bootstrap Token", "Type": "management",
                 "Policies": None, "Global": True, "CreateIndex": 7, "ModifyIndex": 7}
        self.tokens[secret] = token
        self.reset_index = 7
        return token

    def _answer(self, method: str, path: str, headers: dict[str, str], body: Any) -> tuple[int, Any]:
        if self.no_leader > 0:
            self.no_leader -= 1
            return 500, "No cluster leader"
        if (method, path) == ("POST", "/v1/acl/bootstrap"):
            if self.tokens:
                return 400, f"ACL bootstrap already done (reset index: {self.reset_index})"
            secret = (body or {}).get("BootstrapSecret") or str(uuid.uuid4())
            try:
                uuid.UUID(secret)
            except ValueError:
                return 400, "invalid acl token"
            token = self._bootstrap(secret)
            if self.lose_bootstrap_answers > 0:
                self.lose_bootstrap_answers -= 1
                return None, None
            return 200, token
        if (method, path) == ("GET", "/v1/acl/token/self"):
            if self.self_no_leader > 0:
                self.self_no_leader -= 1
                return 500, "No cluster leader"
            token = self.tokens.get(headers.get("X-Nomad-Token", ""))
            return (200, token) if token else (403, "ACL token not found")
        return 404, f"no route {method} {path}"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        double = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return

            def _serve(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                headers = dict(self.headers.items())
                with double._lock:
                    double.requests.append((method, self.path, headers, body))
                    status, answer = double._answer(method, self.path, headers, body)
                if status is None:
                    self.close_connection = True
                    return
                data = (answer if isinstance(answer, str) else json.dumps(answer)).encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain" if isinstance(answer, str) else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

        return Handler
