"""A GKE run's output: each rank's pod log through the official client (``read_namespaced_pod_log``).

Which pod is which rank: the Job controller labels every pod of a Job with
``batch.kubernetes.io/job-name`` and gives each pod of an Indexed Job the annotation
``batch.kubernetes.io/job-completion-index`` (k8s.io/api batch/v1 types.go, the const block with
``JobCompletionIndexAnnotation`` and ``JobNameLabel``; the render sets completionMode Indexed for
multi-node runs). A rank whose pod was replaced has several pods: the newest answers.

What the API server answers (``GET /api/v1/namespaces/{ns}/pods/{name}/log``, query ``container``,
``follow``, ``tailLines``, ``sinceSeconds``, ``previous``): text/plain; 400 BadRequest "container
<c> is not valid for pod <p>" (pkg/registry/core/pod/strategy.go LogLocation); 400 "container
"<c>" in pod "<p>" is waiting to start: <reason>" from the kubelet while the container has not
started; 404 NotFound for a pod that is gone. A follow ends when the container exits. Kubernetes
keeps a container's stdout and stderr as one log, so a GKE run has one stream per rank.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from jobs.k8s.client import K8sError
from jobs.k8s.render import COMPLETION_INDEX_ANNOTATION
from jobs.logs import arriving
from jobs.spec import TASK

if TYPE_CHECKING:
    from jobs.k8s.client import K8sClient

JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
# The pod log API cuts by lines, not bytes: at most this many come back, then the byte cap applies.
TAIL_LINES_CAP = 10_000
CHUNK_BYTES = 64 * 1024
# A follow that saw no byte for this long is opened again from "now" (tailLines=0): nothing was
# written meanwhile, so nothing repeats, and a pod that vanished without closing the stream is noticed.
FOLLOW_READ_TIMEOUT_SECONDS = 600.0
WAITING = "is waiting to start"


def rank_pods(client: K8sClient, namespace: str, run: str) -> dict[int, str]:
    """Rank -> pod name for the run's pods (the newest pod of each completion index)."""
    pods = client.list_pods(namespace, f"{JOB_NAME_LABEL}={run}")
    out: dict[int, str] = {}
    for pod in sorted(pods, key=lambda p: (p["metadata"].get("creationTimestamp") or "", p["metadata"]["name"])):
        meta = pod["metadata"]
        index = (meta.get("annotations") or {}).get(COMPLETION_INDEX_ANNOTATION) or (meta.get("labels") or {}).get(COMPLETION_INDEX_ANNOTATION)
        out[int(index) if index and index.isdigit() else 0] = meta["name"]
    return out


class _Quiet(Exception):
    """The follow saw no byte for FOLLOW_READ_TIMEOUT_SECONDS."""


def _chunks(response: Any, stop: threading.Event) -> Iterator[bytes]:
    import urllib3

    try:
        for chunk in arriving(response, CHUNK_BYTES):
            yield chunk
            if stop.is_set():
                return
    except urllib3.exceptions.ReadTimeoutError:
        raise _Quiet() from None
    except urllib3.exceptions.HTTPError as exc:
        raise K8sError(f"logs: the log stream from the Kubernetes API broke off ({type(exc).__name__}); follow again") from None
    finally:
        response.release_conn()


def read_tail(client: K8sClient, namespace: str, pod: str, *, tail_bytes: int, since_seconds: int | None, container: str = TASK) -> bytes:
    """At most the last ``tail_bytes`` (+1, as jobs.nomad.logs.read_tail) of the pod's log, of its last TAIL_LINES_CAP lines."""
    try:
        response = client.pod_log(namespace, pod, container=container, follow=False, tail_lines=TAIL_LINES_CAP, since_seconds=since_seconds)
    except K8sError as exc:
        if WAITING in str(exc):
            return b""
        raise
    data = bytearray()
    for chunk in _chunks(response, threading.Event()):
        data += chunk
        if len(data) > 2 * tail_bytes:
            del data[:-(tail_bytes + 1)]
    return bytes(data[-(tail_bytes + 1):])  # one byte more: the caller sees a cut first line


def follow(client: K8sClient, namespace: str, pod: str, *, tail_lines: int | None, since_seconds: int | None, stop: threading.Event,
           container: str = TASK) -> Iterator[bytes]:
    """The last ``tail_lines`` lines (TAIL_LINES_CAP when None), then the log as it grows, until
    the container exits or ``stop`` is set; while the container waits to start, ``b""`` every second."""
    while not stop.is_set():
        try:
            response = client.pod_log(namespace, pod, container=container, follow=True, since_seconds=since_seconds,
                                      tail_lines=TAIL_LINES_CAP if tail_lines is None else tail_lines,
                                      read_timeout_seconds=FOLLOW_READ_TIMEOUT_SECONDS)
        except K8sError as exc:
            if WAITING not in str(exc):
                raise
            yield b""
            stop.wait(1.0)
            continue
        try:
            yield from _chunks(response, stop)
            return
        except _Quiet:
            tail_lines, since_seconds = 0, None
