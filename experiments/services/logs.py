"""A run's logs for the API: live from its scheduler while it can answer, else the tail kept in
the database when the run ended (``keep``). Both already masked (jobs.logs)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from experiments.models import Experiment, RunLog
from jobs.logs import DEFAULT_TAIL_BYTES, LogsUnavailable, read_logs
from jobs.runner import RunNotFound, SchedulerUnavailable

log = logging.getLogger("gpufleet.experiments")
STREAMS = ("stdout", "stderr")


def keep(sessions: Any, runner: Any, experiment_ids: Iterable[str], *, now: datetime, tail_bytes: int = DEFAULT_TAIL_BYTES) -> None:
    """Store the masked tail of each stream of these (just ended) runs; best effort: a scheduler
    that cannot answer leaves what was stored before."""
    for experiment_id in experiment_ids:
        with sessions() as session:
            exp = session.get(Experiment, experiment_id)
            run_id = exp.run_id if exp is not None else None
        if run_id is None:
            continue
        for stream in STREAMS:
            try:
                text = read_logs(runner, run_id, stderr=stream == "stderr", tail_bytes=tail_bytes)
            except (LogsUnavailable, RunNotFound, SchedulerUnavailable) as exc:
                log.info("logs of %s (%s) not kept: %s", experiment_id, stream, exc)
                continue
            with sessions() as session, session.begin():
                session.execute(delete(RunLog).where(RunLog.experiment_id == experiment_id, RunLog.stream == stream))
                session.add(RunLog(experiment_id=experiment_id, stream=stream, text=text, captured_at=now))


def read(session: Session, runner: Any, exp: Experiment, *, stderr: bool, tail_lines: int | None) -> dict[str, Any]:
    stream = "stderr" if stderr else "stdout"
    source, note = "scheduler", None
    text = None
    if exp.run_id is not None:
        try:
            text = read_logs(runner, exp.run_id, stderr=stderr)
        except (LogsUnavailable, RunNotFound, SchedulerUnavailable) as exc:
            note = str(exc) if isinstance(exc, (LogsUnavailable, SchedulerUnavailable)) else f"the scheduler no longer knows run {exp.run_id}"
    if text is None:
        stored = session.scalars(select(RunLog).where(RunLog.experiment_id == exp.id, RunLog.stream == stream)).first()
        source, text = ("stored", stored.text) if stored is not None else ("none", "")
    lines = text.splitlines()
    if tail_lines is not None:
        lines = lines[-tail_lines:] if tail_lines else []
    return {"id": exp.id, "stream": stream, "source": source, "lines": lines, **({"note": note} if note and source != "scheduler" else {})}
