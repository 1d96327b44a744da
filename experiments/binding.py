"""Which scheduler a bound cluster name means, checked, not assumed (security round three).

``--nomad-cluster prod-nomad`` with NOMAD_ADDR at another cluster, or ``--gke-cluster prod-gke``
with a kubeconfig context of another cluster, made a service that saw none of prod's runs and
failed every one as gone. Now each bound cluster's scheduler says who it is
(``jobs.runner.Runner.identity``: Nomad's region and server ids, the Kubernetes cluster's
kube-system uid). The first service to reach a cluster name records that identity in the
database, unless the cluster already has runs (from before identities were recorded) of which
that scheduler knows none; every service compares what answers it with the record
(``same_scheduler``: Nomad servers may be replaced one at a time, so most of the recorded
servers in common is the same cluster, and the record follows a minority replaced at a time,
``next_record``). Until a cluster's identity is confirmed, or when it differs, the cluster is *blocked*
for this service: nothing of it is dispatched, polled, stopped, expired or freed from quota
(``experiments.scheduler.not_bound``/``bound_clause``), its runs keep their state and quota and
their reason starts with ``unobserved:``. Confirmed, it is re-checked every ``RECHECK_SECONDS``;
a scheduler that cannot be asked leaves a confirmed binding as it is.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from clusters.schema import SchedulerKind
from experiments.models import Experiment, SchedulerIdentity
from experiments.states import ON_SCHEDULER
from jobs.runner import RunNotFound, SchedulerUnavailable, next_record, same_scheduler

RECHECK_SECONDS = 300.0
# Runs a first record checks the answering scheduler knows (any one of them is enough).
FIRST_RECORD_PROBES = 5
log = logging.getLogger("gpufleet.experiments")


def _where(kind: str) -> str:
    return "the kubeconfig context (KUBECONFIG, GPUFLEET_KUBE_CONTEXT)" if kind == SchedulerKind.GKE.value else "NOMAD_ADDR"


def confirm(runner: Any, sessions: sessionmaker[Session], now: datetime, *, monotonic: Callable[[], float] = time.monotonic) -> None:
    """Check each bound cluster whose check is due; updates ``runner.blocked`` (cluster -> why)."""
    members = getattr(runner, "members", None)
    if not members:
        return
    if not runner.identity_lock.acquire(blocking=False):
        return  # asked right now elsewhere (start-up, a step by hand): go on with what is known
    try:
        for cluster, member in sorted(members.items()):
            last = runner.identity_checked.get(cluster)
            if last is not None and monotonic() - last < RECHECK_SECONDS:
                continue
            kind = runner.clusters[cluster]
            try:
                answering = member.identity()
                why = _compare(sessions, cluster, kind, answering, now, member)
            except SchedulerUnavailable as exc:
                if last is None:
                    runner.blocked[cluster] = (f"unobserved: this service cannot tell yet which {kind} scheduler answers for cluster {cluster} "
                                               f"({exc}); nothing of {cluster} is dispatched, polled, stopped or failed from here until it can")
                continue
            runner.identity_checked[cluster] = monotonic()
            if why is None:
                if cluster in runner.blocked:
                    log.info("cluster %s (%s): scheduler identity confirmed (%s)", cluster, kind, answering)
                runner.blocked.pop(cluster, None)
            else:
                if runner.blocked.get(cluster) != why:
                    log.error("cluster %s (%s): %s", cluster, kind, why)
                runner.blocked[cluster] = why
    finally:
        runner.identity_lock.release()


def _compare(sessions: sessionmaker[Session], cluster: str, kind: str, answering: str, now: datetime, member: Any) -> str | None:
    """None when ``answering`` is the cluster's recorded scheduler (recording it if it is the
    first), else why this service must leave the cluster's runs alone.

    The scheduler is asked (``_knows_none``) with no session open: on SQLite every transaction
    takes the write lock (``BEGIN IMMEDIATE``), and submissions and dispatch claims must not
    wait on a slow scheduler. The write that follows is a short transaction of its own."""
    for _ in range(2):  # a concurrent first record by another service: read it and compare
        with sessions() as session:
            row = session.get(SchedulerIdentity, cluster)
            run_ids = [] if row is not None else _recent_runs(session, cluster, kind)
        if row is None:
            if why := _knows_none(member, cluster, kind, answering, run_ids):
                return why
            try:
                with sessions() as session, session.begin():
                    session.add(SchedulerIdentity(cluster=cluster, scheduler=kind, identity=answering, recorded_at=now, confirmed_at=now))
                return None
            except IntegrityError:
                continue
        if row.scheduler == kind and same_scheduler(row.identity, answering):
            with sessions() as session, session.begin():
                current = session.get(SchedulerIdentity, cluster)
                if current is None or current.identity != row.identity:
                    continue  # changed by another service meanwhile: compare again with what it wrote
                current.identity, current.confirmed_at = next_record(row.identity, answering), now
            return None
        return (f"unobserved: the {kind} scheduler this service reaches as cluster {cluster} ({answering}) is not the one {cluster}'s "
                f"runs were made on ({row.scheduler}: {row.identity}, recorded {row.recorded_at:%Y-%m-%d %H:%M}Z); nothing of {cluster} "
                f"is dispatched, polled, stopped or failed from here: point {_where(kind)} at {cluster}")
    raise SchedulerUnavailable(f"the scheduler identity of cluster {cluster} keeps changing while it is recorded")


def _recent_runs(session: Session, cluster: str, kind: str) -> list[str]:
    """The most recent runs of ``cluster`` still on its scheduler, the ones a first record probes."""
    return list(session.scalars(select(Experiment.run_id).where(
        Experiment.cluster == cluster, Experiment.scheduler == kind, Experiment.run_id.is_not(None),
        Experiment.state.in_([s.value for s in ON_SCHEDULER])).order_by(Experiment.queued_at.desc()).limit(FIRST_RECORD_PROBES)).all())


def _knows_none(member: Any, cluster: str, kind: str, answering: str, run_ids: list[str]) -> str | None:
    """Before the first record: the cluster may already have runs (made before identities were
    recorded). If the answering scheduler knows none of the most recent of them, it is not theirs,
    and recording it would let this service fail them all as gone; why, or None to record."""
    for run_id in run_ids:
        try:
            member.status(run_id)
            return None
        except RunNotFound:
            continue
    if not run_ids:
        return None
    return (f"unobserved: the {kind} scheduler this service reaches as cluster {cluster} ({answering}) knows none of the {len(run_ids)} most "
            f"recent runs of {cluster}, so it is not recorded as {cluster}'s scheduler and nothing of {cluster} is dispatched, polled, "
            f"stopped or failed from here: point {_where(kind)} at {cluster}")
