"""The Kubernetes client for GKE jobs: the official ``kubernetes`` package, wrapped where its defaults bite.

Why the official client and not plain HTTP: it reads kubeconfig exactly as kubectl does,
including GKE's ``exec`` credential plugin (``gke-gcloud-auth-plugin``) and the in-cluster
service account, which a hand-written client would have to re-implement. What it lacks is
added here: retries (a urllib3 ``Retry`` on connection errors, read errors and 5xx, for every
method; a create retried after a lost answer meets 409 and is resolved by name and the
dispatch-id annotation, so a retried dispatch never makes a second Job), a timeout on every
request, and API ``Status`` answers mapped to one-line errors that never echo a request body.
Answers are read as plain JSON (``_preload_content=False``), so status mapping stays pure.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from clusters.errors import UserError
from jobs.k8s.render import RUN_LABEL, manifests, owner_reference, vault_secret, vault_secret_name
from jobs.k8s.schemas import require_valid
from jobs.k8s.status import K8sRunStatus, dispatch_id as dispatch_id_of, summarize
from jobs.spec import FinetuneSpec

if TYPE_CHECKING:
    import kubernetes

RETRY_STATUSES = (500, 502, 503, 504)
USER_AGENT = "gpufleet-jobs/0.1"
KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta2"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
# Minting callback: number of ranks -> (role_id, one wrapping token per rank).
Mint = Callable[[int], tuple[str, list[str]]]
# Tracked lists: names (or uids) per set-based selector (a URL stays a few KiB), items per page.
NAMES_PER_SELECTOR = 50
PAGE_LIMIT = 200
# Bytes read at a time from a list answer, between checks of its namespace's budget.
READ_CHUNK = 64 * 1024


@dataclass
class ListBudget:
    """What one namespace's tracked lists may cost in one reconcile pass: items decoded, bytes
    read and seconds. A tenant can make any number of objects carrying gpufleet's labels in its
    own namespace (``edit``), each up to the API server's object size (annotations alone may
    hold 256 KiB); the budget keeps that cost in that namespace's pass, never in the others'.
    Pages ask for no more items than are left (``limit``), and an answer is read only up to the
    bytes and the deadline left: past them it is dropped unread. Spent, the lists stop and the
    answer says it is incomplete."""

    max_objects: int
    max_seconds: float
    max_bytes: int = 8 * 1024 * 1024
    clock: Callable[[], float] = time.monotonic
    objects: int = 0
    bytes: int = 0
    started: float = field(default=0.0)

    def __post_init__(self) -> None:
        self.started = self.clock()

    def spent(self) -> bool:
        return self.objects >= self.max_objects or self.bytes >= self.max_bytes or self.clock() - self.started >= self.max_seconds

    def page_limit(self) -> int:
        """Items the next page may ask for: a page never carries more than the budget has left."""
        return max(1, min(PAGE_LIMIT, self.max_objects - self.objects))

    def take(self, size: int) -> bool:
        """Count ``size`` more bytes read; False once the bytes or the seconds are spent."""
        self.bytes += size
        return self.bytes <= self.max_bytes and self.clock() - self.started < self.max_seconds


class _OverBudget(Exception):
    """An answer read past its namespace's bytes or deadline: dropped, the list is incomplete."""


@dataclass(frozen=True)
class TrackedRuns:
    """The Jobs of the tracked names and their Kueue Workloads, as far as the budget reached.
    ``jobs_complete``: every Job the selectors match was read, so a tracked name missing from
    ``jobs`` is not there; ``workloads_complete`` likewise for the Workloads of those Jobs."""

    jobs: dict[str, dict[str, Any]]
    workloads: list[dict[str, Any]]
    jobs_complete: bool
    workloads_complete: bool


def _in_selector(key: str, values: Sequence[str]) -> str:
    """apimachinery labels.Parse set-based form: ``key in (a,b)``."""
    return f"{key} in ({','.join(values)})"


def _chunks(values: Sequence[str]) -> Iterator[Sequence[str]]:
    for start in range(0, len(values), NAMES_PER_SELECTOR):
        yield values[start:start + NAMES_PER_SELECTOR]


class K8sError(UserError):
    """A Kubernetes answer the user must act on; one line, exit 2, never a request body."""


class K8sRunGone(K8sError):
    """The run's Job is not there (never dispatched, stopped, or removed after its TTL)."""


@dataclass(frozen=True)
class K8sSettings:
    kubeconfig: str | None = None
    context: str | None = None
    in_cluster: bool = False
    timeout_seconds: float = 10.0
    retries: int = 3
    backoff_seconds: float = 0.5

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> K8sSettings:
        """KUBECONFIG and GPUFLEET_KUBE_CONTEXT (default: the kubeconfig's current context); in a
        pod without KUBECONFIG, the in-cluster service account."""
        kubeconfig = env.get("KUBECONFIG") or None
        if kubeconfig and not os.path.isfile(kubeconfig.split(os.pathsep)[0]):
            raise UserError(f"KUBECONFIG {kubeconfig!r} is not a file; run `gcloud container clusters get-credentials <cluster>` or point KUBECONFIG at one")
        in_cluster = kubeconfig is None and bool(env.get("KUBERNETES_SERVICE_HOST"))
        return cls(kubeconfig=kubeconfig, context=env.get("GPUFLEET_KUBE_CONTEXT") or None, in_cluster=in_cluster)


@dataclass(frozen=True)
class DispatchResult:
    run: str
    namespace: str
    created: bool


def _api_client(settings: K8sSettings) -> kubernetes.client.ApiClient:
    import kubernetes
    from urllib3.util.retry import Retry

    configuration = kubernetes.client.Configuration()
    try:
        if settings.in_cluster:
            kubernetes.config.load_incluster_config(client_configuration=configuration)
        else:
            kubernetes.config.load_kube_config(config_file=settings.kubeconfig, context=settings.context, client_configuration=configuration)
    except (kubernetes.config.ConfigException, OSError) as exc:
        raise UserError(f"cannot load Kubernetes credentials ({str(exc).splitlines()[0][:200]}); run `gcloud container clusters get-credentials <cluster>` (needs gke-gcloud-auth-plugin) or set KUBECONFIG") from None
    configuration.retries = Retry(
        total=settings.retries, connect=settings.retries, read=settings.retries, status=settings.retries, other=0,
        allowed_methods=None, status_forcelist=RETRY_STATUSES, backoff_factor=settings.backoff_seconds,
        raise_on_status=False, respect_retry_after_header=True,
    )
    client = kubernetes.client.ApiClient(configuration)
    client.user_agent = USER_AGENT
    return client


def _first_line(text: str, limit: int = 300) -> str:
    stripped = (text or "").strip()
    return stripped.splitlines()[0][:limit] if stripped else "(empty answer)"


class K8sClient:
    def __init__(self, settings: K8sSettings) -> None:
        import kubernetes

        self.settings = settings
        self._client = _api_client(settings)
        self._batch = kubernetes.client.BatchV1Api(self._client)
        self._core = kubernetes.client.CoreV1Api(self._client)
        self._custom = kubernetes.client.CustomObjectsApi(self._client)

    def close(self) -> None:
        self._client.close()

    # ---- one request, one error shape ------------------------------------------------------
    def _call(self, action: str, call: Callable[..., Any], *args: Any, missing_ok: bool = False, conflict_ok: bool = False, echo: bool = True,
              expired_ok: bool = False, budget: ListBudget | None = None, **kwargs: Any) -> dict[str, Any] | None:
        import kubernetes
        import urllib3

        try:
            response = call(*args, _preload_content=False, _request_timeout=self.settings.timeout_seconds, **kwargs)
        except kubernetes.client.ApiException as exc:
            if (exc.status == 404 and missing_ok) or (exc.status == 409 and conflict_ok) or (exc.status == 410 and expired_ok):
                return None
            raise self._error(action, exc, echo) from None
        except urllib3.exceptions.HTTPError as exc:
            raise K8sError(f"{action}: cannot reach the Kubernetes API after {self.settings.retries + 1} attempts ({type(exc).__name__}); check the cluster endpoint, your network (master authorized networks) and KUBECONFIG") from None
        if budget is None:
            return json.loads(response.data or b"{}")
        return json.loads(self._read_within(action, response, budget) or b"{}")

    def _read_within(self, action: str, response: Any, budget: ListBudget) -> bytes:
        """The answer's body, read in chunks while ``budget`` has bytes and seconds left; past
        them the connection is closed with the rest unread (``_OverBudget``)."""
        import urllib3

        chunks: list[bytes] = []
        try:
            while chunk := response.read(READ_CHUNK):
                chunks.append(chunk)
                if not budget.take(len(chunk)):
                    response.close()
                    raise _OverBudget(action)
        except urllib3.exceptions.HTTPError as exc:
            raise K8sError(f"{action}: the Kubernetes API's answer broke off ({type(exc).__name__}); retry later or check the cluster") from None
        response.release_conn()
        return b"".join(chunks)

    def _error(self, action: str, exc: Any, echo: bool) -> K8sError:
        try:
            status = json.loads(exc.body or "{}")
        except ValueError:
            status = {}
        reason, message = status.get("reason") or exc.reason, status.get("message") or str(exc.body or "")
        detail = f" ({_first_line(message)})" if echo else ""
        fix = {
            401: "your credentials were refused: run `gcloud container clusters get-credentials <cluster>` again",
            403: "your account may not do this in that namespace: ask for the tenant's edit role (clusters/<cluster>.yaml groups)",
            404: "check the run id and the namespace",
            409: "another object has that name",
            422: "the API server refused the object; this is a gpufleet bug if `gpufleet jobs render` passed",
        }.get(exc.status, "retry later or check the cluster")
        return K8sError(f"{action}: Kubernetes answered {exc.status} {reason}{detail}; {fix}")

    # ---- reads ------------------------------------------------------------------------------
    def version(self) -> dict[str, Any]:
        """``GET /version``: whether the API server answers (any authenticated user may read it)."""
        import kubernetes

        return self._call("read the API server version", kubernetes.client.VersionApi(self._client).get_code) or {}

    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._call(f"read Job {namespace}/{name}", self._batch.read_namespaced_job, name, namespace, missing_ok=True)

    def workloads(self, namespace: str, job_uid: str) -> list[dict[str, Any]]:
        """The Workloads Kueue made for one Job (one, or two around a re-admission): the first page
        only, so objects others label with that uid cannot make this call large."""
        answer = self._call(f"list Kueue Workloads in {namespace}", self._custom.list_namespaced_custom_object,
                            KUEUE_GROUP, KUEUE_VERSION, namespace, "workloads", label_selector=f"{JOB_UID_LABEL}={job_uid}", limit=PAGE_LIMIT)
        return list((answer or {}).get("items") or [])

    def cluster_namespace(self) -> dict[str, Any]:
        """The ``kube-system`` Namespace, what ``jobs.k8s.identity`` names the cluster by."""
        answer = self._call("read Namespace kube-system (the cluster's identity)", self._core.read_namespace, "kube-system")
        return answer or {}

    def list_tracked(self, namespace: str, names: Sequence[str], budget: ListBudget) -> TrackedRuns:
        """The Jobs named ``names`` (runs the control plane made and tracks) and their Workloads.

        Selected by value, never by a label's mere presence: ``gpufleet.dev/run in (<names>)``
        and ``kueue.x-k8s.io/job-uid in (<uids of those Jobs>)``, paginated (``limit``,
        ``continue``) and kept only where the object's own name (or owner uid) is tracked, within
        ``budget``. Junk Jobs with the run label and any other value cost nothing to list; junk
        that copies a tracked name as its label value costs this namespace's budget only."""
        wanted = set(names)
        jobs: dict[str, dict[str, Any]] = {}
        jobs_complete = True
        for chunk in _chunks(sorted(wanted)):
            found, complete = self._paged(f"list Jobs in {namespace}", self._batch.list_namespaced_job, (namespace,),
                                          _in_selector(RUN_LABEL, chunk), budget)
            jobs.update((job["metadata"]["name"], job) for job in found if job["metadata"]["name"] in wanted)
            jobs_complete = jobs_complete and complete
            if not complete:
                break
        uids = {job["metadata"]["uid"]: name for name, job in jobs.items()}
        workloads: list[dict[str, Any]] = []
        workloads_complete = True
        for chunk in _chunks(sorted(uids)):
            found, complete = self._paged(f"list Kueue Workloads in {namespace}", self._custom.list_namespaced_custom_object,
                                          (KUEUE_GROUP, KUEUE_VERSION, namespace, "workloads"), _in_selector(JOB_UID_LABEL, chunk), budget)
            workloads += [w for w in found if (w["metadata"].get("labels") or {}).get(JOB_UID_LABEL) in uids]
            workloads_complete = workloads_complete and complete
            if not complete:
                break
        return TrackedRuns(jobs, workloads, jobs_complete, workloads_complete)

    def _paged(self, action: str, call: Callable[..., Any], args: tuple[Any, ...], selector: str, budget: ListBudget) -> tuple[list[dict[str, Any]], bool]:
        """Every page of one selected list, or as many as ``budget`` allows (then False). An expired
        continue token (410 Expired: the snapshot was compacted) restarts the list once, from the
        first page, rather than take the API server's inconsistent remainder."""
        items: list[dict[str, Any]] = []
        token: str | None = None
        restarts = 1
        while True:
            if budget.spent():
                return items, False
            try:
                page = self._call(action, call, *args, label_selector=selector, limit=budget.page_limit(), expired_ok=True, budget=budget,
                                  **({"_continue": token} if token else {}))
            except _OverBudget:
                return items, False
            if page is None:
                if not token or restarts == 0:
                    return items, False
                restarts, items, token = restarts - 1, [], None
                continue
            found = list(page.get("items") or [])
            budget.objects += len(found)
            items += found
            token = (page.get("metadata") or {}).get("continue") or None
            if token is None:
                return items, True

    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        answer = self._call(f"list Pods in {namespace}", self._core.list_namespaced_pod, namespace, label_selector=label_selector)
        return list((answer or {}).get("items") or [])

    def pod_log(self, namespace: str, pod: str, *, container: str, follow: bool, tail_lines: int | None, since_seconds: int | None,
                read_timeout_seconds: float | None = None) -> Any:
        """``read_namespaced_pod_log`` unread (``_preload_content=False``): the urllib3 response,
        streamed when ``follow``. A pod that is gone is K8sRunGone; 400 (container not there,
        or not started: "is waiting to start") is K8sError with the API server's message."""
        import kubernetes
        import urllib3

        options = {k: v for k, v in (("tail_lines", tail_lines), ("since_seconds", since_seconds)) if v is not None}
        timeout = (self.settings.timeout_seconds, read_timeout_seconds) if read_timeout_seconds else self.settings.timeout_seconds
        try:
            return self._core.read_namespaced_pod_log(pod, namespace, container=container, follow=follow, _preload_content=False,
                                                      _request_timeout=timeout, **options)
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                raise K8sRunGone(f"logs: no pod {pod} in namespace {namespace}: its Job was removed (stopped, or a day after it finished)") from None
            raise self._error(f"logs of pod {namespace}/{pod}", exc, True) from None
        except urllib3.exceptions.HTTPError as exc:
            raise K8sError(f"logs: cannot reach the Kubernetes API after {self.settings.retries + 1} attempts ({type(exc).__name__}); "
                           "check the cluster endpoint and KUBECONFIG") from None

    def status(self, namespace: str, name: str) -> K8sRunStatus:
        job = self.get_job(namespace, name)
        if job is None:
            raise K8sRunGone(f"status: no Job {name} in namespace {namespace}: it was never dispatched, or it was stopped, or Kubernetes removed it a day after it finished (ttlSecondsAfterFinished)")
        return summarize(job, self.workloads(namespace, job["metadata"]["uid"]))

    def watch_job(self, namespace: str, name: str, *, timeout_seconds: int) -> Iterator[dict[str, Any]]:
        """The Job as it changes (the API's watch), until ``timeout_seconds`` pass or it is deleted."""
        import kubernetes

        watch = kubernetes.watch.Watch()
        try:
            for event in watch.stream(self._batch.list_namespaced_job, namespace, field_selector=f"metadata.name={name}",
                                      timeout_seconds=timeout_seconds, _request_timeout=timeout_seconds + self.settings.timeout_seconds):
                yield event["raw_object"]
                if event["type"] == "DELETED":
                    return
        except kubernetes.client.ApiException as exc:
            raise self._error(f"watch Job {namespace}/{name}", exc, True) from None
        finally:
            watch.stop()

    # ---- writes -----------------------------------------------------------------------------
    def _create(self, kind: str, call: Callable[..., Any], namespace: str, body: dict[str, Any], *, echo: bool = True) -> dict[str, Any] | None:
        """The created object, or None when the name exists already (409)."""
        import kubernetes
        import urllib3

        try:
            response = call(namespace, body, _preload_content=False, _request_timeout=self.settings.timeout_seconds)
        except kubernetes.client.ApiException as exc:
            if exc.status == 409:
                return None
            raise self._error(f"create {kind} {namespace}/{body['metadata']['name']}", exc, echo) from None
        except urllib3.exceptions.HTTPError as exc:
            raise K8sError(f"create {kind}: cannot reach the Kubernetes API after {self.settings.retries + 1} attempts ({type(exc).__name__}); "
                           "retry the same command with the same --idempotency-token: it creates nothing twice") from None
        return json.loads(response.data)

    def delete_job(self, namespace: str, name: str, *, propagation: str = "Foreground") -> None:
        import kubernetes

        self._call(f"delete Job {namespace}/{name}", self._batch.delete_namespaced_job, name, namespace,
                   body=kubernetes.client.V1DeleteOptions(propagation_policy=propagation))

    def dispatch(self, spec: FinetuneSpec, meta: dict[str, str], *, dispatch_id: str, mint: Mint, attempt: int = 1) -> DispatchResult:
        """Create the run's Job (suspended; Kueue admits it), then its Secret and Service.

        Idempotent on ``dispatch_id``: the Job's name derives from it, so a retry finds the Job
        (409 or a plain read) instead of making a second one, and mints secret_ids only if the
        run's Secret owned by THIS Job (ownerReferences uid) is missing. If the Secret cannot be
        created, a Job this call created is deleted again: its pods could never start and would
        hold the tenant's quota.
        """
        docs = manifests(spec, dispatch_id=dispatch_id, meta=meta, attempt=attempt)
        require_valid(docs)
        job_doc = docs[-1]
        namespace, run = spec.namespace, job_doc["metadata"]["name"]
        job = self.get_job(namespace, run)
        created = False
        if job is None:
            job = self._create("Job", self._batch.create_namespaced_job, namespace, job_doc)
            created = job is not None
            job = job or self.get_job(namespace, run)
        if job is None:
            raise K8sError(f"dispatch: Job {namespace}/{run} exists and vanished again; retry the same command")
        if dispatch_id_of(job) != dispatch_id:
            raise K8sError(f"dispatch: Job {namespace}/{run} exists but belongs to dispatch {dispatch_id_of(job)!r}, not {dispatch_id!r}; pass another --dispatch-id")
        def secret() -> dict[str, Any]:
            role_id, tokens = mint(spec.nodes)
            doc = vault_secret(spec, job, role_id, tokens)
            require_valid([doc])
            return doc

        try:
            if spec.vault_role is not None:  # a job without secrets gets no run Secret and no secret_id
                self._ensure_owned("Secret", self._core, "secret", namespace, vault_secret_name(run), job, secret, echo=False)
            for doc in docs[:-1]:
                self._ensure_owned(doc["kind"], self._core, "service", namespace, doc["metadata"]["name"], job, lambda doc=doc: _owned(doc, job))
        except UserError:
            if created:
                self.delete_job(namespace, run, propagation="Background")
            raise
        return DispatchResult(run, namespace, created)

    def _ensure_owned(self, kind: str, api: Any, resource: str, namespace: str, name: str, job: dict[str, Any],
                      body: Callable[[], dict[str, Any]], *, echo: bool = True) -> None:
        """The run's ``kind`` object ``name``, owned by ``job`` (its uid in ownerReferences).

        One left by an earlier Job of the same name is not adopted: that Job was deleted with
        Background propagation, so Kubernetes' garbage collector removes its dependents later,
        and would remove an adopted Secret under the new Job's pods (they would wait for it
        until the deadline, holding GPUs). It is deleted now (precondition: its uid, so nothing
        made meanwhile is touched) and made again from ``body`` (a Secret: freshly minted
        secret_ids). An object gpufleet did not make for this run is an error, never deleted."""
        import kubernetes

        read, create, delete = (getattr(api, f"{verb}_namespaced_{resource}") for verb in ("read", "create", "delete"))
        for _ in range(3):
            found = self._call(f"read {kind} {namespace}/{name}", read, name, namespace, missing_ok=True, echo=False)
            if found is not None:
                if _owned_by(found, job):
                    return
                if not _left_by_earlier_job(found, job):
                    raise K8sError(f"dispatch: {kind} {namespace}/{name} exists and was not made for Job {job['metadata']['name']} "
                                   f"(uid {job['metadata']['uid']}); delete it if it is not in use, or pass another --dispatch-id")
                preconditions = kubernetes.client.V1Preconditions(uid=found["metadata"]["uid"])
                self._call(f"delete {kind} {namespace}/{name} left by an earlier Job", delete, name, namespace, missing_ok=True, conflict_ok=True,
                           echo=False, body=kubernetes.client.V1DeleteOptions(preconditions=preconditions))
            if self._create(kind, create, namespace, body(), echo=echo) is not None:
                return
            # 409: made meanwhile (a concurrent dispatch of the same run): read it again
        raise K8sError(f"dispatch: {kind} {namespace}/{name} keeps being replaced while this dispatch makes it; retry later")

    def dry_run(self, spec: FinetuneSpec) -> str:
        """What ``submit`` means on GKE: the tenant's LocalQueue for the pool exists, and the API
        server (admission webhooks, Kueue's included) accepts the Job without storing it."""
        assert spec.gke is not None
        namespace, queue = spec.namespace, spec.gke.local_queue
        docs = manifests(spec, dispatch_id="dry-run")
        require_valid(docs)
        found = self._call(f"read LocalQueue {namespace}/{queue}", self._custom.get_namespaced_custom_object,
                           KUEUE_GROUP, KUEUE_VERSION, namespace, "localqueues", queue, missing_ok=True)
        if found is None:
            raise K8sError(f"submit: LocalQueue {queue} does not exist in namespace {namespace}, so Kueue would never admit {spec.name}; "
                           f"apply the {spec.cluster}-scheduler stack (one LocalQueue per tenant and GPU pool)")
        answer = self._call(f"dry-run create Job {namespace}/{docs[-1]['metadata']['name']}", self._batch.create_namespaced_job,
                            namespace, docs[-1], dry_run="All")
        return str((answer or {}).get("metadata", {}).get("name"))

    def stop(self, namespace: str, name: str) -> None:
        """Delete the Job in the foreground: it stays visible as stopped until its pods are gone,
        and its Secret and Service go with it (owner references)."""
        if self.get_job(namespace, name) is None:
            raise K8sRunGone(f"stop: no Job {name} in namespace {namespace}; it may be finished and removed already")
        self.delete_job(namespace, name)


def _owned_by(obj: dict[str, Any], job: dict[str, Any]) -> bool:
    return any(ref.get("uid") == job["metadata"]["uid"] for ref in obj["metadata"].get("ownerReferences") or [])


def _left_by_earlier_job(obj: dict[str, Any], job: dict[str, Any]) -> bool:
    """gpufleet made ``obj`` for this run name, owned only by an earlier Job of that name."""
    run, refs = job["metadata"]["name"], obj["metadata"].get("ownerReferences") or []
    return ((obj["metadata"].get("labels") or {}).get(RUN_LABEL) == run and bool(refs)
            and all(ref.get("kind") == "Job" and ref.get("name") == run for ref in refs))


def _owned(doc: dict[str, Any], job: dict[str, Any]) -> dict[str, Any]:
    return {**doc, "metadata": {**doc["metadata"], "ownerReferences": [owner_reference(job)]}}
