"""A local Nomad HTTP API double for the jobs client tests.

It is a double, not Nomad: no Nomad binary is available on these machines (none is installed
and none can be downloaded), so the client is tested against this instead: a small ``http.server`` on
127.0.0.1 in a thread of the test process, speaking the JSON of Nomad's documented HTTP API
for the endpoints gpufleet uses (register, plan, dispatch, job, evaluations, allocations,
deregister, job list with ``prefix`` and ``meta=true`` (JobListStub.Meta, command/agent/job_endpoint.go:45-52),
allocation list, both lists across namespaces with ``namespace=*`` (structs.AllNamespacesSentinel,
nomad/structs/structs.go:187; nomad/alloc_endpoint.go:82, nomad/job_endpoint.go:1444), and ``GET /v1/agent/members``: the
region's servers as ``api.ServerMembers`` (api/agent.go) with the serf tags a server sets
(nomad/server.go ``setupSerf``: role, region, dc, id = the server's node id, rpc_addr, port...),
so a test can stand up a second "cluster" with the same region name and other servers). Also a node's own endpoints
(``GET /v1/node/:id``, ``PUT .../eligibility``, ``PUT .../drain``: NomadDouble._node_answer), ``/v1/status/leader`` and an allocation's
resource usage ``/v1/client/allocation/:id/stats``: an AllocResourceUsage whose DeviceStats are
shaped as hashicorp/nomad api/tasks.go:58-78 and api/nodes.go:827-875 declare them and filled
as hashicorp/nomad-device-nvidia stats.go:146-306 fills them: group Vendor "nvidia", Type "gpu",
InstanceStats by GPU UUID, ``Stats.Attributes["GPU utilization"]`` (%), ``Summary`` = ``Memory state``
(used / total MiB), "N/A" as ``StringVal`` where NVML gave nothing). With ``tls=`` (an ``ssl.SSLContext``) it serves HTTPS and, when the
context requires a client certificate, behaves like agents with ``verify_https_client``, so the
client's CA, certificate and server-name handling run against a real TLS handshake. It records every request exactly as sent (method, path, query string,
headers, body) and can inject faults (an HTTP status, or a slow answer that outlives the
client's timeout *after* the request took effect, like a lost response).

The client filesystem logs API ``/v1/client/fs/logs/:alloc_id`` is answered as jobs/nomad/logs.py
documents from hashicorp/nomad's source: its parameters and their 400s, plain bytes or concatenated
JSON StreamFrames with a ``{}`` heartbeat every second, a follow that stays open after the task
exited, and 404 "Unknown allocation" once the allocation is garbage-collected (``gc``).

Placement is modelled on Nomad's scheduler metrics: nodes outside the job's NodePool are
not evaluated; a failed constraint counts in ConstraintFiltered["<L> <op> <R>"]; a node
without enough matching GPUs at all counts as "missing devices"; a node whose matching
GPUs are busy counts in DimensionExhausted["devices: no devices match request"].

It sits in ``tests/jobs/`` rather than ``tests/jobs/nomad/`` because the control-plane tests
(``tests/experiments``), the neutral runner and quota tests and the run-local tests import it
too; moving it would only lengthen their imports.
"""

from __future__ import annotations

import base64
import json
import re
import ssl
import threading
import time
import uuid
from datetime import UTC, datetime
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

DEVICES_EXHAUSTED = "devices: no devices match request"


@dataclass
class FakeNode:
    name: str
    node_pool: str
    node_class: str
    gpu_model: str  # the NVML device name, as the nvidia plugin reports it (the device group's Name)
    gpu_memory_mib: int  # NVML total memory; the plugin's ``memory`` attribute has unit MiB
    gpus: int
    gpus_used: int = 0
    datacenter: str = "europe-west4"
    # GET /v1/node/:id, PUT .../eligibility and .../drain (see _node_answer): the fields of api.Node they touch.
    node_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    eligibility: str = "eligible"
    drain_strategy: dict[str, Any] | None = None
    last_drain: dict[str, Any] | None = None
    events: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: Any


@dataclass
class Fault:
    status: int = 0
    delay_seconds: float = 0.0
    # A latch instead of a time: the request sets ``reached`` and is answered once ``release`` is set.
    reached: threading.Event | None = None
    release: threading.Event | None = None


@dataclass
class _State:
    jobs: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    evaluations: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    allocations: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    tokens: dict[str, str] = field(default_factory=dict)
    index: int = 100
    # (alloc id, task, "stdout"|"stderr") -> what the task wrote (alloc/logs/<task>.<type>.0)
    logs: dict[tuple[str, str, str], bytearray] = field(default_factory=dict)


def _mib(text: str) -> float:
    """An attribute value with a unit, as Nomad's ParseAttribute reads ``RTarget`` (base-2 units)."""
    number, _, unit = text.partition(" ")
    factor = {"MiB": 1, "GiB": 1024, "TiB": 1024 * 1024}
    if unit not in factor:
        raise AssertionError(f"the double does not model memory unit {unit!r} in {text!r}")
    return float(number) * factor[unit]


def _device_ok(node: FakeNode, constraint: dict[str, str]) -> bool:
    ltarget, operand, rtarget = constraint["LTarget"], constraint["Operand"], constraint["RTarget"]
    if ltarget == "${device.attr.memory}" and operand == ">=":
        return node.gpu_memory_mib >= _mib(rtarget)
    if ltarget == "${device.model}" and operand == "regexp":
        return re.search(rtarget, node.gpu_model) is not None
    raise AssertionError(f"the double does not model device constraint {constraint}")


def _node_ok(node: FakeNode, constraint: dict[str, str]) -> bool:
    if constraint["LTarget"] == "${node.class}" and constraint["Operand"] == "=":
        return node.node_class == constraint["RTarget"]
    raise AssertionError(f"the double does not model constraint {constraint}")


class NomadDouble:
    def __init__(self, nodes: list[FakeNode] | None = None, *, acl_token: str | None = None, tls: ssl.SSLContext | None = None,
                 region: str = "global") -> None:
        self.nodes = list(nodes or [])
        self.acl_token = acl_token
        self.region = region
        self.server_ids = [str(uuid.uuid4()) for _ in range(3)]  # each server's node id (data_dir/server/node-id)
        self.requests: list[Recorded] = []
        self.faults: dict[tuple[str, str], list[Fault]] = {}
        self.triggers: list[tuple[str, str, int, Callable[[], None]]] = []
        self.state = _State()
        # allocation id -> per GPU (utilization % or None for N/A, used MiB or None); absent: no device stats
        self.gpu_stats: dict[str, list[tuple[int | None, int | None]]] = {}
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.tls = tls
        self.heartbeat_seconds = 1.0  # client/fs_endpoint.go streamHeartbeatRate
        self.closed = False
        if tls is not None:
            self._server.socket = tls.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def address(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{'https' if self.tls else 'http'}://{host}:{port}"

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> NomadDouble:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.closed = True
        self._server.shutdown()
        self._server.server_close()

    def inject(self, method: str, route: str, *faults: Fault) -> None:
        """Answer the next requests of ``route`` (register, plan, dispatch, job, ...) with these faults."""
        self.faults.setdefault((method, route), []).extend(faults)

    def when_called(self, method: str, route: str, times: int, action: Callable[[], None]) -> None:
        """Run ``action`` just before answering the ``times``-th request of ``route`` (state changes mid-watch)."""
        self.triggers.append((method, route, times, action))

    def calls(self, method: str, route: str) -> list[Recorded]:
        return [r for r in self.requests if r.method == method and _route(r.path)[0] == route]

    def stamp_times(self, job_id: str, placed: datetime, started: datetime, finished: datetime) -> None:
        """What Nomad's own clock says of the run's allocation (UTC), in its fields: api/allocations.go
        AllocationListStub CreateTime/ModifyTime (int64 Unix ns), api/tasks.go TaskState StartedAt/FinishedAt
        (time.Time, RFC 3339 with nanoseconds). ModifyTime is a second after the task finished, as the
        client's update reaches the servers later."""
        alloc = self.state.allocations[job_id][-1]
        placed, started, finished = (t.replace(tzinfo=UTC) for t in (placed, started, finished))
        alloc["CreateTime"] = int(placed.timestamp()) * 1_000_000_000
        alloc["ModifyTime"] = (int(finished.timestamp()) + 1) * 1_000_000_000
        for task in (alloc.get("TaskStates") or {}).values():
            task.update({"StartedAt": started.strftime("%Y-%m-%dT%H:%M:%S.123456789Z"), "FinishedAt": finished.strftime("%Y-%m-%dT%H:%M:%S.000000001Z")})

    def dispatched(self, parent: str) -> list[str]:
        return sorted(job_id for (_, job_id), job in self.state.jobs.items() if job.get("ParentID") == parent)

    def finish(self, job_id: str, *, client_status: str, events: list[dict[str, Any]] | None = None, failed: bool = False) -> None:
        """Move the run's allocation to a client status, with task events (for status tests)."""
        alloc = self.state.allocations[job_id][-1]
        started = ((alloc.get("TaskStates") or {}).get("train") or {}).get("StartedAt")
        alloc["ClientStatus"] = client_status
        alloc["TaskStates"] = {"train": {"State": "dead" if client_status != "running" else "running", "Failed": failed, "Events": events or [],
                                         **({"StartedAt": started} if started else {})}}

    def lose_node(self, job_id: str) -> None:
        """The run's node stops heartbeating and is marked down: Nomad marks its allocation lost, as
        upstream writes it (api/allocations.go:33 AllocClientStatusLost "lost"; the desired stop carries
        scheduler/structs/const.go:22 StatusAllocLost "alloc is lost since its node is down"). The node's
        GPUs are gone with it."""
        with self._lock:
            alloc = self.state.allocations[job_id][-1]
            alloc.update({"ClientStatus": "lost", "DesiredStatus": "stop", "DesiredDescription": "alloc is lost since its node is down",
                          "ClientDescription": "", "ModifyIndex": self._next()})
            node = next(n for n in self.nodes if n.name == alloc["NodeName"])
            node.gpus_used = max(0, node.gpus_used - sum(d.get("Count", 1) for g in self.state.jobs[(alloc["Namespace"], job_id)]["TaskGroups"]
                                                           for t in g["Tasks"] for d in (t.get("Resources") or {}).get("Devices") or []))

    def preempt(self, job_id: str, by: str) -> None:
        """A higher-priority job's allocation evicted this run's: api/allocations.go:25 AllocDesiredStatusEvict
        "evict" and :403 AllocationListStub.PreemptedByAllocation."""
        with self._lock:
            alloc = self.state.allocations[job_id][-1]
            alloc.update({"DesiredStatus": "evict", "PreemptedByAllocation": by, "ClientStatus": "complete", "ModifyIndex": self._next()})

    def drain(self, job_id: str) -> None:
        """The run's node is drained: Nomad marks the allocation for migration (api/allocations.go:572-583
        DesiredTransition.Migrate) while it still runs."""
        with self._lock:
            alloc = self.state.allocations[job_id][-1]
            alloc.update({"DesiredTransition": {"Migrate": True}, "ModifyIndex": self._next()})

    def start_task(self, job_id: str, task: str = "train") -> str:
        """The run's task started on its client: running, with StartedAt and empty log files; its alloc id."""
        with self._lock:
            alloc = self.state.allocations[job_id][-1]
            alloc["ClientStatus"] = "running"
            alloc["TaskStates"] = {task: {"State": "running", "Failed": False, "StartedAt": "2026-12-03T08:00:01Z", "Events": []}}
            for kind in ("stdout", "stderr"):
                self.state.logs.setdefault((alloc["ID"], task, kind), bytearray())
            return str(alloc["ID"])

    def write_log(self, alloc_id: str, text: str, *, stderr: bool = False, task: str = "train") -> None:
        """The task writing to its stdout (or stderr)."""
        with self._lock:
            self.state.logs[(alloc_id, task, "stderr" if stderr else "stdout")] += text.encode()

    def gc(self, job_id: str) -> None:
        """Nomad's garbage collector: the job, its evaluations, allocations and their log files go."""
        with self._lock:
            for key in [k for k in self.state.jobs if k[1] == job_id]:
                del self.state.jobs[key]
            allocs = {a["ID"] for a in self.state.allocations.pop(job_id, [])}
            self.state.evaluations.pop(job_id, None)
            for key in [k for k in self.state.logs if k[0] in allocs]:
                del self.state.logs[key]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        double = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return

            def _serve(self, method: str) -> None:
                url = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                recorded = Recorded(method, unquote(url.path), parse_qs(url.query), dict(self.headers.items()), body)
                with double._lock:
                    double.requests.append(recorded)
                    route, job_id = _route(recorded.path)
                    queue = double.faults.get((method, route)) or []
                    fault = queue.pop(0) if queue else Fault()
                    seen = sum(1 for r in double.requests if r.method == method and _route(r.path)[0] == route)
                    for action in [a for m, r, n, a in double.triggers if (m, r, n) == (method, route, seen)]:
                        action()
                if fault.status:
                    return self._send(fault.status, {"error": f"injected {fault.status}"}, text=True)
                if route == "acl-token-self":
                    status, answer, text = double._token_self(self.headers.get("X-Nomad-Token"))
                    return self._send(status, answer, text=text)
                if double.acl_token and self.headers.get("X-Nomad-Token") != double.acl_token:
                    return self._send(403, "Permission denied", text=True)
                if route == "fs-logs":
                    return double._logs(self, job_id, recorded)
                with double._lock:
                    status, answer = double._answer(method, route, job_id, recorded)
                if fault.delay_seconds:
                    time.sleep(fault.delay_seconds)
                if fault.reached is not None:
                    fault.reached.set()
                if fault.release is not None:
                    fault.release.wait(timeout=120)
                self._send(status, answer, text=isinstance(answer, str))

            def _send(self, status: int, answer: Any, *, text: bool = False) -> None:
                data = (answer if isinstance(answer, str) else json.dumps(answer)).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "text/plain" if text else "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    return

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

            def do_DELETE(self) -> None:
                self._serve("DELETE")

            def do_PUT(self) -> None:
                self._serve("PUT")

        return Handler

    def _logs(self, handler: BaseHTTPRequestHandler, alloc_id: str, req: Recorded) -> None:
        """GET /v1/client/fs/logs/:alloc_id as command/agent/fs_endpoint.go Logs and client/fs_endpoint.go logs answer."""
        def arg(name: str) -> str:
            return (req.query.get(name) or [""])[0]

        def text(status: int, message: str) -> None:
            handler._send(status, message, text=True)  # type: ignore[attr-defined]

        def boolean(name: str) -> bool | None:
            value = arg(name)
            if value in ("", "0", "f", "F", "false", "FALSE", "False"):
                return False
            if value in ("1", "t", "T", "true", "TRUE", "True"):
                return True
            return None  # Go's strconv.ParseBool refuses it

        if not arg("task"):
            return text(400, "must provide task name")
        follow, plain = boolean("follow"), boolean("plain")
        if follow is None:
            return text(400, f'failed to parse follow field to boolean: strconv.ParseBool: parsing "{arg("follow")}": invalid syntax')
        if plain is None:
            return text(400, f'failed to parse plain field to boolean: strconv.ParseBool: parsing "{arg("plain")}": invalid syntax')
        kind, task, origin = arg("type"), arg("task"), arg("origin") or "start"
        if kind not in ("stdout", "stderr"):
            return text(400, "must provide log type (stdout/stderr)")
        try:
            offset = int(arg("offset") or 0)
        except ValueError:
            return text(400, f'error parsing offset: strconv.ParseInt: parsing "{arg("offset")}": invalid syntax')
        if origin not in ("start", "end"):
            return text(400, "origin must be start or end")
        with self._lock:
            alloc = next((a for allocs in self.state.allocations.values() for a in allocs if a["ID"] == alloc_id), None)
            state = ((alloc or {}).get("TaskStates") or {}).get(task)
            data = self.state.logs.get((alloc_id, task, kind))
            position = len(data) if data is not None else 0
        if alloc is None:
            return text(404, f'Unknown allocation "{alloc_id}"')
        if state is None:
            return text(400, f'unknown task name "{task}"')
        if not state.get("StartedAt"):
            return text(404, f'task "{task}" not started yet. No logs available')
        if data is None:
            return text(404, f'log entry for task "{task}" and log type "{kind}" not found')
        position = max(0, min(position, offset if origin == "start" else position - offset))
        name = f"alloc/logs/{task}.{kind}.0"

        def frames(start: int, chunk: bytes) -> bytes:
            out = b""
            for at in range(0, len(chunk), 64 * 1024):  # streamFrameSize; Offset is where the frame's data ends
                piece = chunk[at:at + 64 * 1024]
                out += json.dumps({"Offset": start + at + len(piece), "Data": base64.b64encode(piece).decode(), "File": name}).encode()
            return out

        with self._lock:
            chunk = bytes(self.state.logs[(alloc_id, task, kind)][position:])
        body = chunk if plain else frames(position, chunk)
        try:
            handler.send_response(200)
            handler.send_header("Content-Type", "text/plain" if plain else "application/json")
            if not follow:
                handler.send_header("Content-Length", str(len(body)))
            handler.end_headers()
            handler.wfile.write(body)
            handler.wfile.flush()
            position += len(chunk)
            quiet = time.monotonic()
            while follow and not self.closed:
                time.sleep(0.05)
                with self._lock:
                    current = self.state.logs.get((alloc_id, task, kind))
                    chunk = bytes(current[position:]) if current is not None else b""
                if current is None:
                    return  # garbage-collected under the stream
                if chunk:
                    handler.wfile.write(chunk if plain else frames(position, chunk))
                    position, quiet = position + len(chunk), time.monotonic()
                elif not plain and time.monotonic() - quiet >= self.heartbeat_seconds:
                    handler.wfile.write(b"{}")  # a StreamFrame with every field empty (omitempty)
                    quiet = time.monotonic()
                handler.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            return

    def _next(self) -> int:
        self.state.index += 1
        return self.state.index

    def _answer(self, method: str, route: str, job_id: str, req: Recorded) -> tuple[int, Any]:
        namespace = (req.query.get("namespace") or ["default"])[0]
        key = (namespace, job_id)
        if (method, route) == ("POST", "register"):
            job = req.body["Job"]
            if job.get("Namespace", namespace) != namespace:
                return 400, "job namespace does not match the request namespace"
            self.state.jobs[(namespace, job["ID"])] = job
            return 200, {"EvalID": "", "EvalCreateIndex": 0, "JobModifyIndex": self._next(), "Warnings": "", "Index": self.state.index}
        if (method, route) == ("POST", "plan"):
            job = req.body["Job"]
            failed = None if job.get("ParameterizedJob") else self.place(job, commit=False)[1]
            return 200, {"Diff": {"Type": "Added" if key not in self.state.jobs else "Edited"}, "FailedTGAllocs": failed, "JobModifyIndex": 0, "Annotations": None, "CreatedEvals": None, "Warnings": "", "Index": self.state.index}
        if (method, route) == ("POST", "dispatch"):
            return self._dispatch(namespace, job_id, req)
        if (method, route) == ("GET", "register"):
            # GET /v1/jobs?namespace=&prefix=&meta=: JobListStubs of the namespace ("*": every namespace,
            # structs.AllNamespacesSentinel) whose ID starts with prefix; meta=true adds each job's Meta.
            prefix = (req.query.get("prefix") or [""])[0]
            with_meta = (req.query.get("meta") or ["false"])[0] == "true"
            return 200, [self._stub(job, meta=with_meta) for (ns, job_id), job in sorted(self.state.jobs.items())
                         if namespace in (ns, "*") and job_id.startswith(prefix)]
        if (method, route) == ("GET", "allocation-list"):
            # GET /v1/allocations?namespace=&task_states=: AllocationListStubs of the namespace ("*": every
            # namespace); TaskStates are included unless task_states=false (api-docs/allocations).
            with_states = (req.query.get("task_states") or ["true"])[0] != "false"
            return 200, [alloc if with_states else {k: v for k, v in alloc.items() if k != "TaskStates"}
                         for (ns, job_id) in sorted(self.state.jobs) if namespace in (ns, "*") for alloc in self.state.allocations.get(job_id, [])]
        if (method, route) == ("GET", "members"):
            return 200, self._members()
        if (method, route) == ("GET", "leader"):
            return 200, json.dumps("10.0.0.2:4647")  # the leader's RPC address as a JSON string
        if (method, route) == ("GET", "alloc-stats"):
            return self._alloc_stats(job_id)
        if route in ("node", "node-eligibility", "node-drain"):
            return self._node_answer(method, route, job_id, req)
        job = self.state.jobs.get(key)
        if job is None:
            return 404, "job not found"
        if (method, route) == ("GET", "job"):
            return 200, job
        if (method, route) == ("GET", "evaluations"):
            return 200, self.state.evaluations.get(job_id, [])
        if (method, route) == ("GET", "allocations"):
            return 200, self.state.allocations.get(job_id, [])
        if (method, route) == ("DELETE", "job"):
            purge = (req.query.get("purge") or ["false"])[0] == "true"
            if purge:
                del self.state.jobs[key]
            else:
                job["Stop"] = True
            return 200, {"EvalID": f"eval-stop-{self._next()}", "EvalCreateIndex": self.state.index, "JobModifyIndex": self.state.index}
        return 404, f"no route {method} {req.path}"

    def _node_answer(self, method: str, route: str, node_id: str, req: Recorded) -> tuple[int, Any]:
        """The node endpoints as hashicorp/nomad v1.10.5 serves them: command/agent/node_endpoint.go
        NodeSpecificRequest (:45-66) routes by suffix; ``/eligibility`` and ``/drain`` take PUT or POST only (405
        otherwise, :116 and :152); the body is api.NodeUpdateEligibilityRequest {NodeID, Eligibility} (api/nodes.go:399-403)
        or api.NodeUpdateDrainRequest {NodeID, DrainSpec {Deadline ns, IgnoreSystemJobs}, MarkEligible, Meta}
        (api/nodes.go:76-90, :733-741). nomad/node_endpoint.go checks what the double checks: an eligibility other
        than eligible/ineligible is refused (:789-793), eligible while draining is refused (:809-811), setting the
        same eligibility writes nothing (:822); a drain sets ForceDeadline = now + Deadline (:717-719) and writes
        the node event "Node drain strategy set" (subsystem Drain, :724-727, message :34), and the state store
        marks the node ineligible and keeps Meta in LastDrain (nomad/state/state_store.go:1226-1248, status
        "draining"). Errors of the RPC come back as 500 with the message, as the HTTP server answers them."""
        node = next((n for n in self.nodes if n.node_id == node_id), None)
        if route == "node":
            if method != "GET":
                return 405, "Invalid method"
            if node is None:
                return 404, "node not found"
            return 200, {"ID": node.node_id, "Name": node.name, "NodeClass": node.node_class, "NodePool": node.node_pool,
                         "Datacenter": node.datacenter, "Status": "ready", "SchedulingEligibility": node.eligibility,
                         "Drain": node.drain_strategy is not None, "DrainStrategy": node.drain_strategy, "LastDrain": node.last_drain,
                         "Events": node.events}
        if method not in ("PUT", "POST"):
            return 405, "Invalid method"
        if node is None:
            return 500, "node not found"
        body = req.body or {}
        index = self._next()
        if route == "node-eligibility":
            wanted = body.get("Eligibility")
            if wanted not in ("eligible", "ineligible"):
                return 500, f"invalid scheduling eligibility {wanted!r}"
            if node.drain_strategy is not None and wanted == "eligible":
                return 500, "can not set node's scheduling eligibility to eligible while it is draining"
            if node.eligibility != wanted:
                node.eligibility = wanted
                node.events.append({"Subsystem": "Cluster", "Message": "Node marked as eligible for scheduling" if wanted == "eligible"
                                    else "Node marked as ineligible for scheduling", "CreateIndex": index})
            return 200, {"EvalIDs": None, "EvalCreateIndex": 0, "NodeModifyIndex": index, "Index": index}
        spec = body.get("DrainSpec")
        if spec is not None:
            if not isinstance(spec.get("Deadline", 0), int):
                return 400, "json: cannot unmarshal into Go struct field DrainSpec.Deadline of type time.Duration"
            started = node.drain_strategy is None
            node.drain_strategy = {"Deadline": spec.get("Deadline", 0), "IgnoreSystemJobs": bool(spec.get("IgnoreSystemJobs")),
                                   "ForceDeadline": "deadline" if spec.get("Deadline", 0) > 0 else "0001-01-01T00:00:00Z"}
            node.eligibility = "ineligible"
            if started:
                node.last_drain = {"Status": "draining", "Meta": body.get("Meta") or {}}
                node.events.append({"Subsystem": "Drain", "Message": "Node drain strategy set", "CreateIndex": index})
            elif body.get("Meta"):
                node.last_drain = {**(node.last_drain or {}), "Meta": body["Meta"]}
        return 200, {"EvalIDs": None, "EvalCreateIndex": 0, "NodeModifyIndex": index, "Index": index}

    def _members(self) -> dict[str, Any]:
        """``GET /v1/agent/members`` (command/agent/agent_endpoint.go AgentMembersRequest ->
        Status.Members: structs.ServerMembersResponse)."""
        members = [{"Name": f"nomad-server-{i}.{self.region}", "Addr": f"10.0.0.{i + 2}", "Port": 4648, "Status": "alive",
                    "Tags": {"role": "nomad", "region": self.region, "dc": "dc1", "build": "1.10.5", "revision": "", "vsn": "1",
                             "raft_vsn": "3", "id": server_id, "rpc_addr": f"10.0.0.{i + 2}", "port": "4647"},
                    "ProtocolMin": 1, "ProtocolMax": 5, "ProtocolCur": 2, "DelegateMin": 2, "DelegateMax": 5, "DelegateCur": 4}
                   for i, server_id in enumerate(self.server_ids)]
        return {"ServerName": members[0]["Name"], "ServerRegion": self.region, "ServerDC": "dc1", "Members": members}

    def _token_self(self, sent: str | None) -> tuple[int, Any, bool]:
        """``GET /v1/acl/token/self`` as hashicorp/nomad answers it: command/agent/acl_endpoint.go
        ``aclTokenSelf`` resolves the caller's own secret through the ``ACL.ResolveToken`` RPC, which
        (nomad/acl_endpoint.go) returns ``aclDisabled`` = ``NewErrRPCCoded(400, "ACL support disabled")``
        when the servers run without ACLs (here: no ``acl_token``), a missing token as ``CodedError(404,
        "ACL token not found")``; an RPC-refused token is a 403 "Permission denied" (command/agent/http.go
        ``errCodeFromHandler``). Errors are plain text; the token is the api.ACLToken JSON (api/acl.go)."""
        if not self.acl_token:
            return 400, "ACL support disabled", True
        if sent is None:
            return 404, "ACL token not found", True
        if sent != self.acl_token:
            return 403, "Permission denied", True
        return 200, {"AccessorID": "b780e702-98ce-521f-2e5f-c6b87de05b24", "SecretID": self.acl_token, "Name": "gpufleet dispatcher",
                     "Type": "client", "Policies": ["gpufleet-dispatcher"], "Roles": [], "Global": False,
                     "CreateTime": "2026-12-01T10:00:00Z", "ExpirationTime": None, "CreateIndex": 7, "ModifyIndex": 7}, False

    def _alloc_stats(self, alloc_id: str) -> tuple[int, Any]:
        """AllocResourceUsage of a known allocation (404 "Unknown allocation" otherwise, as the client says)."""
        alloc = next((a for allocs in self.state.allocations.values() for a in allocs if a["ID"] == alloc_id), None)
        if alloc is None:
            return 404, f"Unknown allocation \"{alloc_id}\""

        def value(number: int | None, unit: str, denominator: int | None = None) -> dict[str, Any]:
            out: dict[str, Any] = {"Unit": unit, "Desc": ""}
            if number is None:
                out["StringVal"] = "N/A"
            else:
                out["IntNumeratorVal"] = number
                if denominator is not None:
                    out["IntDenominatorVal"] = denominator
            return out

        node = next((n for n in self.nodes if n.name == alloc.get("NodeName")), None)
        total = node.gpu_memory_mib if node else 40960
        devices = None
        if alloc_id in self.gpu_stats:
            instances = {}
            for i, (util, used) in enumerate(self.gpu_stats[alloc_id]):
                memory = value(used, "MiB", total if used is not None else None)
                instances[f"GPU-{alloc_id}-{i}"] = {"Summary": memory, "Timestamp": "2026-12-03T08:00:00Z",
                                                    "Stats": {"Nested": None, "Attributes": {"GPU utilization": value(util, "%"), "Memory state": memory,
                                                                                             "Power usage": value(None, "W")}}}
            devices = [{"Vendor": "nvidia", "Type": "gpu", "Name": node.gpu_model if node else "NVIDIA A100-SXM4-40GB", "InstanceStats": instances}]
        cpu = {"SystemMode": 1.0, "UserMode": 2.0, "TotalTicks": 3.0, "ThrottledPeriods": 0, "ThrottledTime": 0, "Percent": 1.5, "Measured": ["Percent"]}
        usage = {"MemoryStats": {"RSS": 1 << 30, "Cache": 0, "Swap": 0, "Usage": 1 << 30, "MaxUsage": 1 << 30, "Measured": ["RSS"]}, "CpuStats": cpu, "DeviceStats": devices}
        return 200, {"ResourceUsage": usage, "Tasks": {"train": {"ResourceUsage": usage, "Timestamp": 1_800_000_000_000_000_000, "Pids": None}},
                     "Timestamp": 1_800_000_000_000_000_000}

    def _summary(self, job: dict[str, Any]) -> dict[str, Any]:
        """JobSummary as Nomad keeps it: allocation counts per task group (Queued = not placed yet)."""
        allocations = self.state.allocations.get(job["ID"], [])
        blocked = any(e["Status"] == "blocked" for e in self.state.evaluations.get(job["ID"], []))
        summary = {}
        for group in job.get("TaskGroups") or []:
            counts = {"Queued": 0, "Complete": 0, "Failed": 0, "Running": 0, "Starting": 0, "Lost": 0, "Unknown": 0}
            mine = [a for a in allocations if a["TaskGroup"] == group["Name"]]
            for alloc in mine:
                counts[{"pending": "Starting", "running": "Running", "complete": "Complete", "failed": "Failed", "lost": "Lost", "unknown": "Unknown"}[alloc["ClientStatus"]]] += 1
            if not mine and blocked and not job.get("Stop"):
                counts["Queued"] = group.get("Count", 1)
            summary[group["Name"]] = counts
        return {"JobID": job["ID"], "Namespace": job.get("Namespace", "default"), "Summary": summary, "Children": None, "CreateIndex": 0, "ModifyIndex": 0}

    def _stub(self, job: dict[str, Any], *, meta: bool = False) -> dict[str, Any]:
        """JobListStub (api/jobs.go): status 'dead' once nothing is queued or active."""
        summary = self._summary(job)
        active = sum(c["Queued"] + c["Starting"] + c["Running"] + c["Unknown"] for c in summary["Summary"].values())
        status = "running" if job.get("ParameterizedJob") and not job.get("Stop") else ("pending" if active else "dead")
        if active and any(c["Running"] for c in summary["Summary"].values()):
            status = "running"
        return {"ID": job["ID"], "ParentID": job.get("ParentID", ""), "Name": job.get("Name", job["ID"]), "Namespace": job.get("Namespace", "default"),
                "Datacenters": job.get("Datacenters"), "Type": job.get("Type"), "Priority": job.get("Priority", 50), "Periodic": False,
                "ParameterizedJob": bool(job.get("ParameterizedJob")), "Stop": bool(job.get("Stop")), "Status": status, "StatusDescription": "",
                "JobSummary": summary, "CreateIndex": 0, "ModifyIndex": 0, "JobModifyIndex": 0, "SubmitTime": 0,
                **({"Meta": job["Meta"]} if meta and job.get("Meta") else {})}

    def _dispatch(self, namespace: str, parent_id: str, req: Recorded) -> tuple[int, Any]:
        parent = self.state.jobs.get((namespace, parent_id))
        if parent is None:
            return 404, "parameterized job not found"
        params = parent.get("ParameterizedJob")
        if not params:
            return 400, "Specified job is not a parameterized job"
        meta = (req.body or {}).get("Meta") or {}
        missing = sorted(set(params.get("MetaRequired") or []) - set(meta))
        if missing:
            return 400, f"Dispatch did not provide required meta keys: {missing}"
        unexpected = sorted(set(meta) - set(params.get("MetaRequired") or []) - set(params.get("MetaOptional") or []))
        if unexpected:
            return 400, f"Dispatch included unexpected meta keys: {unexpected}"
        token = (req.query.get("idempotency_token") or [""])[0]
        if token and token in self.state.tokens:
            child_id = self.state.tokens[token]
            evaluation = self.state.evaluations[child_id][0]["ID"]
            return 200, {"DispatchedJobID": child_id, "EvalID": evaluation, "EvalCreateIndex": self.state.index, "JobCreateIndex": self.state.index, "Index": self.state.index}
        n = self._next()
        child_id = f"{parent_id}/dispatch-{1_800_000_000 + n}-{n:08x}"
        child = {**parent, "ID": child_id, "Name": child_id, "ParentID": parent_id, "Dispatched": True, "ParameterizedJob": None, "Meta": {**(parent.get("Meta") or {}), **meta}, "Status": "pending", "DispatchIdempotencyToken": token}
        self.state.jobs[(namespace, child_id)] = child
        if token:
            self.state.tokens[token] = child_id
        node, failed = self.place(child, commit=True)
        eval_id = f"eval-{n:04d}"
        evals = [{"ID": eval_id, "JobID": child_id, "Namespace": namespace, "Status": "complete", "TriggeredBy": "job-register", "Type": "batch", "FailedTGAllocs": failed, "CreateIndex": n}]
        if failed:
            evals.append({"ID": f"eval-{n:04d}-blocked", "JobID": child_id, "Namespace": namespace, "Status": "blocked", "TriggeredBy": "queued-allocs", "Type": "batch", "FailedTGAllocs": failed, "CreateIndex": n + 1})
        self.state.evaluations[child_id] = evals
        self.state.allocations[child_id] = [] if node is None else [{
            "ID": f"alloc-{n:04d}", "EvalID": eval_id, "JobID": child_id, "Namespace": namespace, "TaskGroup": child["TaskGroups"][0]["Name"],
            "NodeID": f"node-{node.name}", "NodeName": node.name, "DesiredStatus": "run", "ClientStatus": "pending", "TaskStates": {}, "CreateIndex": n,
        }]
        return 200, {"DispatchedJobID": child_id, "EvalID": eval_id, "EvalCreateIndex": n, "JobCreateIndex": n, "Index": n}

    def place(self, job: dict[str, Any], *, commit: bool) -> tuple[FakeNode | None, dict[str, Any] | None]:
        """Try each node like Nomad's feasibility and bin-packing stages; metrics on failure."""
        failed: dict[str, Any] = {}
        chosen: FakeNode | None = None
        for group in job["TaskGroups"]:
            metric: dict[str, Any] = {"NodesEvaluated": 0, "NodesFiltered": 0, "NodesInPool": 0, "NodesAvailable": {}, "ClassFiltered": {}, "ConstraintFiltered": {}, "NodesExhausted": 0, "ClassExhausted": {}, "DimensionExhausted": {}, "QuotaExhausted": None, "ScoreMetaData": None, "AllocationTime": 1000, "CoalescedFailures": 0}
            devices = [d for task in group["Tasks"] for d in (task.get("Resources") or {}).get("Devices") or []]
            wanted = sum(d.get("Count", 1) for d in devices)
            pool = [n for n in self.nodes if n.node_pool == job.get("NodePool", "default") and n.datacenter in job["Datacenters"]]
            metric["NodesInPool"] = len(pool)
            for node in pool:
                metric["NodesEvaluated"] += 1
                metric["NodesAvailable"][node.datacenter] = metric["NodesAvailable"].get(node.datacenter, 0) + 1
                bad = next((c for c in group.get("Constraints") or [] if not _node_ok(node, c)), None)
                reason = f"{bad['LTarget']} {bad['Operand']} {bad['RTarget']}" if bad else None
                if reason is None and devices and (node.gpus < wanted or not all(_device_ok(node, c) for d in devices for c in d.get("Constraints") or [])):
                    reason = "missing devices"
                if reason is not None:
                    metric["NodesFiltered"] += 1
                    metric["ConstraintFiltered"][reason] = metric["ConstraintFiltered"].get(reason, 0) + 1
                    metric["ClassFiltered"][node.node_class] = metric["ClassFiltered"].get(node.node_class, 0) + 1
                    continue
                if node.gpus - node.gpus_used < wanted:
                    metric["NodesExhausted"] += 1
                    metric["DimensionExhausted"][DEVICES_EXHAUSTED] = metric["DimensionExhausted"].get(DEVICES_EXHAUSTED, 0) + 1
                    metric["ClassExhausted"][node.node_class] = metric["ClassExhausted"].get(node.node_class, 0) + 1
                    continue
                chosen = node
                break
            if chosen is None:
                failed[group["Name"]] = metric
            elif commit:
                chosen.gpus_used += wanted
        return chosen, failed or None


def _route(path: str) -> tuple[str, str]:
    """(route, job id) the way Nomad's HTTP server splits /v1/job/<id>/<suffix>."""
    if path == "/v1/acl/token/self":
        return "acl-token-self", ""
    if path.startswith("/v1/client/fs/logs/"):
        return "fs-logs", path.removeprefix("/v1/client/fs/logs/")
    if path == "/v1/jobs":
        return "register", ""
    if path == "/v1/allocations":
        return "allocation-list", ""
    if path == "/v1/agent/members":
        return "members", ""
    if path == "/v1/status/leader":
        return "leader", ""
    if path.startswith("/v1/client/allocation/") and path.endswith("/stats"):
        return "alloc-stats", path.removeprefix("/v1/client/allocation/").removesuffix("/stats")
    if path.startswith("/v1/node/"):
        rest = path.removeprefix("/v1/node/")
        for suffix in ("eligibility", "drain"):
            if rest.endswith(f"/{suffix}"):
                return f"node-{suffix}", rest[: -len(suffix) - 1]
        return "node", rest
    rest = path.removeprefix("/v1/job/")
    for suffix in ("plan", "dispatch", "evaluations", "allocations"):
        if rest.endswith(f"/{suffix}"):
            return suffix, rest[: -len(suffix) - 1]
    return "job", rest
