"""process_holders: proof that ended runs released their GPUs, and the orphan scan (issue 25).

Once per follow pass, per bound cluster, one batched look at what holds GPUs there (``Runner.holders``:
Nomad's allocation and job lists for every namespace, two calls; Kubernetes one pod list per tenant
namespace, as the service's RBAC allows), then two uses of that one answer:

- **Release.** Every run that ended and is not yet proven released: if nothing of it is in the list,
  ``released_at`` is stamped with an event ``released``; if something is, an event ``not-released``
  names what is still held (allocation or pod, its status, its node), and the next pass checks again.
  A run that ended within ``RELEASE_GRACE`` is not warned about yet: a stopped task has its kill
  timeout to exit, and a client reports a moment later.
- **Orphans.** A holder carrying gpufleet's own marks (``jobs.holders``) that no live experiment owns:
  its run id is no non-terminal experiment's, and the experiment it names (dispatch meta / pod label)
  is unknown here or has ended. Each is an event ``orphan`` (once per piece), the gauge
  ``gpufleet_orphans{cluster,scheduler}``, and under the cluster file's ``orphans: stop`` a stop,
  only after it was seen orphaned in two passes in a row and the scheduler confirmed again, by a
  fresh read, that gpufleet made it for this cluster (``Runner.ours``). Nothing without gpufleet's
  marks is ever listed, so nothing another tool started can be stopped.

The scan assumes this service's database is the only control plane of the cluster: a second
gpufleet service with its own database bound to the same cluster would see this one's runs as
orphans (docs/release.md says so; keep ``orphans: report`` there).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlalchemy import select

from clusters.derive.tenants import derive_tenants
from clusters.schema import SchedulerKind
from experiments.background.context import Context, log
from experiments.models import Experiment
from experiments.scheduler import bound_to
from experiments.services.lifecycle import record
from experiments.states import TERMINAL, State
from jobs.holders import Holder
from jobs.runner import Runners, SchedulerUnavailable

ACTOR = "reconciler"
RELEASE_BATCH = 500
RELEASE_GRACE = timedelta(minutes=5)
_ENDED = [s.value for s in TERMINAL]


class OrphanMemory:
    """Per process: orphan pieces already reported, runs seen orphaned last pass, runs stopped. After a
    restart each orphan is reported once more and needs two passes again before a stop."""

    def __init__(self) -> None:
        # Per cluster, each kept to what its last scan saw orphaned (so they never grow past that).
        self.reported: dict[str, set[str]] = {}  # pieces (allocation / pod) already reported
        self.last_pass: dict[str, set[str]] = {}  # runs seen orphaned
        self.stopped: dict[str, set[str]] = {}  # runs stopped
        self.lock = threading.Lock()


def process_holders(ctx: Context) -> int:
    """One scan per bound cluster; returns how many holders the schedulers listed. Several workers on
    one database: only the one that leads this pass scans (``Context.leads``), so each orphan is one
    event and each release one proof, not one per worker, and the schedulers are listed once."""
    with ctx.sessions() as session:
        if not ctx.leads(session):
            return 0
    listed = 0
    for cluster, kind in _scopes(ctx):
        config = next((c for c in ctx.catalog.configs if c.name == cluster), None)
        if config is None:
            continue  # no cluster file here: no tenant namespaces to list, no policy to follow
        namespaces = [t.namespace for t in derive_tenants(config)]
        try:
            held = _holders(ctx, cluster, kind, namespaces)
        except SchedulerUnavailable as exc:
            ctx.metrics.holder_scan_errors.inc()
            log.warning("GPU holder scan of cluster %s deferred: %s", cluster, exc)
            continue
        listed += len(held)
        now = ctx.clock()
        by_run: dict[str, list[Holder]] = defaultdict(list)
        for holder in held:
            by_run[holder.run_id].append(holder)
        _prove_release(ctx, cluster, kind, by_run, now)
        stop = config.orphans == "stop"
        _orphans(ctx, cluster, kind, held, now, stop=stop)
    return listed


def _scopes(ctx: Context) -> list[tuple[str, str]]:
    """(cluster, scheduler) of every cluster this service acts on now: bound and not blocked
    (experiments.binding), or, for a bare runner of one scheduler, the catalog's clusters of that kind."""
    if not hasattr(ctx.runner, "holders"):
        return []  # a runner that cannot list what holds GPUs (the local development runner)
    bound = bound_to(ctx.runner)
    if bound is None:
        kind = getattr(ctx.runner, "scheduler", None)
        return sorted((c.name, c.scheduler.value) for c in ctx.catalog.configs if c.scheduler.value == kind)
    blocked = getattr(ctx.runner, "blocked", {})
    return sorted((cluster, kind) for cluster, kind in bound.items() if cluster not in blocked and kind in {k.value for k in SchedulerKind})


def _holders(ctx: Context, cluster: str, kind: str, namespaces: Sequence[str]) -> list[Holder]:
    if isinstance(ctx.runner, Runners):
        return ctx.runner.holders(cluster, namespaces, gke=kind == SchedulerKind.GKE.value)
    return list(ctx.runner.holders(cluster, namespaces))  # type: ignore[attr-defined]


def _prove_release(ctx: Context, cluster: str, kind: str, by_run: dict[str, list[Holder]], now: datetime) -> None:
    with ctx.sessions() as session, session.begin():
        rows = session.scalars(select(Experiment).where(
            Experiment.cluster == cluster, Experiment.scheduler == kind, Experiment.state.in_(_ENDED),
            Experiment.run_id.is_not(None), Experiment.released_at.is_(None)).order_by(Experiment.finished_at).limit(RELEASE_BATCH)).all()
        for exp in rows:
            held = by_run.get(exp.run_id or "", [])
            if not held:
                exp.released_at, exp.release_held = now, None
                what = "every allocation of it is terminal" if kind == SchedulerKind.NOMAD.value else "no pod of it is left unfinished"
                record(session, experiment_id=exp.id, actor=ACTOR, kind="released", now=now,
                       message=f"released: {what} on {kind} ({exp.run_id}); it holds no GPU")
                continue
            detail = ", ".join(h.describe() for h in held)
            if (exp.finished_at is not None and now - exp.finished_at < RELEASE_GRACE) or exp.release_held == detail:
                continue
            exp.release_held = detail
            record(session, experiment_id=exp.id, actor=ACTOR, kind="not-released", now=now,
                   message=f"not released: run {exp.run_id} ended {exp.state} but {kind} still shows it holding GPUs: {detail}; checked again every pass")
            log.warning("experiment %s ended %s but still holds GPUs on %s: %s", exp.id, exp.state, kind, detail)


def _orphans(ctx: Context, cluster: str, kind: str, held: list[Holder], now: datetime, *, stop: bool) -> None:
    runs = sorted({h.run_id for h in held})
    named = sorted({h.experiment for h in held if h.experiment})
    with ctx.sessions() as session:
        by_run = {r.run_id: (r.id, r.state) for r in session.execute(
            select(Experiment.run_id, Experiment.id, Experiment.state).where(Experiment.cluster == cluster, Experiment.run_id.in_(runs)))} if runs else {}
        by_id = {r.id: r.state for r in session.execute(select(Experiment.id, Experiment.state).where(Experiment.id.in_(named)))} if named else {}
    orphans: dict[str, tuple[list[Holder], str | None, str]] = {}
    for holder in held:
        owner = by_run.get(holder.run_id)
        if owner is not None and State(owner[1]) not in TERMINAL:
            continue
        if holder.experiment and holder.experiment in by_id and State(by_id[holder.experiment]) not in TERMINAL:
            continue  # an attempt the reconciler has not recorded yet (its run id is not stored)
        experiment = owner[0] if owner is not None else (holder.experiment if holder.experiment in by_id else None)
        state = owner[1] if owner is not None else by_id.get(holder.experiment or "")
        why = f"experiment {experiment} is {state}" if experiment else f"no experiment here owns it{f' (it names {holder.experiment})' if holder.experiment else ''}"
        orphans.setdefault(holder.run_id, ([], experiment, why))[0].append(holder)
    ctx.metrics.orphans.labels(cluster=cluster, scheduler=kind).set(sum(len(h) for h, _, _ in orphans.values()))
    memory: OrphanMemory = ctx.orphans
    with memory.lock:
        reported, stopped = memory.reported.get(cluster, set()), memory.stopped.get(cluster, set())
        fresh = [(run, h) for run, (pieces, _, _) in orphans.items() for h in pieces if h.piece not in reported]
        due = [run for run in orphans if stop and run in memory.last_pass.get(cluster, set()) and run not in stopped]
        memory.reported[cluster] = {h.piece for pieces, _, _ in orphans.values() for h in pieces}
        memory.stopped[cluster] = stopped & set(orphans)
        memory.last_pass[cluster] = set(orphans)
    if fresh:
        with ctx.sessions() as session, session.begin():
            for run, holder in fresh:
                _, experiment, why = orphans[run]
                record(session, experiment_id=experiment, actor=ACTOR, kind="orphan", now=now,
                       message=f"orphan on {cluster}: run {run} holds GPUs ({holder.describe()}) and {why}; policy orphans: {'stop' if stop else 'report'}")
                log.warning("orphan on cluster %s: run %s holds GPUs (%s): %s", cluster, run, holder.describe(), why)
    for run in due:
        _stop(ctx, cluster, run, orphans[run][1], now)


def _stop(ctx: Context, cluster: str, run: str, experiment: str | None, now: datetime) -> None:
    """Stop one orphaned run, only after a fresh read says gpufleet made it for this cluster."""
    try:
        stopped = bool(ctx.runner.ours(run, cluster))  # type: ignore[attr-defined]
        if stopped:
            ctx.runner.stop(run)
            ctx.metrics.orphans_stopped.labels(cluster=cluster).inc()
    except SchedulerUnavailable as exc:
        log.warning("stop of orphan %s deferred: %s", run, exc)
        return
    with ctx.orphans.lock:
        ctx.orphans.stopped.setdefault(cluster, set()).add(run)
    message = (f"orphan {run} stopped on {cluster} (policy orphans: stop)" if stopped
               else f"orphan {run} not stopped: a fresh read no longer shows it as gpufleet's run of cluster {cluster}")
    with ctx.sessions() as session, session.begin():
        record(session, experiment_id=experiment, actor=ACTOR, kind="orphan-stopped" if stopped else "orphan", now=now, message=message)
    log.warning("%s", message)
