"""The scheduler-neutral runner: what the control plane (issue 15) uses, for Nomad and GKE alike.

``submit(job, meta, idempotency_key=...) -> run id``, ``status(run id) -> RunReport`` (phase one
of pending / running / succeeded / failed / stopped, with the reason, whether it is placed, and
the exit code when known), ``stop(run id)``, ``usage(run ids, refs)`` (GPU utilization, jobs.usage)
and ``ping()`` (does the scheduler answer). A repeated submit with the same key returns the
same run on both schedulers (Nomad's dispatch idempotency token; the Kubernetes Job named from
the key). Each submit mints its wrapped single-use secret_id(s) with the caller's Vault
environment and hands them straight to the scheduler: never returned, stored or logged.
``logs``/``ranks`` read a run's output per rank (jobs.logs states the contract; jobs.nomad.logs
and jobs.k8s.logs speak each scheduler's API).

Run ids: Nomad ``<namespace>/<dispatched job id>``; GKE ``gke:<namespace>/<run>``.
``Runners`` routes by the job's cluster on submit and by the run id afterwards.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import uuid
from collections import OrderedDict, defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from clusters.schema import SchedulerKind
from jobs.holders import Holder
from jobs.logs import DEFAULT_TAIL_BYTES, LogsFilterRefused, LogsUnavailable
from jobs.spec import FinetuneSpec
from jobs.usage import Usage
from jobs.vault_mint import default_queue_seconds, mint_wrapped_secret_id

if TYPE_CHECKING:
    from jobs.nomad.client import NomadClient
    from jobs.k8s.client import K8sClient, ListBudget
    from jobs.k8s.usage import PrometheusClient

GKE_PREFIX = "gke:"
log = logging.getLogger("gpufleet.jobs.runner")
# Allocation ids the Nomad runner remembers from its polls (so a log read needs no GET of its own).
ALLOCATIONS_REMEMBERED = 10_000


class Phase(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"


TERMINAL = frozenset({Phase.SUCCEEDED, Phase.FAILED, Phase.STOPPED})


@dataclass(frozen=True)
class RunReport:
    phase: Phase
    detail: str
    placed: bool
    exit_code: int | None
    # What the scheduler calls the run's pieces, for people to look them up there:
    # Nomad (job, allocation, node); GKE (job, workload, cluster_queue, flavor).
    refs: tuple[tuple[str, str], ...] = ()
    # The fleet, not the job's own code, ended or requeued the run (jobs.failures: a lost node, an
    # eviction or preemption, a GPU fault); ``cause`` is its short word.
    infrastructure: bool = False
    # The scheduler's own placement and end times (naive UTC), for the cost of a run whose states
    # the reconciler missed (jobs.nomad.status / jobs.k8s.status say which fields).
    placed_at: datetime | None = None
    ended_at: datetime | None = None
    cause: str | None = None


@dataclass(frozen=True)
class Polled:
    """One run in a batch poll: a fingerprint of what the scheduler's lists say about it and,
    unless that equals the fingerprint the caller already knows, what the run is now."""

    fingerprint: str
    report: RunReport | None  # None: unchanged since the known fingerprint
    gone: bool = False  # the scheduler no longer knows the run


def _fingerprint(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


class RunNotFound(Exception):
    """The scheduler no longer knows the run (garbage-collected, purged, or removed after its TTL)."""


class SchedulerUnavailable(Exception):
    """The scheduler could not be asked now (5xx, timeout, refused): retry later."""


class Runner(Protocol):
    scheduler: str

    def submit(self, job: FinetuneSpec, meta: Mapping[str, str], *, idempotency_key: str | None = None, attempt: int = 1) -> str: ...

    def status(self, run_id: str) -> RunReport: ...

    def stop(self, run_id: str) -> None: ...

    def find(self, job: FinetuneSpec, idempotency_key: str) -> str | None: ...


def _confirm_gone(runner: Runner, run_id: str) -> Polled:
    """A run missing from its scheduler's list: ask once by id (Nomad: a 404 means garbage-collected
    or purged; Kubernetes: the Job's own GET says whether it is really gone)."""
    try:
        return Polled("", runner.status(run_id))
    except RunNotFound:
        return Polled("", None, gone=True)


def _refs(**names: str | None) -> tuple[tuple[str, str], ...]:
    return tuple((kind, name) for kind, name in names.items() if name)


class NomadRunner:
    scheduler = "nomad"

    def __init__(self, client: NomadClient, vault_env: Mapping[str, str]) -> None:
        self._client = client
        self._vault_env = dict(vault_env)
        self._registered: set[tuple[str, str, str]] = set()
        self._lock = threading.Lock()
        self._register_lock = threading.Lock()
        self._allocations: OrderedDict[str, str] = OrderedDict()  # run id -> newest allocation seen

    def _ensure_registered(self, job: FinetuneSpec) -> None:
        """Register the parameterized parent once per rendered version (Nomad keeps it), not once
        per dispatch: a service dispatching hundreds of runs of one job re-registers nothing."""
        from jobs.nomad.render import render

        key = (job.namespace, job.name, json.dumps(render(job), sort_keys=True))
        with self._lock:
            if key in self._registered:
                return
        with self._register_lock:  # the dispatcher's threads: the first registers, the others wait and find it done
            with self._lock:
                if key in self._registered:
                    return
            self._client.register(job)
            with self._lock:
                self._registered.add(key)

    def submit(self, job: FinetuneSpec, meta: Mapping[str, str], *, idempotency_key: str | None = None, attempt: int = 1) -> str:
        from jobs.nomad.client import NomadError

        try:
            self._ensure_registered(job)
            wrapped = mint_wrapped_secret_id(job, self._vault_env, expected_queue_seconds=default_queue_seconds(job.pool))
            result = self._client.dispatch(job, meta, role_id=wrapped.role_id if wrapped else None,
                                           wrapping_token=wrapped.wrapping_token if wrapped else None,
                                           idempotency_token=idempotency_key or str(uuid.uuid4()), attempt=attempt)
        except NomadError as exc:
            raise SchedulerUnavailable(str(exc)) from None
        return f"{result.namespace}/{result.dispatched_job_id}"

    def status(self, run_id: str) -> RunReport:
        from jobs.nomad.client import NomadError

        namespace, _, job_id = run_id.partition("/")
        try:
            status = self._client.status(job_id, namespace)
        except NomadError as exc:
            if "(404" in str(exc):
                raise RunNotFound(run_id) from None
            raise SchedulerUnavailable(str(exc)) from None
        self._remember(run_id, status.alloc_id)
        return self._report(namespace, job_id, status)

    def _remember(self, run_id: str, alloc_id: str | None) -> None:
        if alloc_id is None:
            return
        with self._lock:
            self._allocations[run_id] = alloc_id
            self._allocations.move_to_end(run_id)
            while len(self._allocations) > ALLOCATIONS_REMEMBERED:
                self._allocations.popitem(last=False)

    @staticmethod
    def _report(namespace: str, job_id: str, status: Any) -> RunReport:
        from jobs.nomad.status import RunState

        refs = _refs(job=f"{namespace}/{job_id}", allocation=status.alloc_id, node=status.node)
        placed = status.alloc_id is not None
        infra = {"infrastructure": status.infrastructure, "cause": status.cause, "placed_at": status.placed_at, "ended_at": status.ended_at}
        if status.detail.startswith("preempted"):  # Nomad evicted it for a higher-priority job: the run is over
            return RunReport(Phase.FAILED, status.detail, placed, status.exit_code, refs, **infra)
        phase = {RunState.PENDING: Phase.PENDING, RunState.RUNNING: Phase.RUNNING, RunState.FAILED: Phase.FAILED, RunState.LOST: Phase.FAILED}.get(status.state)
        if phase is None:  # complete: a clean exit, or a stop
            phase = Phase.STOPPED if status.detail.startswith("stopped by request") else Phase.SUCCEEDED
        return RunReport(phase, status.detail, placed, status.exit_code, refs, **infra)

    def poll(self, run_ids: Sequence[str], known: Mapping[str, str]) -> dict[str, Polled]:
        """Many runs at once: per namespace one ``GET /v1/allocations`` and per parent job one
        ``GET /v1/jobs?prefix=<parent>/dispatch-``; a run whose job stub and allocations are as
        ``known`` is not asked about again. A changed run with allocations is summarized from
        the listed stubs (the same AllocationListStubs ``status`` reads); only a changed run
        with none (queued: its evaluations say why) costs its own GETs."""
        from jobs.nomad.client import NomadError
        from jobs.nomad.status import summarize

        wanted: dict[str, list[str]] = defaultdict(list)
        for run_id in run_ids:
            namespace, _, job_id = run_id.partition("/")
            wanted[namespace].append(job_id)
        out: dict[str, Polled] = {}
        failures: list[str] = []
        for namespace, job_ids in wanted.items():
            try:
                stubs: dict[str, dict[str, Any]] = {}
                for parent in sorted({job_id.split("/dispatch-", 1)[0] for job_id in job_ids}):
                    stubs.update((stub["ID"], stub) for stub in self._client.list_jobs(namespace, f"{parent}/dispatch-"))
                allocations: dict[str, list[dict[str, Any]]] = defaultdict(list)
                for alloc in self._client.list_allocations(namespace):
                    allocations[alloc.get("JobID", "")].append(alloc)
            except NomadError as exc:  # this namespace only (e.g. an ACL token without list there): its runs get no answer
                failures.append(str(exc))
                log.warning("poll of Nomad namespace %s failed; its %d runs get no answer this pass: %s", namespace, len(job_ids), exc)
                continue
            for job_id in job_ids:
                run_id, stub, mine = f"{namespace}/{job_id}", stubs.get(job_id), allocations.get(job_id, [])
                try:
                    if stub is None:
                        out[run_id] = _confirm_gone(self, run_id)
                        continue
                    fingerprint = _fingerprint(
                        [stub.get(k) for k in ("Status", "Stop", "ModifyIndex", "JobModifyIndex")], stub.get("JobSummary"),
                        sorted([a.get("ID"), a.get("ClientStatus"), a.get("DesiredStatus"), a.get("ModifyIndex"), a.get("PreemptedByAllocation"),
                                a.get("NextAllocation"), a.get("DesiredTransition"),
                                sum(len(t.get("Events") or []) for t in (a.get("TaskStates") or {}).values())] for a in mine))
                    if known.get(run_id) == fingerprint:
                        out[run_id] = Polled(fingerprint, None)
                    elif mine:
                        status = summarize(job_id, stub, [], mine)
                        self._remember(run_id, status.alloc_id)
                        out[run_id] = Polled(fingerprint, self._report(namespace, job_id, status))
                    else:
                        out[run_id] = Polled(fingerprint, self.status(run_id))
                except SchedulerUnavailable as exc:  # this run's own GET failed: no answer for it alone
                    log.warning("poll of Nomad run %s failed: %s", run_id, exc)
        if failures and not out:
            raise SchedulerUnavailable(failures[0])
        return out

    def identity(self) -> str:
        """Which cluster answers at this client's address (``jobs.nomad.identity``)."""
        from jobs.nomad.client import NomadError
        from jobs.nomad.identity import identity

        try:
            return identity(self._client.server_members())
        except (NomadError, ValueError) as exc:
            raise SchedulerUnavailable(str(exc)) from None

    def usage(self, run_ids: Sequence[str], refs: Mapping[str, Mapping[str, str]]) -> dict[str, Usage]:
        """Each run's allocation stats (one GET each: the caller bounds and rotates them); a run
        without a known allocation is unknown."""
        from jobs.nomad.usage import sample

        allocations = {r: (r.partition("/")[0], alloc) for r in run_ids if (alloc := (refs.get(r) or {}).get("allocation"))}
        return sample(self._client, allocations) if allocations else {}

    def ping(self) -> None:
        """Raises SchedulerUnavailable unless the Nomad servers answer."""
        from jobs.nomad.client import NomadError

        try:
            self._client.leader()
        except NomadError as exc:
            raise SchedulerUnavailable(str(exc)) from None

    def stop(self, run_id: str) -> None:
        from jobs.nomad.client import NomadError

        namespace, _, job_id = run_id.partition("/")
        try:
            self._client.stop(job_id, namespace, purge=False)
        except NomadError as exc:
            if "(404" in str(exc):
                return  # already gone: nothing is billing
            raise SchedulerUnavailable(str(exc)) from None

    def find(self, job: FinetuneSpec, idempotency_key: str) -> str | None:
        """The run a submit with ``idempotency_key`` made, if any reached Nomad (its answer may have been lost)."""
        from jobs.nomad.client import NomadError

        try:
            child = self._client.find_dispatch(job.namespace, job.name, idempotency_key)
        except NomadError as exc:
            if "(404" in str(exc):
                return None  # the parent itself is gone: no child of it runs
            raise SchedulerUnavailable(str(exc)) from None
        return f"{job.namespace}/{child}" if child else None

    def holders(self, cluster: str, namespaces: Sequence[str]) -> list[Holder]:
        """Allocations of gpufleet's runs of ``cluster`` holding GPUs now, every namespace in two list calls (jobs.nomad.holders)."""
        from jobs.nomad.client import NomadError
        from jobs.nomad.holders import holders

        try:
            return holders(self._client, cluster)
        except NomadError as exc:
            raise SchedulerUnavailable(str(exc)) from None

    def ours(self, run_id: str, cluster: str) -> bool:
        """Read again right before a stop: the run is a dispatched child of a gpufleet job of ``cluster``."""
        from jobs.nomad.client import NomadError
        from jobs.nomad.holders import ours

        namespace, _, job_id = run_id.partition("/")
        try:
            return ours(self._client.read_job(job_id, namespace), cluster)
        except NomadError as exc:
            raise SchedulerUnavailable(str(exc)) from None

    def ranks(self, run_id: str) -> tuple[int, ...]:
        """One: Nomad runs are single-node (jobs.checks refuses nodes > 1 on Nomad)."""
        return (0,)

    def logs(self, run_id: str, *, rank: int = 0, stderr: bool = False, tail_bytes: int = DEFAULT_TAIL_BYTES, tail_lines: int | None = None,
             since_seconds: int | None = None, follow: bool = False, stop: threading.Event | None = None) -> Iterator[bytes]:
        """The run's allocation's task log (jobs.nomad.logs): the newest allocation of the job."""
        if rank != 0:
            raise LogsFilterRefused(f"run {run_id} has one rank on Nomad (rank 0); drop --rank {rank}")
        if since_seconds is not None:
            raise LogsFilterRefused("Nomad's logs API has no time filter (its log files carry no timestamps); use --tail N instead of --since")
        return self._logs(run_id, stderr=stderr, tail_bytes=tail_bytes, tail_lines=tail_lines, follow=follow, stop=stop or threading.Event())

    def _allocation(self, run_id: str) -> str | None:
        """The run's newest allocation: as its last poll saw it, else from its own GET."""
        from jobs.nomad.client import NomadError

        with self._lock:
            if (known := self._allocations.get(run_id)) is not None:
                return known
        namespace, _, job_id = run_id.partition("/")
        try:
            allocations = self._client.job_allocations(job_id, namespace)
        except NomadError as exc:
            if "(404" in str(exc):
                raise RunNotFound(run_id) from None
            raise SchedulerUnavailable(str(exc)) from None
        latest = max(allocations, key=lambda a: (a.get("CreateIndex", 0), a.get("ID", "")), default=None)
        self._remember(run_id, latest["ID"] if latest else None)
        return latest["ID"] if latest else None

    def _logs(self, run_id: str, *, stderr: bool, tail_bytes: int, tail_lines: int | None, follow: bool, stop: threading.Event) -> Iterator[bytes]:
        from jobs.nomad import logs as nomad_logs
        from jobs.nomad.client import NomadError

        try:
            alloc_id = self._allocation(run_id)
            while alloc_id is None and follow and not stop.is_set():  # not placed yet: wait for it
                yield b""
                stop.wait(1.0)
                alloc_id = self._allocation(run_id)
            if alloc_id is None:
                return
            if not follow:
                yield nomad_logs.read_tail(self._client, alloc_id, stderr=stderr, tail_bytes=tail_bytes)
                return
            yield from nomad_logs.follow(self._client, alloc_id, stderr=stderr, tail_bytes=tail_bytes, tail_lines=tail_lines, stop=stop)
        except nomad_logs.AllocationGone:
            with self._lock:  # the next read asks Nomad which allocation is newest (it may have been rescheduled)
                self._allocations.pop(run_id, None)
            raise RunNotFound(run_id) from None
        except NomadError as exc:
            raise SchedulerUnavailable(str(exc)) from None


class GkeRunner:
    scheduler = "gke"
    # Per namespace and reconcile pass: items its tracked lists may decode and bytes they may
    # read (per tracked run, plus a page), seconds they may take, and GETs for runs those lists
    # did not reach. A namespace whose lists spent their budget is polled after the others next
    # pass, within ``overrun_share`` of the budget, until its lists complete again.
    objects_per_run = 4
    objects_per_namespace = 200
    bytes_per_run = 64 * 1024
    bytes_per_namespace = 4 * 1024 * 1024
    namespace_seconds = 5.0
    overrun_share = 0.5
    fallback_gets = 20

    def __init__(self, client: K8sClient, vault_env: Mapping[str, str], *, prometheus: PrometheusClient | None = None) -> None:
        self._client = client
        self._vault_env = dict(vault_env)
        self._prometheus = prometheus
        self._overran: set[str] = set()
        # What each namespace's lists cost in the last poll, in the order they were polled.
        self.last_poll: dict[str, ListBudget] = {}

    @staticmethod
    def _split(run_id: str) -> tuple[str, str]:
        namespace, _, run = run_id.removeprefix(GKE_PREFIX).partition("/")
        return namespace, run

    def submit(self, job: FinetuneSpec, meta: Mapping[str, str], *, idempotency_key: str | None = None, attempt: int = 1) -> str:
        from jobs.k8s.client import K8sError
        from jobs.k8s.dispatch import RankMinter

        mint = RankMinter(job, self._vault_env, queue_seconds=default_queue_seconds(job.pool))
        try:
            result = self._client.dispatch(job, dict(meta), dispatch_id=idempotency_key or str(uuid.uuid4()), mint=mint, attempt=attempt)
        except K8sError as exc:
            raise SchedulerUnavailable(str(exc)) from None
        return f"{GKE_PREFIX}{result.namespace}/{result.run}"

    def status(self, run_id: str) -> RunReport:
        from jobs.k8s.client import K8sError, K8sRunGone

        try:
            status = self._client.status(*self._split(run_id))
        except K8sRunGone:
            raise RunNotFound(run_id) from None
        except K8sError as exc:
            raise SchedulerUnavailable(str(exc)) from None
        return self._report(self._split(run_id)[0], self._disruption(self._split(run_id)[0], status))

    def _disruption(self, namespace: str, status: Any) -> Any:
        """A Job failed by its DisruptionTarget rule: which disruption, from its pods' condition reason
        (one pod list, only for such a failure; jobs.k8s.status.disruption_cause)."""
        import dataclasses

        from jobs import failures
        from jobs.k8s.client import K8sError
        from jobs.k8s.logs import JOB_NAME_LABEL
        from jobs.k8s.status import disruption_cause

        if status.cause != failures.disruption(""):
            return status
        try:
            pods = self._client.list_pods(namespace, f"{JOB_NAME_LABEL}={status.run}")
        except K8sError as exc:
            log.warning("reading the disrupted pods of %s/%s failed (the cause stays unknown): %s", namespace, status.run, exc)
            return status
        return dataclasses.replace(status, cause=disruption_cause(pods) or status.cause)

    @staticmethod
    def _report(namespace: str, status: Any) -> RunReport:
        """Admitted by Kueue but not every rank ready yet (nodes scaling up, images pulling) is
        pending and placed, which the control plane calls provisioning; all ranks ready is running."""
        refs = _refs(job=f"{namespace}/{status.run}", workload=status.workload and f"{namespace}/{status.workload}",
                     cluster_queue=status.queue, flavor=status.flavor)
        phase = Phase(status.state.value)
        if phase == Phase.RUNNING and status.ready < status.ranks:
            phase = Phase.PENDING
        return RunReport(phase, status.reason, status.placed, status.exit_code, refs, status.infrastructure,
                         placed_at=status.placed_at, ended_at=status.ended_at, cause=status.cause)

    def poll(self, run_ids: Sequence[str], known: Mapping[str, str]) -> dict[str, Polled]:
        """Many runs at once: per namespace the Jobs of exactly these run names and their Kueue
        Workloads, selected by value and paginated (``K8sClient.list_tracked``) within a budget
        per namespace (items decoded, seconds), so objects a tenant labels like gpufleet's cost
        only that tenant's namespace. A run whose Job and Workload resourceVersions are as
        ``known`` is reported unchanged. A run the lists did not reach (budget spent) is read by
        its own GET, at most ``fallback_gets`` per namespace per pass, least recently reconciled
        first (the order of ``run_ids``); the rest get no answer this pass, never "gone"."""
        from jobs.k8s.client import JOB_UID_LABEL, K8sError, ListBudget
        from jobs.k8s.status import summarize

        wanted: dict[str, list[str]] = defaultdict(list)
        for run_id in run_ids:
            namespace, run = self._split(run_id)
            wanted[namespace].append(run)
        out: dict[str, Polled] = {}
        failures: list[str] = []
        self.last_poll = {}
        overran, self._overran = self._overran, set()
        for namespace in sorted(wanted, key=lambda ns: ns in overran):  # stable: the others first, in run order
            runs = wanted[namespace]
            share = self.overrun_share if namespace in overran else 1.0
            budget = ListBudget(max_objects=int(share * (self.objects_per_run * len(runs) + self.objects_per_namespace)),
                                max_seconds=share * self.namespace_seconds,
                                max_bytes=int(share * (self.bytes_per_run * len(runs) + self.bytes_per_namespace)))
            self.last_poll[namespace] = budget
            try:
                listing = self._client.list_tracked(namespace, runs, budget)
            except K8sError as exc:  # this namespace only (e.g. no list RBAC there): its runs get no answer
                failures.append(str(exc))
                log.warning("poll of Kubernetes namespace %s failed; its %d runs get no answer this pass: %s", namespace, len(runs), exc)
                continue
            if not (listing.jobs_complete and listing.workloads_complete):
                self._overran.add(namespace)
                log.warning("poll of Kubernetes namespace %s stopped at its budget (%d objects, %d bytes, %.1fs; objects labelled like gpufleet's?): "
                            "runs it did not reach are read one by one, at most %d this pass; it is polled after the others until its lists "
                            "complete", namespace, budget.objects, budget.bytes, budget.clock() - budget.started, self.fallback_gets)
            by_uid: dict[str, list[dict[str, Any]]] = defaultdict(list)
            for workload in listing.workloads:
                by_uid[(workload["metadata"].get("labels") or {}).get(JOB_UID_LABEL, "")].append(workload)
            gets = 0
            for run in runs:
                run_id, job = f"{GKE_PREFIX}{namespace}/{run}", listing.jobs.get(run)
                if job is None or not (listing.workloads_complete or job["metadata"]["uid"] in by_uid):
                    if not (job is None and listing.jobs_complete):  # the lists did not reach it
                        if gets >= self.fallback_gets:
                            continue  # no answer this pass; asked first next pass
                        gets += 1
                    try:  # its own GET (for a Job missing from a complete list: whether it is really gone)
                        out[run_id] = _confirm_gone(self, run_id)
                    except SchedulerUnavailable as exc:  # its own GET failed: no answer for it alone
                        log.warning("poll of Kubernetes run %s failed: %s", run_id, exc)
                    continue
                mine = by_uid.get(job["metadata"]["uid"], [])
                fingerprint = _fingerprint(job["metadata"].get("resourceVersion"), sorted(w["metadata"].get("resourceVersion") or "" for w in mine))
                if known.get(run_id) == fingerprint:
                    out[run_id] = Polled(fingerprint, None)
                    continue
                out[run_id] = Polled(fingerprint, self._report(namespace, self._disruption(namespace, summarize(job, mine))))
        if failures and not out:
            raise SchedulerUnavailable(failures[0])
        return out

    def identity(self) -> str:
        """Which cluster answers through this client's context (``jobs.k8s.identity``)."""
        from jobs.k8s.client import K8sError
        from jobs.k8s.identity import identity

        try:
            return identity(self._client.cluster_namespace())
        except (K8sError, ValueError) as exc:
            raise SchedulerUnavailable(str(exc)) from None

    def usage(self, run_ids: Sequence[str], refs: Mapping[str, Mapping[str, str]]) -> dict[str, Usage]:
        """DCGM metrics of every asked run in one Prometheus query; unknown without GPUFLEET_PROMETHEUS_URL."""
        from jobs.k8s.usage import sample

        if self._prometheus is None:
            return {}
        runs: dict[str, list[str]] = defaultdict(list)
        for run_id in run_ids:
            namespace, run = self._split(run_id)
            runs[namespace].append(run)
        return {f"{GKE_PREFIX}{namespace}/{run}": usage for (namespace, run), usage in sample(self._prometheus, runs).items()}

    def ping(self) -> None:
        """Raises SchedulerUnavailable unless the Kubernetes API answers (GET /version)."""
        from jobs.k8s.client import K8sError

        try:
            self._client.version()
        except K8sError as exc:
            raise SchedulerUnavailable(str(exc)) from None

    def stop(self, run_id: str) -> None:
        from jobs.k8s.client import K8sError, K8sRunGone

        try:
            self._client.stop(*self._split(run_id))
        except K8sRunGone:
            return  # already gone: nothing is billing
        except K8sError as exc:
            raise SchedulerUnavailable(str(exc)) from None

    def find(self, job: FinetuneSpec, idempotency_key: str) -> str | None:
        """The Job a submit with ``idempotency_key`` made (its name derives from the key), only if
        its dispatch-id annotation says so: a same-named Job of someone else is never ours."""
        from jobs.k8s.client import K8sError
        from jobs.k8s.render import run_name
        from jobs.k8s.status import dispatch_id

        name = run_name(job.name, idempotency_key)
        try:
            found = self._client.get_job(job.namespace, name)
        except K8sError as exc:
            raise SchedulerUnavailable(str(exc)) from None
        return f"{GKE_PREFIX}{job.namespace}/{name}" if found is not None and dispatch_id(found) == idempotency_key else None

    def holders(self, cluster: str, namespaces: Sequence[str]) -> list[Holder]:
        """Pods of gpufleet's runs holding GPUs now, one pod list per namespace (jobs.k8s.holders)."""
        from jobs.k8s.client import K8sError
        from jobs.k8s.holders import holders

        try:
            return holders(self._client, list(namespaces), GKE_PREFIX)
        except K8sError as exc:
            raise SchedulerUnavailable(str(exc)) from None

    def ours(self, run_id: str, cluster: str) -> bool:
        """Read again right before a stop: the Job exists with gpufleet's dispatch annotation and ``cluster``'s label."""
        from jobs.k8s.client import K8sError
        from jobs.k8s.holders import owned_job

        try:
            return owned_job(self._client, *self._split(run_id), cluster)
        except K8sError as exc:
            raise SchedulerUnavailable(str(exc)) from None

    def ranks(self, run_id: str) -> tuple[int, ...]:
        """The completion indexes of the run's pods (one list call); before its pods exist,
        0 .. completions-1 of its Job (RunNotFound once the Job is gone)."""
        return tuple(sorted(self._pods(run_id) or dict.fromkeys(self._planned(run_id))))

    def _pods(self, run_id: str) -> dict[int, str]:
        from jobs.k8s import logs as k8s_logs
        from jobs.k8s.client import K8sError

        try:
            return k8s_logs.rank_pods(self._client, *self._split(run_id))
        except K8sError as exc:
            raise SchedulerUnavailable(str(exc)) from None

    def _planned(self, run_id: str) -> range:
        from jobs.k8s.client import K8sError

        try:
            job = self._client.get_job(*self._split(run_id))
        except K8sError as exc:
            raise SchedulerUnavailable(str(exc)) from None
        if job is None:
            raise RunNotFound(run_id)
        return range(int((job.get("spec") or {}).get("completions") or 1))

    def logs(self, run_id: str, *, rank: int = 0, stderr: bool = False, tail_bytes: int = DEFAULT_TAIL_BYTES, tail_lines: int | None = None,
             since_seconds: int | None = None, follow: bool = False, stop: threading.Event | None = None) -> Iterator[bytes]:
        """The rank's pod log (jobs.k8s.logs); stdout and stderr are one stream on Kubernetes."""
        if stderr:
            raise LogsFilterRefused("Kubernetes keeps a container's stdout and stderr as one log; drop --stderr to see both")
        pod = self._pods(run_id).get(rank)
        if pod is None and rank not in (planned := self._planned(run_id)):
            raise LogsFilterRefused(f"run {run_id} has ranks 0..{len(planned) - 1}; pick --rank from those")
        return self._logs(run_id, rank, pod, tail_bytes=tail_bytes, tail_lines=tail_lines, since_seconds=since_seconds, follow=follow,
                          stop=stop or threading.Event())

    def _logs(self, run_id: str, rank: int, pod: str | None, *, tail_bytes: int, tail_lines: int | None, since_seconds: int | None,
              follow: bool, stop: threading.Event) -> Iterator[bytes]:
        from jobs.k8s import logs as k8s_logs
        from jobs.k8s.client import K8sError, K8sRunGone

        namespace, _ = self._split(run_id)
        try:
            while pod is None and follow and not stop.is_set():  # not admitted yet: its pods do not exist
                yield b""
                stop.wait(1.0)
                self._planned(run_id)  # RunNotFound once the Job is gone
                pod = self._pods(run_id).get(rank)
            if pod is None:
                return
            if not follow:
                yield k8s_logs.read_tail(self._client, namespace, pod, tail_bytes=tail_bytes, since_seconds=since_seconds)
                return
            yield from k8s_logs.follow(self._client, namespace, pod, tail_lines=tail_lines, since_seconds=since_seconds, stop=stop)
        except K8sRunGone:
            raise RunNotFound(run_id) from None
        except K8sError as exc:
            raise SchedulerUnavailable(str(exc)) from None


class Runners:
    """One Runner over both schedulers: submit by the job's cluster, status/stop by the run id."""

    scheduler = "any"

    def __init__(self, *, nomad: Runner | None = None, gke: Runner | None = None) -> None:
        self._nomad, self._gke = nomad, gke

    def _pick(self, gke: bool) -> Runner:
        runner = self._gke if gke else self._nomad
        if runner is None:
            raise SchedulerUnavailable(f"no {'GKE' if gke else 'Nomad'} runner is configured")
        return runner

    def submit(self, job: FinetuneSpec, meta: Mapping[str, str], *, idempotency_key: str | None = None, attempt: int = 1) -> str:
        return self._pick(job.scheduler == SchedulerKind.GKE).submit(job, meta, idempotency_key=idempotency_key, attempt=attempt)

    def status(self, run_id: str) -> RunReport:
        return self._pick(run_id.startswith(GKE_PREFIX)).status(run_id)

    def stop(self, run_id: str) -> None:
        self._pick(run_id.startswith(GKE_PREFIX)).stop(run_id)

    def find(self, job: FinetuneSpec, idempotency_key: str) -> str | None:
        return self._pick(job.scheduler == SchedulerKind.GKE).find(job, idempotency_key)

    def ranks(self, run_id: str) -> tuple[int, ...]:
        from jobs.logs import ranks

        return ranks(self._pick(run_id.startswith(GKE_PREFIX)), run_id)

    def logs(self, run_id: str, **options: Any) -> Iterator[bytes]:
        runner = self._pick(run_id.startswith(GKE_PREFIX))
        if getattr(runner, "logs", None) is None:
            raise LogsUnavailable(f"reading logs from {runner.scheduler} is not supported")
        return runner.logs(run_id, **options)  # type: ignore[attr-defined,no-any-return]

    def usage(self, run_ids: Sequence[str], refs: Mapping[str, Mapping[str, str]]) -> dict[str, Usage]:
        """Each scheduler's runs through its own ``usage``; a scheduler whose metrics source is down
        leaves its runs unknown without holding up the other's (UsageUnavailable only if all failed)."""
        from jobs.usage import UsageUnavailable

        out: dict[str, Usage] = {}
        failures: list[UsageUnavailable] = []
        for gke in (False, True):
            mine = [r for r in run_ids if r.startswith(GKE_PREFIX) == gke]
            runner = self._gke if gke else self._nomad
            if not mine or runner is None or getattr(runner, "usage", None) is None:
                continue
            try:
                out.update(runner.usage(mine, refs))
            except UsageUnavailable as exc:
                failures.append(exc)
        if failures and not out:
            raise failures[0]
        return out

    def holders(self, cluster: str, namespaces: Sequence[str], *, gke: bool) -> list[Holder]:
        return self._pick(gke).holders(cluster, namespaces)  # type: ignore[attr-defined, no-any-return]

    def ours(self, run_id: str, cluster: str) -> bool:
        return self._pick(run_id.startswith(GKE_PREFIX)).ours(run_id, cluster)  # type: ignore[attr-defined, no-any-return]

    def health(self) -> dict[str, str | None]:
        """Scheduler kind -> None if it answers, else why not."""
        out: dict[str, str | None] = {}
        for kind, runner in (("nomad", self._nomad), ("gke", self._gke)):
            if runner is None:
                continue
            try:
                runner.ping()
                out[kind] = None
            except SchedulerUnavailable as exc:
                out[kind] = str(exc)
        return out

    def poll(self, run_ids: Sequence[str], known: Mapping[str, str]) -> dict[str, Polled]:
        """Each scheduler's runs through its own batch poll (list calls, not a GET per run). One
        scheduler being down leaves its runs out of the answer (asked again next pass) without
        holding up the other's; only when every scheduler asked failed is that an error."""
        out: dict[str, Polled] = {}
        failures: list[SchedulerUnavailable] = []
        for gke in (False, True):
            mine = [r for r in run_ids if r.startswith(GKE_PREFIX) == gke]
            if not mine:
                continue
            try:
                out.update(poll(self._pick(gke), mine, known))
            except SchedulerUnavailable as exc:
                failures.append(exc)
        if failures and not out:
            raise failures[0]
        return out


def same_scheduler(recorded: str, answering: str) -> bool:
    """Two identities (``Runner.identity``) name the same cluster, by the rule of its scheduler."""
    from jobs.k8s import identity as k8s_identity
    from jobs.nomad import identity as nomad_identity

    for side in (nomad_identity, k8s_identity):
        if recorded.startswith(f"{side.PREFIX} ") and answering.startswith(f"{side.PREFIX} "):
            return side.same(recorded, answering)
    return False


def next_record(recorded: str, answering: str) -> str:
    """The identity to record after ``same_scheduler`` said yes: by the rule of its scheduler,
    never more than a minority changed in one step (``jobs.nomad.identity.follow``)."""
    from jobs.k8s import identity as k8s_identity
    from jobs.nomad import identity as nomad_identity

    for side in (nomad_identity, k8s_identity):
        if recorded.startswith(f"{side.PREFIX} ") and answering.startswith(f"{side.PREFIX} "):
            return side.follow(recorded, answering)
    return recorded


def poll(runner: Runner, run_ids: Sequence[str], known: Mapping[str, str]) -> dict[str, Polled]:
    """``runner.poll`` where the runner has one; else one ``status`` per run (never 'unchanged')."""
    batch = getattr(runner, "poll", None)
    if batch is not None:
        return dict(batch(run_ids, known))
    out: dict[str, Polled] = {}
    for run_id in run_ids:
        try:
            out[run_id] = Polled("", runner.status(run_id))
        except RunNotFound:
            out[run_id] = Polled("", None, gone=True)
    return out
