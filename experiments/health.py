"""Does each scheduler this service is bound to answer? For /healthz and the
``gpufleet_scheduler_up`` metric, asked at most every ``ttl_seconds`` (a probe is a GET with the
client's retries: /healthz and scrapes must not hammer, or wait on, a scheduler that is down)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger("gpufleet.experiments")


class SchedulerHealth(Collector):
    def __init__(self, runner: Any, *, ttl_seconds: float = 15.0) -> None:
        self._runner = runner
        self._ttl = ttl_seconds
        self._lock = threading.Lock()
        self._checked: tuple[float, dict[str, dict[str, Any]]] | None = None

    def _names(self) -> dict[str, str]:
        """scheduler kind -> cluster name (the kind itself for a runner not bound by name)."""
        clusters = getattr(self._runner, "clusters", None) or {}
        return {kind: name for name, kind in clusters.items()}

    def check(self) -> dict[str, dict[str, Any]]:
        """cluster -> {"scheduler", "answers"}; empty for a runner that cannot say (local)."""
        probe = getattr(self._runner, "health", None)
        if probe is None:
            return {}
        with self._lock:
            if self._checked is not None and time.monotonic() - self._checked[0] < self._ttl:
                return self._checked[1]
            names = self._names()
            answers = {}
            for kind, error in probe().items():
                cluster = names.get(kind, kind)
                answers[cluster] = {"scheduler": kind, "answers": error is None}
                if error:  # the why (addresses, TLS detail) goes to the log, not to anonymous /healthz callers
                    log.warning("the %s scheduler of cluster %s does not answer: %s", kind, cluster, error)
            self._checked = (time.monotonic(), answers)
            return answers

    def collect(self) -> Iterator[GaugeMetricFamily]:
        gauge = GaugeMetricFamily("gpufleet_scheduler_up", "1 if the scheduler of a cluster bound to this service answers, else 0",
                                  labels=["cluster", "scheduler"])
        for cluster, state in sorted(self.check().items()):
            gauge.add_metric([cluster, state["scheduler"]], 1.0 if state["answers"] else 0.0)
        yield gauge
