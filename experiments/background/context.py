"""What every background step needs, passed in (no globals): sessions, runner, catalog, clock, metrics."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.orm import Session, sessionmaker

from experiments.metrics import Metrics
from jobs.runner import Runner
from experiments.services.catalog import Catalog

log = logging.getLogger("gpufleet.experiments")


@dataclass(frozen=True)
class Timing:
    poll_seconds: float = 2.0
    # A claimed dispatch whose process died is retried after this (longer than the Nomad client's retries).
    dispatch_lease_seconds: int = 120
    # An accepted experiment not handed to the scheduler within this fails with the last error.
    dispatch_stuck_seconds: int = 900
    reconcile_batch: int = 200


@dataclass(frozen=True)
class Context:
    sessions: sessionmaker[Session]
    runner: Runner
    catalog: Catalog
    clock: Callable[[], datetime]
    metrics: Metrics
    timing: Timing
