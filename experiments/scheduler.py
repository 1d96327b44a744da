"""Which scheduler runs an experiment: each job goes to its own cluster's scheduler.

``gpufleet serve`` binds at most one Nomad cluster (NOMAD_ADDR...) and one GKE cluster (a
kubeconfig context, or the in-cluster service account) by name. ``ClusterRunners`` routes a
submit by the job file's cluster and refuses a job of any cluster it is not bound to: a
kubeconfig context points at one cluster, and a research job of ``dev-gke`` must never be
created (and billed) on ``prod-gke`` because that is where the context happened to point.
Status and stop route by the run id (``gke:<ns>/<run>`` or ``<ns>/<job>``), which does not
name the cluster: so the reconciler, the reaper and cancels act only on experiments whose
``cluster`` is bound here (``not_bound``/``bound_clause``). A service restarted against another
cluster (or a second service sharing the database) leaves the other cluster's runs alone:
never polled there, stopped, failed as "gone" or freed from quota; their reason says so and
``gpufleet_experiments_not_bound`` counts them. Admission refuses unbound clusters up front
(422 with the fix), so nothing waits in the outbox for a runner that does not exist.

A name is not enough: ``experiments.binding`` checks that the scheduler answering for each bound
cluster is the one that cluster's runs were made on, and keeps a cluster in ``blocked`` (treated
like an unbound one here) until it is, or while it is not.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import ColumnElement, and_, false, or_

from clusters.errors import UserError
from clusters.schema import ClusterConfig, SchedulerKind
from jobs.runner import GkeRunner, NomadRunner, Runner, Runners, SchedulerUnavailable
from jobs.spec import FinetuneSpec


class ClusterRunners(Runners):
    """``jobs.runner.Runners`` bound to named clusters: ``clusters`` maps cluster -> scheduler."""

    def __init__(self, *, nomad: tuple[str, Runner] | None = None, gke: tuple[str, Runner] | None = None) -> None:
        super().__init__(nomad=nomad[1] if nomad else None, gke=gke[1] if gke else None)
        self.clusters: dict[str, str] = {}
        # The runner of each bound cluster that can say which scheduler answers (``Runner.identity``).
        self.members: dict[str, Runner] = {}
        for bound, kind in ((nomad, SchedulerKind.NOMAD), (gke, SchedulerKind.GKE)):
            if bound:
                self.clusters[bound[0]] = kind.value
                if hasattr(bound[1], "identity"):
                    self.members[bound[0]] = bound[1]
        # Clusters this service must not act on yet (``experiments.binding``): cluster -> why.
        self.blocked: dict[str, str] = {name: f"unobserved: this service has not yet confirmed which {self.clusters[name]} scheduler answers "
                                        f"for cluster {name}" for name in self.members}
        self.identity_checked: dict[str, float] = {}
        self.identity_lock = threading.Lock()

    def _refuse(self, job: FinetuneSpec) -> None:
        if self.clusters.get(job.cluster) != job.scheduler.value:
            # Admission refuses these first; this guards a cluster file edited after acceptance.
            raise SchedulerUnavailable(f"this service is not bound to cluster {job.cluster} ({job.scheduler.value}); bound: {describe(self.clusters)}")
        if why := self.blocked.get(job.cluster):
            raise SchedulerUnavailable(why)

    def submit(self, job: FinetuneSpec, meta: Mapping[str, str], *, idempotency_key: str | None = None, attempt: int = 1) -> str:
        self._refuse(job)
        return super().submit(job, meta, idempotency_key=idempotency_key, attempt=attempt)

    def find(self, job: FinetuneSpec, idempotency_key: str) -> str | None:
        self._refuse(job)
        return super().find(job, idempotency_key)


LOCAL = "local"


def bound_to(runner: Any) -> Mapping[str, str] | None:
    """The clusters (name -> scheduler) ``runner`` is bound to; None for a bare runner of one
    scheduler without cluster names (a NomadRunner in tests): it follows every run. The local
    development runner is bound to no cluster at all: it follows only the runs it ran itself
    (scheduler ``local``), never a Nomad or GKE run a production service shares the database with."""
    return getattr(runner, "clusters", None)


def is_local(runner: Any) -> bool:
    return getattr(runner, "scheduler", None) == LOCAL


def run_scheduler(runner: Any) -> str:
    """What a run this service admits records as its scheduler: a local runner's runs name that
    runner (``local:<instance>``), since only the process that started a task can follow it; two
    local services on one database then never poll, fail or free each other's runs (red team 22:
    the second one failed the first one's live run as gone and freed its quota)."""
    return f"{LOCAL}:{runner.instance}" if is_local(runner) else getattr(runner, "scheduler", "")


def not_bound(runner: Any, cluster: str, scheduler: str) -> str | None:
    """Why this service must not act on a run of ``cluster`` (None: it may)."""
    if is_local(runner):
        if scheduler == run_scheduler(runner):
            return None
        if scheduler == LOCAL or scheduler.startswith(f"{LOCAL}:"):
            return ("unobserved: another --scheduler local service ran this job on its own machine and follows it; this one cannot see"
                    " its process, so the run is not polled, stopped or failed from here (its quota stays held)")
        option = "--gke-cluster" if scheduler == SchedulerKind.GKE.value else "--nomad-cluster"
        return (f"unobserved: this service runs jobs on this machine (--scheduler local) and does not follow {scheduler} runs: the run on "
                f"{cluster} is not polled, stopped or failed from here; the service started with {option} {cluster} follows it")
    clusters = bound_to(runner)
    if clusters is None:
        return None
    if clusters.get(cluster) == scheduler:
        return getattr(runner, "blocked", {}).get(cluster)
    option = "--gke-cluster" if scheduler == SchedulerKind.GKE.value else "--nomad-cluster"
    return (f"unobserved: cluster {cluster} ({scheduler}) is not bound to this service (bound: {describe(clusters)}): its run is not "
            f"polled, stopped or failed from here; the service started with {option} {cluster} follows it")


def bound_clause(runner: Any, cluster: Any, scheduler: Any) -> ColumnElement[bool] | None:
    """SQL: the experiment's (cluster, scheduler) is bound to ``runner``; None: every one is."""
    if is_local(runner):
        return scheduler == run_scheduler(runner)
    clusters = bound_to(runner)
    if clusters is None:
        return None
    blocked = getattr(runner, "blocked", {})
    return or_(false(), *(and_(cluster == name, scheduler == kind) for name, kind in clusters.items() if name not in blocked))


def describe(clusters: Mapping[str, str]) -> str:
    return ", ".join(f"{name} ({kind})" for name, kind in sorted(clusters.items())) or "none"


def _pick(configs: Sequence[ClusterConfig], kind: SchedulerKind, name: str | None, option: str) -> str | None:
    names = sorted(c.name for c in configs if c.scheduler == kind)
    if name is None:
        return names[0] if kind == SchedulerKind.NOMAD and len(names) == 1 else None
    if name not in names:
        raise UserError(f"{option} {name!r} is not a {kind.value} cluster in clusters/; allowed: {', '.join(names) or 'none'}")
    return name


def build_runners(configs: Sequence[ClusterConfig], vault_env: Mapping[str, str], *, nomad_cluster: str | None, gke_cluster: str | None,
                  environ: Mapping[str, str] = os.environ) -> ClusterRunners:
    """Nomad: ``nomad_cluster``, or the only Nomad cluster of clusters/. GKE: only when named
    (``--gke-cluster``), with the kubeconfig context GPUFLEET_KUBE_CONTEXT (default the current
    one) or the in-cluster service account; its credentials are loaded now, so a service that
    cannot reach its cluster fails at start, not at the first dispatch."""
    from jobs.nomad.client import NomadClient, NomadSettings

    # The only Nomad cluster is bound by default only where NOMAD_ADDR says where its servers are.
    nomad_name = _pick(configs, SchedulerKind.NOMAD, nomad_cluster, "--nomad-cluster") if nomad_cluster or environ.get("NOMAD_ADDR") else None
    gke_name = _pick(configs, SchedulerKind.GKE, gke_cluster, "--gke-cluster")
    nomad: tuple[str, Any] | None = None
    gke: tuple[str, Any] | None = None
    if not nomad_name and not gke_name:
        raise UserError("this service is bound to no scheduler: set NOMAD_ADDR (and NOMAD_TOKEN, NOMAD_CACERT...) for the Nomad "
                        "cluster, or --gke-cluster NAME with a kubeconfig context, or run gpufleet serve --scheduler local for development")
    if nomad_name:
        if not environ.get("NOMAD_ADDR"):
            # Without it every run would be retried against 127.0.0.1:4646 until it failed as stuck.
            raise UserError(f"cluster {nomad_name} (nomad) is bound to this service but NOMAD_ADDR is not set; set NOMAD_ADDR "
                            "(with NOMAD_TOKEN, NOMAD_CACERT, NOMAD_CLIENT_CERT/KEY) to its servers, or run gpufleet serve "
                            "--scheduler local for development")
        nomad = (nomad_name, NomadRunner(NomadClient(NomadSettings.from_env(environ)), vault_env))
    if gke_name:
        from jobs.k8s.client import K8sClient, K8sSettings
        from jobs.k8s.usage import PrometheusClient, PrometheusSettings

        # GPU utilization of GKE runs comes from GPUFLEET_PROMETHEUS_URL; without it it is unknown.
        prometheus = PrometheusSettings.from_env(environ)
        gke = (gke_name, GkeRunner(K8sClient(K8sSettings.from_env(environ)), vault_env,
                                   prometheus=PrometheusClient(prometheus) if prometheus else None))
    return ClusterRunners(nomad=nomad, gke=gke)
