"""Prometheus metrics: experiments by state and reconcile lag (read from the database at
scrape time, so every replica reports the same truth), dispatch latency and errors (this
process's dispatcher)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, not_, select
from sqlalchemy.orm import Session, sessionmaker

from experiments.models import Experiment, Outbox
from experiments.scheduler import bound_clause
from experiments.states import ON_SCHEDULER, State


class _DatabaseCollector(Collector):
    def __init__(self, sessions: sessionmaker[Session], clock: Callable[[], datetime], runner: Any) -> None:
        self._sessions = sessions
        self._clock = clock
        self._runner = runner

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = self._clock()
        on_scheduler = Experiment.state.in_([s.value for s in ON_SCHEDULER])
        bound = bound_clause(self._runner, Experiment.cluster, Experiment.scheduler)
        with self._sessions() as session:
            counts = dict(session.execute(select(Experiment.state, func.count()).group_by(Experiment.state)).all())
            oldest_check = session.scalar(select(func.min(func.coalesce(Experiment.reconciled_at, Experiment.queued_at))).where(
                on_scheduler, *([bound] if bound is not None else [])))
            elsewhere = [] if bound is None else session.execute(
                select(Experiment.cluster, func.count()).where(on_scheduler, not_(bound)).group_by(Experiment.cluster)).all()
            oldest_outbox = session.scalar(select(func.min(Outbox.created_at)))
            held = session.scalar(select(func.count()).select_from(Experiment).where(
                Experiment.released_at.is_(None), Experiment.release_held.is_not(None), *([bound] if bound is not None else [])))
        by_state = GaugeMetricFamily("gpufleet_experiments", "Experiments by state", labels=["state"])
        for state in State:
            by_state.add_metric([state.value], counts.get(state.value, 0))
        yield by_state
        yield GaugeMetricFamily("gpufleet_reconcile_lag_seconds", "Age of the least recently reconciled run on a scheduler this service is bound to",
                                value=(now - oldest_check).total_seconds() if oldest_check else 0.0)
        not_bound = GaugeMetricFamily("gpufleet_experiments_not_bound", "Runs on the scheduler of a cluster this service is not bound to (nothing here follows them)",
                                      labels=["cluster"])
        for cluster, count in elsewhere:
            not_bound.add_metric([cluster], count)
        yield not_bound
        yield GaugeMetricFamily("gpufleet_runs_not_released", "Ended runs the scheduler still shows holding GPUs (docs/release.md)", value=held or 0)
        yield GaugeMetricFamily("gpufleet_outbox_oldest_seconds", "Age of the oldest accepted experiment not yet dispatched",
                                value=(now - oldest_outbox).total_seconds() if oldest_outbox else 0.0)


class Metrics:
    def __init__(self, sessions: sessionmaker[Session], clock: Callable[[], datetime], runner: Any = None) -> None:
        self.registry = CollectorRegistry()
        self.dispatch_latency = Histogram("gpufleet_dispatch_latency_seconds", "From accepted to handed to the scheduler",
                                          buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300), registry=self.registry)
        self.dispatch_errors = Counter("gpufleet_dispatch_errors", "Scheduler or Vault errors while dispatching", registry=self.registry)
        self.reconcile_errors = Counter("gpufleet_reconcile_errors", "Runs the reconciler got no answer for in a pass (scheduler or namespace unreadable)",
                                        registry=self.registry)
        self.usage_errors = Counter("gpufleet_usage_errors", "Reconcile passes whose GPU utilization source (Nomad allocation stats, Prometheus) did not answer",
                                    registry=self.registry)
        self.pool_usage_repairs = Counter("gpufleet_pool_usage_repairs", "Quota counters (pool_usage) found to differ from their live runs and corrected",
                                          registry=self.registry)
        self.reconcile_seconds = Histogram("gpufleet_reconcile_pass_seconds", "Duration of one reconcile pass", registry=self.registry)
        self.orphans = Gauge("gpufleet_orphans", "GPU-holding allocations or pods gpufleet made that no live experiment owns, at the last scan",
                             ["cluster", "scheduler"], registry=self.registry)
        self.orphans_stopped = Counter("gpufleet_orphans_stopped", "Orphaned runs stopped under the cluster's 'orphans: stop' policy",
                                       ["cluster"], registry=self.registry)
        self.holder_scan_errors = Counter("gpufleet_holder_scan_errors", "Scans for GPU holders (release proof, orphans) a scheduler did not answer",
                                          registry=self.registry)
        self.registry.register(_DatabaseCollector(sessions, clock, runner))
