"""A local Kubernetes API double (plus the part of Kueue gpufleet reads) for the GKE job client tests.

No Kubernetes API server can run on these machines (no binary is installed or downloadable),
so the official ``kubernetes`` client is tested against this: an ``http.server`` on 127.0.0.1
in a thread of the test process, speaking the documented JSON of the calls gpufleet makes
(create/get/delete/watch batch/v1 Jobs, create/get Secrets and Services, list Kueue v1beta2
Workloads). Like the API server it answers 201 on create, 409 AlreadyExists on a second
create of a name, 404 NotFound, 401 without the bearer token, ``metav1.Status`` bodies on
errors, and 422 Invalid for an object that fails the vendored upstream schemas
(``jobs/k8s/openapi``: Kubernetes OpenAPI, strict like the server's strict field validation) or
a few of the Job validation rules of kubernetes ``pkg/apis/batch/validation``.

Lists follow the API server's chunking (kubernetes/website ``api-concepts.md`` "Retrieving large
results sets in chunks"; apimachinery ``metav1.ListMeta``; apiserver ``storage/etcd3/store.go``):
``limit`` returns at most that many items and ``metadata.continue`` when more remain; a
continuation is served from the snapshot at the first page's resourceVersion (the list's
``resourceVersion`` stays constant across pages; objects created later are not shown); the token
is opaque to clients (here, like etcd3's ``encodeContinue``, base64 JSON ``{"v": "meta.k8s.io/v1",
"rv": <int>, "start": "<next key>"}``); ``remainingItemCount`` is set only without label or field
selectors; after ``compact()`` an older token answers 410 ``Expired`` with etcd3's message and an
inconsistent continue token in the Status's ``metadata``. Label selectors take the equality
(``k=v``), existence (``k``) and set-based (``k in (a,b)``) forms of apimachinery
``labels.Parse``. ``listed`` counts the items each list answer carried per (resource, namespace):
what a client had to decode; ``sent`` the body bytes per request path a client took before it
closed the connection. ``GET /api/v1/namespaces/<name>`` answers a core/v1 Namespace
(``kube-system`` always exists; its uid, ``cluster_uid``, is this API server's cluster identity,
random per double like ``ObjectMeta.UID``).

Kueue's part: a created Job carrying ``kueue.x-k8s.io/queue-name`` gets a Workload owned by it
(label ``kueue.x-k8s.io/job-uid``), and the test drives it through Kueue's condition types
(QuotaReserved, Admitted, Evicted, Preempted, Finished; ``apis/kueue/v1beta2/workload_types.go``)
while every Workload it stores is validated against Kueue's CRD schema. Owner references are
honoured on delete (Background: dependents go at once; Foreground: the owner stays with a
deletionTimestamp until ``collect()``). Faults: a status for the next N matching requests,
optionally after the request took effect (a lost response).

It sits in ``tests/jobs/`` rather than ``tests/jobs/k8s/`` because ``tests/jobs/conftest.py``
(whose fixtures the neutral runner tests use) and the control-plane tests (``tests/experiments``)
import it too; moving it would only lengthen their imports.

Nodes (for the GPU health checker, constructs_lib/gpu_health_check.py): ``add_node`` stores one;
``GET /api/v1/nodes/<name>`` returns it and ``PATCH`` applies a JSON merge patch (RFC 7386; only
``application/merge-patch+json``, else 415 as the API server answers an unsupported patch type), with
optimistic concurrency as the server does it: a ``metadata.resourceVersion`` in the patch that is not
the stored one is refused with 409 Conflict ("the object has been modified; please apply your changes to
the latest version and try again", apiserver registry/generic/registry/store.go via storage errors).
"""

from __future__ import annotations

import base64
import json
import re
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from jobs.k8s.schemas import errors as schema_errors

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
KINDS = {("batch/v1", "jobs"): "Job", ("v1", "secrets"): "Secret", ("v1", "services"): "Service", ("v1", "pods"): "Pod",
         ("kueue.x-k8s.io/v1beta2", "workloads"): "Workload", ("kueue.x-k8s.io/v1beta2", "localqueues"): "LocalQueue"}


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_body(code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code}
    if details:
        body["details"] = details
    return body


@dataclass
class Fault:
    method: str
    path_contains: str
    status: int
    times: int = 1
    after_commit: bool = False


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, list[str]]
    status: int
    body: Any


@dataclass
class _Store:
    objects: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)  # (resource, ns, name)
    version: int = 0
    events: list[tuple[int, str, str, dict[str, Any]]] = field(default_factory=list)  # (rv, resource, type, object)
    # Snapshots for continued lists: (rv, resource, namespace) -> the collection's objects then, by name.
    snapshots: dict[tuple[int, str, str], list[dict[str, Any]]] = field(default_factory=dict)
    compacted: int = 0  # etcd's compact revision: continue tokens of an older resourceVersion are expired


CONTINUE_EXPIRED = ("The provided continue parameter is too old to display a consistent list result. You can start a new list without "
                    "the continue parameter, or use the continue token in this response to retrieve the remainder of the results. "
                    "Continuing with the provided token results in an inconsistent list - objects that were created, modified, or "
                    "deleted between the time the first chunk was returned and now may show up in the list.")
_SET_TERM = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _encode_continue(rv: int, start: str) -> str:
    return base64.b64encode(json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": start}).encode()).decode()


def _decode_continue(token: str) -> tuple[int, str] | None:
    try:
        data = json.loads(base64.b64decode(token, validate=True))
        return int(data["rv"]), str(data["start"])
    except (ValueError, KeyError, TypeError):
        return None


def _split_terms(selector: str) -> list[str]:
    """Split a label selector at the commas outside ``( )`` (``a in (x,y),b`` is two terms)."""
    terms, depth, current = [], 0, ""
    for char in selector:
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += char
    return [t for t in (*terms, current) if t.strip()]


NODES_PATH = "/api/v1/nodes/"


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge key by key, null deletes, anything else (lists too) replaces."""
    if not isinstance(patch, dict):
        return json.loads(json.dumps(patch))
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def job_validation(job: dict[str, Any]) -> list[str]:
    """A few rules of kubernetes pkg/apis/batch/validation/validation.go the schema cannot express."""
    spec, found = job.get("spec", {}), []
    pod = spec.get("template", {}).get("spec", {})
    if pod.get("restartPolicy") not in ("Never", "OnFailure"):
        found.append("spec.template.spec.restartPolicy: Unsupported value: only \"Never\" or \"OnFailure\"")
    if spec.get("podFailurePolicy") and pod.get("restartPolicy") != "Never":
        found.append("spec.template.spec.restartPolicy: Invalid value: only \"Never\" is supported when podFailurePolicy is specified")
    if spec.get("podFailurePolicy") and spec.get("podReplacementPolicy") not in (None, "Failed"):
        found.append("spec.podReplacementPolicy: Not supported: must be Failed when podFailurePolicy is used")
    if spec.get("completionMode") == "Indexed" and spec.get("completions") is None:
        found.append("spec.completions: Required value: when completion mode is Indexed")
    if len(job.get("metadata", {}).get("name", "")) > 63:
        found.append("metadata.name: Invalid value: must be no more than 63 characters")
    return found


class K8sDouble:
    def __init__(self, *, namespaces: dict[str, set[str]], token: str = "k8s-double-token") -> None:
        """``namespaces``: namespace -> names of its Kueue LocalQueues."""
        self.namespaces = namespaces
        self.token = token
        self.cluster_uid = str(uuid.uuid4())  # the kube-system Namespace's uid: this cluster's identity
        self.store = _Store()
        # (namespace, pod, container) -> [(time written, line)]: what the container printed
        self.pod_logs: dict[tuple[str, str, str], list[tuple[float, bytes]]] = {}
        self.requests: list[Recorded] = []
        self.faults: list[Fault] = []
        self.listed: Counter[tuple[str, str]] = Counter()
        # request path -> body bytes the double wrote before the client stopped reading
        self.sent: Counter[str] = Counter()
        self._lock = threading.Condition()
        self._server: ThreadingHTTPServer | None = None

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self) -> K8sDouble:
        double = self

        class Handler(BaseHTTPRequestHandler):
            # HTTP/1.1 so a watch can stream chunked lines, as the API server does.
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                double._handle(self, "GET")

            def do_POST(self) -> None:
                double._handle(self, "POST")

            def do_DELETE(self) -> None:
                double._handle(self, "DELETE")

            def do_PATCH(self) -> None:
                double._handle(self, "PATCH")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            with self._lock:
                self._lock.notify_all()
            self._server.shutdown()
            self._server.server_close()

    @property
    def address(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def kubeconfig(self, path: Any) -> Any:
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "double",
            "clusters": [{"name": "double", "cluster": {"server": self.address}}],
            "users": [{"name": "u", "user": {"token": self.token}}],
            "contexts": [{"name": "double", "context": {"cluster": "double", "user": "u"}}],
        }))
        return path

    def fail_next(self, method: str, path_contains: str, status: int, *, times: int = 1, after_commit: bool = False) -> None:
        self.faults.append(Fault(method, path_contains, status, times, after_commit))

    # ---- HTTP ------------------------------------------------------------------------------
    def _send(self, handler: BaseHTTPRequestHandler, code: int, body: Any) -> int:
        """Write the answer in pieces, as a socket takes it; returns the body bytes the client
        took before it closed the connection (a client that drops an answer unread takes less)."""
        data = json.dumps(body).encode()
        handler.send_response(code)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.send_header("Connection", "close")
        handler.end_headers()
        written = 0
        try:
            for start in range(0, len(data), 64 * 1024):
                handler.wfile.write(data[start:start + 64 * 1024])
                written += len(data[start:start + 64 * 1024])
        except (BrokenPipeError, ConnectionResetError):
            pass
        return written

    def _fault(self, method: str, path: str) -> Fault | None:
        for fault in self.faults:
            if fault.method == method and fault.path_contains in path and fault.times > 0:
                fault.times -= 1
                return fault
        return None

    def _handle(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        url = urlsplit(handler.path)
        query = parse_qs(url.query)
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else None
        handler.close_connection = True
        if handler.headers.get("Authorization") != f"Bearer {self.token}":
            code, answer = 401, status_body(401, "Unauthorized", "Unauthorized")
        elif url.path.endswith("/log") and "/pods/" in url.path:
            self.requests.append(Recorded(method, url.path, query, 200, body))
            return self._pod_log(handler, url.path, query)
        elif query.get("watch", [""])[0].lower() in ("true", "1"):
            self.requests.append(Recorded(method, url.path, query, 200, body))
            return self._watch(handler, url.path, query)
        elif url.path.startswith(NODES_PATH):
            code, answer = self._node(method, url.path.removeprefix(NODES_PATH), body, handler.headers.get("Content-Type"))
        else:
            fault = self._fault(method, url.path)
            if fault is not None and not fault.after_commit:
                code, answer = fault.status, status_body(fault.status, "InternalError", f"injected fault {fault.status}")
            else:
                code, answer = self._route(method, url.path, query, body)
                if fault is not None:
                    code, answer = fault.status, status_body(fault.status, "InternalError", f"injected fault {fault.status} after commit")
        if isinstance(body, dict) and body.get("kind") == "Secret":
            body = {**body, "data": {key: "<redacted>" for key in body.get("data") or {}}}
        self.requests.append(Recorded(method, url.path, query, code, body))
        written = self._send(handler, code, answer)
        with self._lock:
            self.sent[url.path] += written

    def _parse(self, path: str) -> tuple[str, str, str | None, str | None] | None:
        """'/apis/batch/v1/namespaces/ns/jobs/x' -> ('batch/v1', 'jobs', 'ns', 'x')."""
        parts = path.strip("/").split("/")
        if parts[:1] == ["api"] and len(parts) >= 5 and parts[2] == "namespaces":
            group_version, rest = parts[1], parts[3:]
        elif parts[:1] == ["apis"] and len(parts) >= 6 and parts[3] == "namespaces":
            group_version, rest = f"{parts[1]}/{parts[2]}", parts[4:]
        else:
            return None
        return group_version, rest[1], rest[0], rest[2] if len(rest) > 2 else None

    def _route(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        if method == "GET" and (namespace := re.fullmatch(r"/api/v1/namespaces/([^/]+)", path)):
            return self._namespace(namespace.group(1))
        if method == "GET" and path in ("/version", "/version/"):  # version.Info (k8s.io/apimachinery pkg/version/types.go)
            return 200, {"major": "1", "minor": "33", "gitVersion": "v1.33.2-gke.1000", "gitCommit": "", "gitTreeState": "clean",
                         "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24", "compiler": "gc", "platform": "linux/amd64"}
        parsed = self._parse(path)
        if parsed is None or (parsed[0], parsed[1]) not in KINDS:
            return 404, status_body(404, "NotFound", f"the server could not find the requested resource ({path})")
        group_version, resource, namespace, name = parsed
        if namespace not in self.namespaces:
            return 404, status_body(404, "NotFound", f'namespaces "{namespace}" not found')
        if resource == "localqueues":
            if method == "GET" and name in self.namespaces[namespace]:
                return 200, {"apiVersion": group_version, "kind": "LocalQueue", "metadata": {"name": name, "namespace": namespace},
                             "spec": {"clusterQueue": namespace}}
            return 404, status_body(404, "NotFound", f'localqueues.kueue.x-k8s.io "{name}" not found')
        with self._lock:
            if method == "POST" and name is None:
                return self._create(group_version, resource, namespace, body, dry_run=query.get("dryRun") == ["All"])
            if method == "GET" and name is None:
                return self._list(group_version, resource, namespace, query)
            key = (resource, namespace, name or "")
            obj = self.store.objects.get(key)
            if obj is None:
                return 404, status_body(404, "NotFound", f'{resource} "{name}" not found', {"name": name, "kind": resource})
            if method == "GET":
                return 200, obj
            if method == "DELETE":
                # DeleteOptions.preconditions.uid: the storage layer refuses with 409 Conflict (apiserver
                # storage checkPreconditions: "Precondition failed: UID in precondition: %v, UID in object meta: %v").
                want = ((body or {}).get("preconditions") or {}).get("uid")
                if want and want != obj["metadata"]["uid"]:
                    return 409, status_body(409, "Conflict", f'Operation cannot be fulfilled on {resource} "{name}": Precondition failed: '
                                            f'UID in precondition: {want}, UID in object meta: {obj["metadata"]["uid"]}', {"name": name, "kind": resource})
                return self._delete(key, (body or {}).get("propagationPolicy") or query.get("propagationPolicy", ["Background"])[0])
        return 405, status_body(405, "MethodNotAllowed", "method not allowed")

    def _namespace(self, name: str) -> tuple[int, Any]:
        """``GET /api/v1/namespaces/<name>`` (core/v1 Namespace); kube-system always exists."""
        if name != "kube-system" and name not in self.namespaces:
            return 404, status_body(404, "NotFound", f'namespaces "{name}" not found', {"name": name, "kind": "namespaces"})
        uid = self.cluster_uid if name == "kube-system" else str(uuid.uuid5(uuid.UUID(self.cluster_uid), name))
        return 200, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "uid": uid, "resourceVersion": "1"},
                     "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}

    # ---- nodes -----------------------------------------------------------------------------
    def add_node(self, node: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            stored = json.loads(json.dumps(node))
            stored.setdefault("apiVersion", "v1")
            stored.setdefault("kind", "Node")
            stored["metadata"].setdefault("uid", str(uuid.uuid4()))
            self._bump("nodes", "ADDED", stored)
            self.store.objects[("nodes", "", stored["metadata"]["name"])] = stored
            return stored

    def node(self, name: str) -> dict[str, Any]:
        return self.store.objects[("nodes", "", name)]

    def _node(self, method: str, name: str, patch: Any, content_type: str | None) -> tuple[int, Any]:
        with self._lock:
            node = self.store.objects.get(("nodes", "", name))
            if node is None:
                return 404, status_body(404, "NotFound", f'nodes "{name}" not found', {"name": name, "kind": "nodes"})
            if method == "GET":
                return 200, node
            if method != "PATCH":
                return 405, status_body(405, "MethodNotAllowed", "method not allowed")
            if content_type != "application/merge-patch+json":
                return 415, status_body(415, "UnsupportedMediaType", f"the body of the request was in an unknown format - accepted media types include:"
                                        " application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml")
            wanted = ((patch or {}).get("metadata") or {}).get("resourceVersion")
            if wanted is not None and wanted != node["metadata"]["resourceVersion"]:
                return 409, status_body(409, "Conflict", f'Operation cannot be fulfilled on nodes "{name}": the object has been modified;'
                                        " please apply your changes to the latest version and try again", {"name": name, "kind": "nodes"})
            merged = merge_patch(node, patch)
            self._bump("nodes", "MODIFIED", merged)
            self.store.objects[("nodes", "", name)] = merged
            return 200, merged

    # ---- objects ---------------------------------------------------------------------------
    def _bump(self, resource: str, kind: str, obj: dict[str, Any]) -> None:
        self.store.version += 1
        obj["metadata"]["resourceVersion"] = str(self.store.version)
        self.store.events.append((self.store.version, resource, kind, json.loads(json.dumps(obj))))
        self._lock.notify_all()

    def _create(self, group_version: str, resource: str, namespace: str, obj: Any, *, dry_run: bool = False) -> tuple[int, Any]:
        kind = KINDS[(group_version, resource)]
        if not isinstance(obj, dict) or obj.get("kind") != kind or obj.get("apiVersion") != group_version:
            return 400, status_body(400, "BadRequest", f"the body is not a {group_version} {kind}")
        problems = schema_errors(obj) + (job_validation(obj) if kind == "Job" else [])
        if kind == "Secret":
            for key, value in (obj.get("data") or {}).items():
                try:
                    base64.b64decode(value, validate=True)
                except ValueError:
                    problems.append(f"data[{key}]: Invalid value: illegal base64 data")
        meta = obj.setdefault("metadata", {})
        if meta.get("namespace", namespace) != namespace:
            problems.append("metadata.namespace: Invalid value: the namespace of the object does not match the namespace on the request")
        if problems:
            causes = [{"message": p} for p in problems]
            return 422, status_body(422, "Invalid", f'{kind} "{meta.get("name")}" is invalid: {"; ".join(problems)}', {"name": meta.get("name"), "kind": resource, "causes": causes})
        key = (resource, namespace, meta["name"])
        if key in self.store.objects:
            return 409, status_body(409, "AlreadyExists", f'{resource} "{meta["name"]}" already exists', {"name": meta["name"], "kind": resource})
        if dry_run:
            return 201, obj
        meta.update({"namespace": namespace, "uid": str(uuid.uuid4()), "creationTimestamp": now(), "generation": 1})
        if kind == "Job":
            obj["status"] = {}
        self.store.objects[key] = obj
        self._bump(resource, "ADDED", obj)
        if kind == "Job" and QUEUE_LABEL in (meta.get("labels") or {}):
            self._create_workload(obj)
        return 201, obj

    def _create_workload(self, job: dict[str, Any]) -> None:
        """What Kueue's job reconciler builds from a queue-labelled Job (jobframework constructWorkload)."""
        meta, spec = job["metadata"], job["spec"]
        queue = meta["labels"][QUEUE_LABEL]
        workload = {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {"name": f"job-{meta['name']}-{meta['uid'][:5]}", "namespace": meta["namespace"],
                         "labels": {JOB_UID_LABEL: meta["uid"]}, "resourceVersion": "0", "uid": str(uuid.uuid4()),
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"], "uid": meta["uid"],
                                              "controller": True, "blockOwnerDeletion": True}]},
            "spec": {"queueName": queue, "active": True,
                     "podSets": [{"name": "main", "count": spec.get("parallelism", 1), "template": spec["template"]}]},
            "status": {"conditions": []},
        }
        if queue not in self.namespaces[meta["namespace"]]:
            workload["status"]["conditions"].append(self._condition("QuotaReserved", "False", "Inadmissible", f"LocalQueue {queue} doesn't exist"))
        self._store_workload(workload)

    def _store_workload(self, workload: dict[str, Any]) -> None:
        problems = schema_errors(workload)
        assert not problems, f"the double built a Workload Kueue's CRD refuses: {problems}"
        key = ("workloads", workload["metadata"]["namespace"], workload["metadata"]["name"])
        self.store.objects[key] = workload
        self._bump("workloads", "MODIFIED", workload)

    def _list(self, group_version: str, resource: str, namespace: str, query: dict[str, list[str]]) -> tuple[int, Any]:
        kind = f"{KINDS[(group_version, resource)]}List"
        limit = int(query.get("limit", ["0"])[0] or 0)
        token = query.get("continue", [""])[0]
        if token:
            decoded = _decode_continue(token)
            if decoded is None:
                return 400, status_body(400, "BadRequest", "continue key is not valid: illegal base64 data")
            rv, start = decoded
            snapshot = self.store.snapshots.get((rv, resource, namespace))
            if rv < self.store.compacted or snapshot is None:
                # etcd3 store: the snapshot is compacted away; the Status carries a token that continues
                # from the current state (an inconsistent remainder), as the API server's does.
                body = status_body(410, "Expired", CONTINUE_EXPIRED)
                body["metadata"] = {"continue": _encode_continue(self.store.version, start)}
                self.store.snapshots.setdefault((self.store.version, resource, namespace), json.loads(json.dumps(self._collection(resource, namespace))))
                return 410, body
        else:
            rv, start = self.store.version, ""
            snapshot = self._collection(resource, namespace)
        matching = [o for o in snapshot if o["metadata"]["name"] >= start and self._matches(o, query)]
        page = matching[:limit] if limit > 0 else matching
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if limit > 0 and len(matching) > limit:
            if (rv, resource, namespace) not in self.store.snapshots:
                self.store.snapshots[(rv, resource, namespace)] = json.loads(json.dumps(snapshot))
            meta["continue"] = _encode_continue(rv, page[-1]["metadata"]["name"] + "\x00")
            if not query.get("labelSelector") and not query.get("fieldSelector"):
                meta["remainingItemCount"] = len(matching) - limit
        self.listed[(resource, namespace)] += len(page)
        return 200, {"apiVersion": group_version, "kind": kind, "metadata": meta, "items": page}

    def _collection(self, resource: str, namespace: str) -> list[dict[str, Any]]:
        """Every object of ``resource`` in ``namespace`` now, in key (name) order."""
        return [o for (r, ns, _), o in sorted(self.store.objects.items()) if r == resource and ns == namespace]

    def compact(self) -> None:
        """Writes happened and etcd compacted up to now: every continue token issued so far expires (410 Expired)."""
        with self._lock:
            self.store.version += 1
            self.store.compacted = self.store.version
            self.store.snapshots.clear()

    @staticmethod
    def _matches(obj: dict[str, Any], query: dict[str, list[str]]) -> bool:
        labels = obj["metadata"].get("labels") or {}
        for selector in query.get("labelSelector", []):
            for term in _split_terms(selector):
                if match := _SET_TERM.match(term):
                    key, operator, values = match.group(1), match.group(2), {v.strip() for v in match.group(3).split(",") if v.strip()}
                    if (operator == "in") != (key in labels and labels[key] in values):
                        return False
                    continue
                key, equals, value = term.strip().partition("=")
                if (key not in labels) if not equals else (labels.get(key) != value.lstrip("=")):  # "key" alone: the label exists
                    return False
        for selector in query.get("fieldSelector", []):
            key, _, value = selector.partition("=")
            if key == "metadata.name" and obj["metadata"]["name"] != value:
                return False
        return True

    def _delete(self, key: tuple[str, str, str], propagation: str) -> tuple[int, Any]:
        obj = self.store.objects[key]
        if propagation == "Foreground":
            obj["metadata"]["deletionTimestamp"] = now()
            obj["metadata"]["finalizers"] = ["foregroundDeletion"]
            self._bump(key[0], "MODIFIED", obj)
            return 200, obj
        self._remove(key)
        return 200, status_body(200, "", "") | {"status": "Success", "details": {"name": key[2], "kind": key[0], "uid": obj["metadata"]["uid"]}}

    def _remove(self, key: tuple[str, str, str]) -> None:
        obj = self.store.objects.pop(key)
        self._bump(key[0], "DELETED", obj)
        uid = obj["metadata"]["uid"]
        for dep_key, dep in list(self.store.objects.items()):
            if any(ref.get("uid") == uid for ref in dep["metadata"].get("ownerReferences") or []):
                self._remove(dep_key)

    def collect(self) -> None:
        """The garbage collector finishing foreground deletions (all pods gone)."""
        with self._lock:
            for key, obj in list(self.store.objects.items()):
                if obj["metadata"].get("deletionTimestamp") and key in self.store.objects:
                    self._remove(key)

    # ---- watch -----------------------------------------------------------------------------
    def _watch(self, handler: BaseHTTPRequestHandler, path: str, query: dict[str, list[str]]) -> None:
        parsed = self._parse(path)
        assert parsed is not None
        _, resource, namespace, _ = parsed
        timeout = float(query.get("timeoutSeconds", ["5"])[0])
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.send_header("Connection", "close")
        handler.end_headers()

        def send(kind: str, obj: dict[str, Any]) -> None:
            line = json.dumps({"type": kind, "object": obj}).encode() + b"\n"
            handler.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
            handler.wfile.flush()

        deadline = datetime.now(UTC).timestamp() + timeout
        with self._lock:
            since = self.store.version
            initial = [o for (r, ns, _), o in sorted(self.store.objects.items()) if r == resource and ns == namespace and self._matches(o, query)]
        try:
            for obj in initial:
                send("ADDED", obj)
            while True:
                with self._lock:
                    left = deadline - datetime.now(UTC).timestamp()
                    if left <= 0 or self._server is None:
                        break
                    self._lock.wait(timeout=min(left, 0.5))
                    fresh = [(rv, kind, o) for rv, r, kind, o in self.store.events if rv > since and r == resource
                             and o["metadata"].get("namespace") == namespace and self._matches(o, query)]
                    since = self.store.version
                for _, kind, obj in fresh:
                    send(kind, obj)
            handler.wfile.write(b"0\r\n\r\n")
            handler.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            return

    # ---- pod logs ---------------------------------------------------------------------------
    # Pods and their logs (the Job controller's part, driven by the test): ``admit`` makes one pod per
    # rank, named ``<job>-<index>-<suffix>``, labelled ``batch.kubernetes.io/job-name`` (and the legacy
    # ``job-name``) and, for an Indexed Job, carrying ``batch.kubernetes.io/job-completion-index`` as
    # annotation and label (k8s.io/api batch/v1 types.go), owned by the Job (so they go with it).
    # ``GET /api/v1/namespaces/{ns}/pods/{name}/log`` answers text/plain as the API server does, with
    # ``container``, ``follow``, ``tailLines``, ``sinceSeconds`` and ``previous``: 404 NotFound for a
    # pod that is gone; 400 BadRequest "container <c> is not valid for pod <p>" (pkg/registry/core/pod/
    # strategy.go) or, from the kubelet, "container "<c>" in pod "<p>" is waiting to start: <reason>" and
    # "previous terminated container "<c>" in pod "<p>" not found"; a follow streams chunked and ends
    # when the container has terminated.
    def _pod_log(self, handler: BaseHTTPRequestHandler, path: str, query: dict[str, list[str]]) -> None:
        parts = path.strip("/").split("/")  # api v1 namespaces <ns> pods <name> log
        namespace, name = parts[3], parts[5]
        arg = lambda key: (query.get(key) or [""])[0]  # noqa: E731
        with self._lock:
            pod = self.store.objects.get(("pods", namespace, name))
            if pod is None:
                return self._send(handler, 404, status_body(404, "NotFound", f'pods "{name}" not found', {"name": name, "kind": "pods"}))
            names = [c["name"] for c in pod["spec"].get("containers", [])]
            container = arg("container") or (names[0] if len(names) == 1 else "")
            if not container:
                return self._send(handler, 400, status_body(400, "BadRequest", f"a container name must be specified for pod {name}, choose one of: [{' '.join(names)}]"))
            if container not in names + [c["name"] for c in pod["spec"].get("initContainers", [])]:
                return self._send(handler, 400, status_body(400, "BadRequest", f"container {container} is not valid for pod {name}"))
            state = self._container_state(pod, container)
            if "waiting" in state:
                reason = state["waiting"].get("reason", "ContainerCreating")
                return self._send(handler, 400, status_body(400, "BadRequest", f'container "{container}" in pod "{name}" is waiting to start: {reason}'))
            if arg("previous").lower() in ("true", "1"):
                return self._send(handler, 400, status_body(400, "BadRequest", f'previous terminated container "{container}" in pod "{name}" not found'))
            key = (namespace, name, container)
            lines = list(self.pod_logs.get(key, []))
            sent = len(lines)
        if arg("sinceSeconds"):
            lines = [(at, line) for at, line in lines if at >= time.time() - int(arg("sinceSeconds"))]
        if arg("tailLines"):
            lines = lines[len(lines) - min(len(lines), int(arg("tailLines"))):]
        body = b"".join(line for _, line in lines)
        handler.close_connection = True
        if arg("follow").lower() not in ("true", "1"):
            handler.send_response(200)
            handler.send_header("Content-Type", "text/plain")
            handler.send_header("Content-Length", str(len(body)))
            handler.send_header("Connection", "close")
            handler.end_headers()
            handler.wfile.write(body)
            return None
        handler.send_response(200)
        handler.send_header("Content-Type", "text/plain")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.send_header("Connection", "close")
        handler.end_headers()

        def send(data: bytes) -> None:
            if data:
                handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                handler.wfile.flush()

        try:
            send(body)
            while True:
                with self._lock:
                    self._lock.wait(timeout=0.2)
                    pod = self.store.objects.get(("pods", namespace, name))
                    fresh = self.pod_logs.get(key, [])[sent:]
                    sent += len(fresh)
                    over = pod is None or self._server is None or "terminated" in self._container_state(pod, container)
                send(b"".join(line for _, line in fresh))
                if over:
                    break
            handler.wfile.write(b"0\r\n\r\n")
            handler.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            return None
        return None

    @staticmethod
    def _container_state(pod: dict[str, Any], container: str) -> dict[str, Any]:
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        return next((c.get("state") or {} for c in statuses if c["name"] == container), {"waiting": {"reason": "ContainerCreating"}})

    def pods(self, namespace: str, run: str) -> dict[int, str]:
        """Rank -> name of the run's pods."""
        return {int((o["metadata"].get("annotations") or {}).get(COMPLETION_INDEX, "0")): o["metadata"]["name"]
                for (r, ns, _), o in sorted(self.store.objects.items()) if r == "pods" and ns == namespace
                and o["metadata"]["labels"].get(JOB_NAME_LABEL) == run}

    def write_pod_log(self, namespace: str, run: str, rank: int, text: str, container: str = "train") -> None:
        """Rank ``rank`` of the run printing ``text``."""
        with self._lock:
            pod = self.pods(namespace, run)[rank]
            self.pod_logs.setdefault((namespace, pod, container), []).extend((time.time(), line) for line in text.encode().splitlines(keepends=True))
            self._lock.notify_all()

    def _make_pods(self, job: dict[str, Any]) -> None:
        """What the Job controller creates for an admitted (unsuspended) Job: one pod per index."""
        meta, spec = job["metadata"], job["spec"]
        template, indexed = spec["template"], spec.get("completionMode") == "Indexed"
        for index in range(spec.get("parallelism", 1)):
            labels = {**(template["metadata"].get("labels") or {}), JOB_NAME_LABEL: meta["name"], "job-name": meta["name"],
                      "batch.kubernetes.io/controller-uid": meta["uid"], "controller-uid": meta["uid"]}
            annotations = dict(template["metadata"].get("annotations") or {})
            if indexed:
                labels[COMPLETION_INDEX] = annotations[COMPLETION_INDEX] = str(index)
            name = f"{meta['name']}-{index}-{uuid.uuid4().hex[:5]}" if indexed else f"{meta['name']}-{uuid.uuid4().hex[:5]}"
            pod = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": name, "namespace": meta["namespace"], "uid": str(uuid.uuid4()), "labels": labels, "annotations": annotations,
                                "creationTimestamp": now(), "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"],
                                                                                 "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}]},
                   "spec": {**template["spec"], "nodeName": f"gke-node-{index}"},
                   "status": {"phase": "Pending", "containerStatuses": [{"name": c["name"], "ready": False, "restartCount": 0,
                                                                          "state": {"waiting": {"reason": "ContainerCreating"}}}
                                                                         for c in template["spec"].get("containers", [])]}}
            self.store.objects[("pods", meta["namespace"], name)] = pod
            self._bump("pods", "ADDED", pod)

    def _set_pods(self, namespace: str, run: str, count: int | None, phase: str, state: dict[str, Any]) -> None:
        for rank, name in sorted(self.pods(namespace, run).items()):
            if count is not None and rank >= count:
                continue
            pod = self.store.objects[("pods", namespace, name)]
            pod["status"]["phase"] = phase
            for status in pod["status"]["containerStatuses"]:
                status.update({"state": json.loads(json.dumps(state)), "ready": phase == "Running"})
            self._bump("pods", "MODIFIED", pod)

    def remove_job(self, namespace: str, name: str) -> None:
        """The TTL controller deleting a finished Job (ttlSecondsAfterFinished): its pods and logs go with it."""
        with self._lock:
            self._remove(("jobs", namespace, name))

    # ---- Kueue and the Job controller, driven by the test ------------------------------------
    @staticmethod
    def _condition(kind: str, status: str, reason: str, message: str) -> dict[str, Any]:
        return {"type": kind, "status": status, "reason": reason, "message": message, "lastTransitionTime": now(), "observedGeneration": 1}

    def job(self, namespace: str, name: str) -> dict[str, Any]:
        return self.store.objects[("jobs", namespace, name)]

    def workload(self, namespace: str, name: str) -> dict[str, Any]:
        uid = self.job(namespace, name)["metadata"]["uid"]
        return next(o for (r, ns, _), o in self.store.objects.items() if r == "workloads" and ns == namespace and o["metadata"]["labels"][JOB_UID_LABEL] == uid)

    @staticmethod
    def _set_conditions(status: dict[str, Any], *conditions: dict[str, Any]) -> None:
        """Replace conditions of the same type, as the controllers' SetStatusCondition does."""
        kept = [c for c in status.get("conditions", []) if c["type"] not in {n["type"] for n in conditions}]
        status["conditions"] = kept + list(conditions)

    def stamp_times(self, namespace: str, name: str, *, start: str, completion: str | None = None) -> None:
        """The Job's status.startTime (and completionTime) as the API server's clock wrote them (RFC 3339),
        instead of this process's wall clock (k8s.io/api batch/v1 types.go JobStatus)."""
        times = {"startTime": start, **({"completionTime": completion} if completion else {})}
        self._update(namespace, name, lambda j: j["status"].update(times), lambda w: None)

    def _update(self, namespace: str, name: str, job_change: Any, workload_change: Any) -> None:
        with self._lock:
            job, workload = self.job(namespace, name), self.workload(namespace, name)
            job_change(job)
            workload_change(workload)
            self._bump("jobs", "MODIFIED", job)
            self._store_workload(workload)

    def wait_for_quota(self, namespace: str, name: str, message: str) -> None:
        self._update(namespace, name, lambda j: None, lambda w: self._set_conditions(w["status"], self._condition("QuotaReserved", "False", "Pending", message)))

    def admit(self, namespace: str, name: str, *, cluster_queue: str, flavor: str) -> None:
        def workload(w: dict[str, Any]) -> None:
            count = w["spec"]["podSets"][0]["count"]
            w["status"]["admission"] = {"clusterQueue": cluster_queue, "podSetAssignments": [
                {"name": "main", "count": count, "flavors": {"nvidia.com/gpu": flavor, "cpu": flavor, "memory": flavor}}]}
            self._set_conditions(w["status"], self._condition("QuotaReserved", "True", "QuotaReserved", f"Quota reserved in ClusterQueue {cluster_queue}"),
                                 self._condition("Admitted", "True", "Admitted", "The workload is admitted"))

        def job(j: dict[str, Any]) -> None:
            j["spec"]["suspend"] = False
            j["status"].update({"startTime": now(), "active": j["spec"].get("parallelism", 1), "ready": 0})
            self._set_conditions(j["status"], self._condition("Suspended", "False", "JobResumed", "Job resumed"))
            self._make_pods(j)

        self._update(namespace, name, job, workload)

    def pods_ready(self, namespace: str, name: str, ready: int) -> None:
        def job(j: dict[str, Any]) -> None:
            j["status"].update({"ready": ready})
            self._set_pods(namespace, name, ready, "Running", {"running": {"startedAt": now()}})

        self._update(namespace, name, job, lambda w: None)

    def succeed(self, namespace: str, name: str) -> None:
        def job(j: dict[str, Any]) -> None:
            n = j["spec"].get("completions", 1)
            j["status"].update({"active": 0, "ready": 0, "succeeded": n, "completionTime": now()})
            self._set_pods(namespace, name, None, "Succeeded", {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": now()}})
            self._set_conditions(j["status"], self._condition("SuccessCriteriaMet", "True", "CompletionsReached", "Reached expected number of succeeded pods"),
                                 self._condition("Complete", "True", "CompletionsReached", "Reached expected number of succeeded pods"))

        self._update(namespace, name, job, lambda w: self._set_conditions(w["status"], self._condition("Finished", "True", "Succeeded", "Job finished successfully")))

    def fail(self, namespace: str, name: str, *, reason: str, message: str) -> None:
        def job(j: dict[str, Any]) -> None:
            j["status"].update({"active": 0, "ready": 0, "failed": 1})
            self._set_pods(namespace, name, None, "Failed", {"terminated": {"exitCode": 1, "reason": "Error", "finishedAt": now()}})
            self._set_conditions(j["status"], self._condition("FailureTarget", "True", reason, message), self._condition("Failed", "True", reason, message))

        self._update(namespace, name, job, lambda w: self._set_conditions(w["status"], self._condition("Finished", "True", "Failed", message)))

    def disrupt(self, namespace: str, name: str, *, reason: str, rank: int = 0, exit_code: int | None = None) -> None:
        """A rank's pod is taken away by the fleet: it gets the ``DisruptionTarget`` condition with one of
        kubernetes' reasons (staging/src/k8s.io/api/core/v1/types.go PodReasonPreemptionByScheduler,
        DeletionByTaintManager, EvictionByEvictionAPI, DeletionByPodGC, TerminationByKubelet) and fails.
        ``exit_code``: the pod was terminated gracefully (a preemption, an API eviction) and its train
        container exited with it; None: its node is gone and no container status says how it ended.
        The Job controller tries the podFailurePolicy rules in order and the first match fails the Job,
        with its message (pkg/controller/job/pod_failure_policy.go matchPodFailurePolicy: "Container %s
        for pod %s/%s failed with exit code %v matching %v rule at index %d" for onExitCodes, whose
        matchOnExitCodes skips containers without a Terminated state; "Pod %s/%s has condition %v
        matching %v rule at index %d" for onPodConditions)."""
        pod_name = self.pods(namespace, name)[rank]
        message = ""
        for index, rule in enumerate(self.job(namespace, name)["spec"]["podFailurePolicy"]["rules"]):
            codes = rule.get("onExitCodes")
            if codes and exit_code not in (None, 0) and codes.get("containerName") in (None, "train") \
                    and (exit_code in codes["values"]) == (codes["operator"] == "In"):
                message = f"Container train for pod {namespace}/{pod_name} failed with exit code {exit_code} matching FailJob rule at index {index}"
                break
            if any(c.get("type") == "DisruptionTarget" for c in rule.get("onPodConditions") or []):
                message = f"Pod {namespace}/{pod_name} has condition DisruptionTarget matching FailJob rule at index {index}"
                break

        def job(j: dict[str, Any]) -> None:
            pod = self.store.objects[("pods", namespace, pod_name)]
            pod["status"]["phase"] = "Failed"
            if exit_code is not None:
                pod["status"]["containerStatuses"] = [{"name": "train", "state": {"terminated": {"exitCode": exit_code, "reason": "Error"}}}]
            pod["status"].setdefault("conditions", []).append(self._condition("DisruptionTarget", "True", reason, f"{reason}: taken away by the fleet"))
            self._bump("pods", "MODIFIED", pod)
            j["status"].update({"active": 0, "ready": 0, "failed": 1})
            self._set_conditions(j["status"], self._condition("FailureTarget", "True", "PodFailurePolicy", message),
                                 self._condition("Failed", "True", "PodFailurePolicy", message))

        self._update(namespace, name, job, lambda w: self._set_conditions(w["status"], self._condition("Finished", "True", "Failed", message)))

    def evict(self, namespace: str, name: str, *, reason: str = "Preempted", preempted_reason: str = "InClusterQueue", message: str = "Preempted to accommodate a workload due to prioritization in the ClusterQueue") -> None:
        def workload(w: dict[str, Any]) -> None:
            w["status"].pop("admission", None)
            conditions = [self._condition("Evicted", "True", reason, message),
                          self._condition("QuotaReserved", "False", "Pending", message),
                          self._condition("Admitted", "False", "NoReservation", "The workload has no reservation")]
            if reason == "Preempted":
                conditions.append(self._condition("Preempted", "True", preempted_reason, message))
            self._set_conditions(w["status"], *conditions)

        def job(j: dict[str, Any]) -> None:
            for pod in self.pods(namespace, name).values():  # a suspended Job's pods are deleted
                self._remove(("pods", namespace, pod))
            j["spec"]["suspend"] = True
            j["status"].update({"active": 0, "ready": 0})
            j["status"].pop("startTime", None)
            self._set_conditions(j["status"], self._condition("Suspended", "True", "JobSuspended", "Job suspended"))

        self._update(namespace, name, job, workload)

    def created(self, resource: str) -> list[Recorded]:
        return [r for r in self.requests if r.method == "POST" and r.path.endswith(f"/{resource}") and r.status == 201]
