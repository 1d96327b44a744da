"""The Nomad HTTP client gpufleet uses: python-nomad, wrapped where its defaults bite.

python-nomad as shipped: 5 s timeout and no retries; TLS verification off and NOMAD_CACERT,
NOMAD_CLIENT_CERT/KEY and NOMAD_TLS_SERVER_NAME never read; no ``namespace`` on evaluation endpoints; ``user_agent`` without a token raises
TypeError; and ``dispatch_job(idempotency_token=...)`` puts the token in the body, where
Nomad ignores it. So this module: builds its own session (urllib3 Retry on connection
errors, read timeouts and 5xx, for every method: a retried dispatch resends the same URL,
hence the same ``?idempotency_token=``), verifies TLS against NOMAD_CACERT and presents the
CLI certificate (the fleet's agents require mTLS on the API), checks the server's name
against NOMAD_TLS_SERVER_NAME (e.g. ``server.global.nomad``) when set, sends the
namespace explicitly, calls ``/dispatch`` itself, and maps 400/403/404 to one-line errors.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from clusters.errors import UserError
from jobs.nomad.placement import explain
from jobs.nomad.render import META_ATTEMPT, META_ROLE_ID, META_WRAPPED_SECRET_ID, placement_probe, render
from jobs.spec import EXPERIMENT_META, FinetuneSpec
from jobs.nomad.status import RunStatus, summarize

if TYPE_CHECKING:
    import nomad
    import requests

RETRY_STATUSES = (500, 502, 503, 504)
STATUS_ON_404 = "check the id printed by `gpufleet jobs dispatch` and the namespace (--namespace or NOMAD_NAMESPACE)"
USER_AGENT = "gpufleet-jobs/0.1"
_ADDR = re.compile(r"^https?://[^\s/]+(:\d+)?/?$")


class NomadError(UserError):
    """A Nomad answer the user must act on; one line, exit 2, never the request body."""


@dataclass(frozen=True)
class NomadSettings:
    address: str
    token: str | None = None
    namespace: str | None = None
    region: str | None = None
    cacert: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    tls_server_name: str | None = None
    skip_verify: bool = False
    timeout_seconds: float = 10.0
    retries: int = 3
    backoff_seconds: float = 0.5

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> NomadSettings:
        """NOMAD_ADDR, NOMAD_TOKEN, NOMAD_NAMESPACE, NOMAD_REGION, NOMAD_CACERT, NOMAD_CLIENT_CERT,
        NOMAD_CLIENT_KEY, NOMAD_TLS_SERVER_NAME, NOMAD_SKIP_VERIFY (the Nomad CLI's names)."""
        address = env.get("NOMAD_ADDR", "http://127.0.0.1:4646")
        if not _ADDR.match(address):
            raise UserError(f"NOMAD_ADDR {address!r} is not an http(s) address; set it like https://nomad.example.com:4646")
        cacert = env.get("NOMAD_CACERT") or None
        if cacert and not os.path.isfile(cacert):
            raise UserError(f"NOMAD_CACERT {cacert!r} is not a file; point it at the PEM CA bundle that signed the Nomad servers' certificates")
        cert, key = env.get("NOMAD_CLIENT_CERT") or None, env.get("NOMAD_CLIENT_KEY") or None
        if bool(cert) != bool(key):
            given, missing = ("NOMAD_CLIENT_CERT", "NOMAD_CLIENT_KEY") if cert else ("NOMAD_CLIENT_KEY", "NOMAD_CLIENT_CERT")
            raise UserError(f"{given} is set but {missing} is not; set both to the CLI certificate and key from the Nomad bootstrap, or neither")
        for name, path in (("NOMAD_CLIENT_CERT", cert), ("NOMAD_CLIENT_KEY", key)):
            if path and not os.path.isfile(path):
                raise UserError(f"{name} {path!r} is not a file; point it at the PEM file the Nomad bootstrap wrote")
        return cls(
            address=address.rstrip("/"),
            token=env.get("NOMAD_TOKEN") or None,
            namespace=env.get("NOMAD_NAMESPACE") or None,
            region=env.get("NOMAD_REGION") or None,
            cacert=cacert,
            client_cert=cert,
            client_key=key,
            tls_server_name=env.get("NOMAD_TLS_SERVER_NAME") or None,
            skip_verify=env.get("NOMAD_SKIP_VERIFY", "").lower() in ("1", "true"),
        )


@dataclass(frozen=True)
class PlanResult:
    placeable: bool
    reason: str | None
    diff_type: str
    warnings: str


@dataclass(frozen=True)
class DispatchResult:
    dispatched_job_id: str
    eval_id: str
    namespace: str


def _server_name_adapter() -> type:
    from requests.adapters import HTTPAdapter

    class ServerNameAdapter(HTTPAdapter):
        """Sends SNI and checks the certificate for this name instead of the URL's host: the API is
        reached by load-balancer IP, Nomad's server certificates name ``server.<region>.nomad``."""

        def __init__(self, server_name: str, **kwargs: object) -> None:
            self.server_name = server_name
            super().__init__(**kwargs)

        def init_poolmanager(self, *args: object, **kwargs: object) -> None:
            kwargs["server_hostname"] = self.server_name
            kwargs["assert_hostname"] = self.server_name
            super().init_poolmanager(*args, **kwargs)

    return ServerNameAdapter


def _session(settings: NomadSettings) -> requests.Session:
    import requests
    from requests.adapters import HTTPAdapter
    from urllib3.util.retry import Retry

    retry = Retry(
        total=settings.retries,
        connect=settings.retries,
        read=settings.retries,
        status=settings.retries,
        other=0,
        allowed_methods=None,
        status_forcelist=RETRY_STATUSES,
        backoff_factor=settings.backoff_seconds,
        raise_on_status=False,
        respect_retry_after_header=True,
    )
    session = requests.Session()
    if settings.tls_server_name:
        adapter = _server_name_adapter()(settings.tls_server_name, max_retries=retry)
    else:
        adapter = HTTPAdapter(max_retries=retry)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    session.headers["User-Agent"] = USER_AGENT
    return session


def _first_line(text: str, limit: int = 300) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else "(empty answer)"
    return line[:limit]


def _tls_advice(detail: str, settings: NomadSettings) -> str:
    """One line for a failed TLS handshake: which of the four mTLS settings to fix."""
    if "CERTIFICATE_VERIFY_FAILED" in detail or "doesn't match" in detail or "hostname mismatch" in detail.lower():
        if "match" in detail.lower():
            return (f"Nomad at {settings.address} presented a certificate for another name; set NOMAD_TLS_SERVER_NAME=server.<region>.nomad"
                    " (Nomad's server certificates name that, not the load balancer's address)")
        return (f"the certificate of Nomad at {settings.address} is not signed by "
                f"{'NOMAD_CACERT ' + repr(settings.cacert) if settings.cacert else 'a CA this machine trusts'}; set NOMAD_CACERT to the cluster's CA (nomad-agent-ca.pem from the bootstrap)")
    if not settings.client_cert:
        return (f"Nomad at {settings.address} refused the TLS handshake: its API requires a client certificate (mTLS);"
                " set NOMAD_CLIENT_CERT and NOMAD_CLIENT_KEY to the CLI certificate from the Nomad bootstrap")
    return f"TLS handshake with Nomad at {settings.address} failed ({detail.splitlines()[0][:160]}); check NOMAD_CLIENT_CERT/NOMAD_CLIENT_KEY were issued by the cluster's CA"


class NomadClient:
    def __init__(self, settings: NomadSettings) -> None:
        self.settings = settings
        self._session = _session(settings)
        # find_dispatch's listings of a parent's children, by (namespace, prefix): when it completed, and the stubs.
        self._listed: dict[tuple[str, str], tuple[float, list[dict[str, Any]]]] = {}
        self._listing = threading.Lock()

    def _api(self, namespace: str | None) -> nomad.Nomad:
        import nomad

        s = self.settings
        verify: bool | str = s.cacert or (not s.skip_verify)
        return nomad.Nomad(
            address=s.address,
            token=s.token,
            namespace=namespace or s.namespace or "default",
            region=s.region,
            timeout=s.timeout_seconds,
            verify=verify,
            cert=(s.client_cert, s.client_key) if s.client_cert and s.client_key else (),
            session=self._session,
        )

    @contextmanager
    def _errors(self, action: str, job_id: str, namespace: str, on_404: str) -> Iterator[None]:
        import nomad.api.exceptions as exc
        import requests

        try:
            yield
        except exc.URLNotFoundNomadException as error:
            missing = f"{action}: Nomad has no job {job_id!r} in namespace {namespace} (404: {_first_line(error.nomad_resp.text)})"
            raise NomadError(f"{missing}; {on_404}" if on_404 else missing) from None
        except exc.URLNotAuthorizedNomadException:
            raise NomadError(f"{action}: Nomad refused the token (403) for namespace {namespace}; set NOMAD_TOKEN to a token whose ACL policy allows this in namespace {namespace}") from None
        except exc.BadRequestNomadException as error:
            raise NomadError(f"{action}: Nomad rejected the request (400: {_first_line(error.nomad_resp.text)}); fix the job file or the --meta values") from None
        except exc.BaseNomadException as error:
            response = error.nomad_resp
            tries = self.settings.retries + 1
            if isinstance(response, requests.exceptions.SSLError):
                raise NomadError(f"{action}: {_tls_advice(str(response), self.settings)}") from None
            if isinstance(response, requests.Response):
                raise NomadError(f"{action}: Nomad at {self.settings.address} answered {response.status_code} after {tries} attempts ({_first_line(response.text)}); retry later or check the servers") from None
            raise NomadError(f"{action}: cannot reach Nomad at {self.settings.address} after {tries} attempts ({type(response).__name__}); check NOMAD_ADDR and that the servers are up") from None

    def plan(self, spec: FinetuneSpec) -> PlanResult:
        """Dry-run placement of one dispatched instance; FailedTGAllocs becomes a sentence."""
        body = placement_probe(render(spec))
        with self._errors("plan", spec.name, spec.namespace, "check the job name"):
            answer = self._api(spec.namespace).job.plan_job(spec.name, body, diff=True)
        reason = explain(answer.get("FailedTGAllocs"), pool=spec.pool.name, gpu=spec.gpu)
        diff = (answer.get("Diff") or {}).get("Type", "None")
        return PlanResult(reason is None, reason, diff, answer.get("Warnings") or "")

    def register(self, spec: FinetuneSpec) -> int:
        """Register (or update) the parameterized job; returns its JobModifyIndex."""
        with self._errors("submit", spec.name, spec.namespace, "check the job name"):
            answer = self._api(spec.namespace).jobs.register_job(render(spec))
        return int(answer.get("JobModifyIndex", 0))

    def dispatch(self, spec: FinetuneSpec, meta: Mapping[str, str], *, role_id: str | None, wrapping_token: str | None,
                 idempotency_token: str, attempt: int = 1) -> DispatchResult:
        """One child run. The token goes in the query string (Nomad reads it only there);
        the wrapping token goes in Meta, and no error message ever echoes the body. A job
        without secrets passes no role_id and no wrapping token (its job declares neither key).
        The attempt number rides in Meta too (the task's GPUFLEET_ATTEMPT, jobs.nomad.render.task_env)."""
        vault = {META_ROLE_ID: role_id, META_WRAPPED_SECRET_ID: wrapping_token} if role_id is not None and wrapping_token is not None else {}
        # The experiment a run belongs to: the caller's (the control plane passes its id), else this dispatch's token.
        body = {"Meta": {EXPERIMENT_META: idempotency_token, **meta, **vault, META_ATTEMPT: str(attempt)}}
        on_404 = f"register it first: gpufleet jobs register {spec.name}"
        with self._errors("dispatch", spec.name, spec.namespace, on_404):
            response = self._api(spec.namespace).job.request(
                quote(spec.name, safe=""), "dispatch", method="post", json=body, params={"idempotency_token": idempotency_token}
            )
        answer = response.json()
        return DispatchResult(answer["DispatchedJobID"], answer.get("EvalID", ""), spec.namespace)

    def tenant_gpus_in_use(self, namespace: str, pool: str) -> int:
        """GPUs the tenant's jobs in ``namespace`` hold or wait for on ``pool``, from Nomad's own
        allocation counts (JobSummary: queued, starting, running, unknown), so runs started
        outside this process count too."""
        from jobs.quota import gpus_held

        with self._errors("quota", "(job list)", namespace, "check the namespace"):
            api = self._api(namespace)
            stubs = api.jobs.request(method="get", params={"namespace": namespace}).json() or []
            active = [s for s in stubs if not s.get("ParameterizedJob") and s.get("Status") != "dead"]
            pairs = [(api.job.request(quote(s["ID"], safe=""), method="get").json(), s.get("JobSummary") or {}) for s in active]
        return gpus_held(pairs, pool=pool)

    def job_allocations(self, job_id: str, namespace: str) -> list[dict[str, Any]]:
        """``GET /v1/job/:id/allocations``: the run's AllocationListStubs (one GET, not ``status``'s three)."""
        with self._errors("allocations", job_id, namespace, "check the run id and the namespace"):
            answer = self._api(namespace).job.request(quote(job_id, safe=""), "allocations", method="get").json()
        return list(answer or [])

    def get(self, path: str, params: Mapping[str, str], *, stream: bool = False, read_timeout_seconds: float | None = None) -> requests.Response:
        """A raw GET through this client's session (retries, TLS, mTLS, token) for endpoints
        python-nomad does not stream (``/v1/client/fs/logs``). Any status comes back; only a
        failure to reach Nomad raises (NomadError, with the TLS advice)."""
        import requests

        s = self.settings
        headers = {"X-Nomad-Token": s.token} if s.token else {}
        query = {**params, **({"region": s.region} if s.region else {})}
        try:
            return self._session.get(f"{s.address}{path}", params=query, headers=headers, stream=stream,
                                     verify=s.cacert or (not s.skip_verify),
                                     cert=(s.client_cert, s.client_key) if s.client_cert and s.client_key else None,
                                     timeout=(s.timeout_seconds, read_timeout_seconds or s.timeout_seconds))
        except requests.exceptions.SSLError as exc:
            raise NomadError(f"logs: {_tls_advice(str(exc), s)}") from None
        except requests.RequestException as exc:
            raise NomadError(f"logs: cannot reach Nomad at {s.address} after {s.retries + 1} attempts ({type(exc).__name__}); "
                             "check NOMAD_ADDR and that the servers are up") from None

    def list_jobs(self, namespace: str, prefix: str) -> list[dict[str, Any]]:
        """``GET /v1/jobs?prefix=&namespace=``: the JobListStubs (api/jobs.go: ID, ParentID, Stop,
        Status, JobSummary, ModifyIndex...) of every job whose ID starts with ``prefix``; for the
        dispatched runs of a parameterized job the prefix is ``<parent>/dispatch-``."""
        with self._errors("list jobs", prefix, namespace, "check the namespace"):
            stubs = self._api(namespace).jobs.request(method="get", params={"namespace": namespace, "prefix": prefix}).json()
        return list(stubs or [])

    def find_dispatch(self, namespace: str, parent: str, idempotency_token: str) -> str | None:
        """The dispatched child of ``parent`` made with ``idempotency_token``, or None: the child
        Job carries ``DispatchIdempotencyToken`` (api/jobs.go Job, Nomad 1.10.5), the list stubs
        do not, so a child is read to be sure. Only the children whose Meta (``meta=true`` on the
        list, command/agent/job_endpoint.go jobListRequest) could be this dispatch's are read: one
        ``dispatch`` made carries ``EXPERIMENT_META`` = the token, or the caller's experiment id, of
        which the control plane's token is the attempt key (``<id>`` or ``<id>.attempt-<n>``,
        experiments.attempts). Reading every child cost one GET per run of the parent per takeover.
        A child this misses (made without that meta) is still never made twice: the submit that
        follows a None sends the same idempotency token, and Nomad answers with the existing child."""
        for stub in self._children_listed(namespace, f"{parent}/dispatch-"):
            mark = str((stub.get("Meta") or {}).get(EXPERIMENT_META, ""))
            if not mark or not (idempotency_token == mark or idempotency_token.startswith(f"{mark}.")):
                continue
            with self._errors("find dispatch", stub["ID"], namespace, "check the namespace"):
                job = self._api(namespace).job.request(quote(stub["ID"], safe=""), method="get").json()
            if job.get("ParentID") == parent and job.get("DispatchIdempotencyToken") == idempotency_token:
                return str(stub["ID"])
        return None

    def _children_listed(self, namespace: str, prefix: str) -> list[dict[str, Any]]:
        """The children's stubs for ``find_dispatch``, one listing for the finds that wait on it: a worker
        that takes over a dead worker's claims finds each of them at once (up to 12, one per dispatch
        thread), and each listed every child of the parent, thousands of stubs each time. A find uses a
        listing that completed after the find began (one it waited on), never one done before it: the
        listing it reads started at most one listing's time before it asked. A child that listing misses
        is still never made twice (``find_dispatch``: the submit that follows sends the same token)."""
        asked = time.monotonic()
        with self._listing:
            done = self._listed.get((namespace, prefix))
            if done is not None and done[0] >= asked:
                return done[1]
            stubs = self._list_jobs_with_meta(namespace, prefix)
            self._listed[(namespace, prefix)] = (time.monotonic(), stubs)
            return stubs

    def list_allocations(self, namespace: str, *, task_states: bool = True) -> list[dict[str, Any]]:
        """``GET /v1/allocations?namespace=&task_states=true``: every AllocationListStub of the
        namespace (api/allocations.go: JobID, ClientStatus, DesiredStatus, NodeName, TaskStates
        with their events, PreemptedByAllocation, CreateIndex, ModifyIndex...): the same stubs
        ``/v1/job/<id>/allocations`` returns, for all runs in one call. ``task_states=False`` leaves
        the task events out (a much smaller answer when only the statuses matter)."""
        with self._errors("list allocations", "(all)", namespace, "check the namespace"):
            stubs = self._api(namespace).allocations.request(
                method="get", params={"namespace": namespace, "task_states": "true" if task_states else "false"}).json()
        return list(stubs or [])

    def list_jobs_with_meta(self, namespace: str) -> list[dict[str, Any]]:
        """``GET /v1/jobs?namespace=&meta=true``: every JobListStub of the namespace with its Meta
        (command/agent/job_endpoint.go jobListRequest parses ``meta``; api JobListStub.Meta)."""
        return self._list_jobs_with_meta(namespace, "")

    def _list_jobs_with_meta(self, namespace: str, prefix: str) -> list[dict[str, Any]]:
        params = {"namespace": namespace, "meta": "true", **({"prefix": prefix} if prefix else {})}
        with self._errors("list jobs", prefix or "(all)", namespace, "check the namespace"):
            stubs = self._api(namespace).jobs.request(method="get", params=params).json()
        return list(stubs or [])

    def allocation_stats(self, alloc_id: str, namespace: str) -> dict[str, Any]:
        """``GET /v1/client/allocation/:alloc_id/stats``: the allocation's AllocResourceUsage (jobs.nomad.usage reads it)."""
        with self._errors("allocation stats", alloc_id, namespace, "the allocation is gone (garbage-collected)"):
            answer = self._api(namespace).client.allocation.request(quote(alloc_id, safe=""), "stats", method="get").json()
        return dict(answer or {})

    def leader(self) -> str:
        """``GET /v1/status/leader`` (no ACL needed): the leader's address, i.e. whether the servers answer."""
        with self._errors("status", "(leader)", self.settings.namespace or "default", "check NOMAD_ADDR"):
            return str(self._api(None).status.leader.request(method="get").json())

    def token_self(self) -> dict[str, Any] | None:
        """``GET /v1/acl/token/self``: the ACL token NOMAD_TOKEN names, or None when the servers run without ACLs.

        hashicorp/nomad command/agent/acl_endpoint.go ``aclTokenSelf`` resolves the request's own
        secret through the ``ACL.ResolveToken`` RPC; nomad/acl_endpoint.go answers
        ``aclDisabled`` (``NewErrRPCCoded(400, "ACL support disabled")``) when ACLs are off and the
        handler a 404 "ACL token not found" for an unknown secret; a token the RPC layer refuses is a
        403 (command/agent/http.go ``errCodeFromHandler``: "Permission denied", "ACL token not found").
        """
        import nomad.api.exceptions as exc

        fix = ("set NOMAD_TOKEN to the SecretID of a valid ACL token (an operator creates one with "
               "`nomad acl token create -policy <policy>`; `nomad acl token self` shows the one in use)")
        try:
            return dict(self._api(None).acl.get_self_token())
        except exc.BadRequestNomadException as error:
            if "ACL support disabled" in error.nomad_resp.text:
                return None
            raise NomadError(f"Nomad at {self.settings.address} rejected the token lookup (400: {_first_line(error.nomad_resp.text)}); {fix}") from None
        except (exc.URLNotAuthorizedNomadException, exc.URLNotFoundNomadException) as error:
            what = "is not set" if not self.settings.token else "is not a token Nomad knows"
            raise NomadError(f"NOMAD_TOKEN {what}: Nomad at {self.settings.address} refused it "
                             f"({error.nomad_resp.status_code}: {_first_line(error.nomad_resp.text)}); {fix}") from None
        except exc.BaseNomadException:
            with self._errors("token", "(self)", self.settings.namespace or "default", "check NOMAD_ADDR"):
                raise

    def status(self, job_id: str, namespace: str, spec: FinetuneSpec | None = None, *, on_404: str = STATUS_ON_404) -> RunStatus:
        """The run's state; ``on_404`` is the advice a missing job's error ends with ("" for none)."""
        path = quote(job_id, safe="")
        with self._errors("status", job_id, namespace, on_404):
            api = self._api(namespace).job
            job = api.request(path, method="get").json()
            evaluations = api.request(path, "evaluations", method="get").json()
            allocations = api.request(path, "allocations", method="get").json()
        pool, gpu = (spec.pool.name, spec.gpu) if spec else (None, None)
        return summarize(job_id, job, evaluations or [], allocations or [], pool=pool, gpu=gpu)

    def read_job(self, job_id: str, namespace: str) -> dict[str, Any] | None:
        """``GET /v1/job/:id``: the Job (Meta, ParentID...), or None when Nomad has no such job."""
        try:
            with self._errors("read job", job_id, namespace, ""):
                return dict(self._api(namespace).job.request(quote(job_id, safe=""), method="get").json())
        except NomadError as exc:
            if "(404" in str(exc):
                return None
            raise

    def stop(self, job_id: str, namespace: str, *, purge: bool) -> str:
        """Stop (and optionally purge) a job; returns the evaluation id Nomad created."""
        with self._errors("stop", job_id, namespace, "it may already be purged; check the id and namespace"):
            params = {"purge": "true"} if purge else {}
            answer = self._api(namespace).job.request(quote(job_id, safe=""), method="delete", params=params).json()
        return str(answer.get("EvalID", ""))

    def server_members(self) -> dict[str, Any]:
        """``GET /v1/agent/members`` (api.ServerMembers: ServerRegion, Members with their serf Tags);
        ACL ``node:read``. What ``jobs.nomad.identity`` names the cluster by."""
        with self._errors("identify the cluster", "(agent members)", "(none)", "check NOMAD_ADDR"):
            return dict(self._api(None).agent.get_members())

    def close(self) -> None:
        self._session.close()

