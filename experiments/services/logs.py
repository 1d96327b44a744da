"""A run's logs for the API: live from its scheduler while it can answer, else the tail kept in
the database (``keep``: when the run ends, and a few running runs per reconcile pass). Every line,
live, followed or kept, is masked (jobs.logs) before it leaves the scheduler's answer.

A follow (``follow``) reads each asked rank in its own thread and ends when the run has ended (the
experiment's state in the database, as the reconciler sets it) and no more output came for
DRAIN_SECONDS, or when every rank's stream ended (a Kubernetes container exited, a local process
ended). Nomad keeps a follow open after the task exited, so there the state decides.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, and_, case, func, or_, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session, sessionmaker

from experiments.errors import ApiError
from experiments.models import Experiment, RunLog
from experiments.scheduler import not_bound
from experiments.states import TERMINAL, State
from jobs.logs import DEFAULT_TAIL_BYTES, LogsFilterRefused, LogsUnavailable, decoded, masked, masked_stream, ranks, read_logs
from jobs.runner import RunNotFound, SchedulerUnavailable

log = logging.getLogger("gpufleet.experiments")
STREAMS = ("stdout", "stderr")
# While following: how often the run's state is looked at, and how long after it ended (with no
# more output) the follow still waits for the last lines before it closes.
CHECK_SECONDS = 1.0
DRAIN_SECONDS = 2.0
POLL_SECONDS = 0.05


@dataclass(frozen=True)
class LogQuery:
    rank: int | None  # None: every rank
    stderr: bool = False
    tail_lines: int | None = None
    since_seconds: int | None = None
    tail_bytes: int = DEFAULT_TAIL_BYTES  # read from the scheduler, per rank

    @property
    def stream(self) -> str:
        return "stderr" if self.stderr else "stdout"


def _refused(exc: LogsFilterRefused) -> ApiError:
    head, _, fix = str(exc).partition("; ")
    return ApiError(422, head, field="filters", fix=fix or "change the filters")


# ---- kept tails --------------------------------------------------------------------------------
def keep(sessions: sessionmaker[Session], runner: Any, experiment_ids: Iterable[str], *, now: datetime,
         tail_bytes: int = DEFAULT_TAIL_BYTES) -> None:
    """Store the masked tail of each rank and stream of these runs; best effort: what a scheduler
    cannot answer now leaves what was stored before."""
    for experiment_id in experiment_ids:
        with sessions() as session:
            run_id = session.scalar(select(Experiment.run_id).where(Experiment.id == experiment_id))
        if run_id is None:
            continue
        try:
            run_ranks = ranks(runner, run_id)
        except (RunNotFound, SchedulerUnavailable) as exc:
            log.info("logs of %s not kept: %s", experiment_id, exc)
            continue
        for rank in run_ranks:
            for stream in STREAMS:
                try:
                    text = read_logs(runner, run_id, rank=rank, stderr=stream == "stderr", tail_bytes=tail_bytes)
                except LogsFilterRefused:
                    continue  # e.g. stderr on Kubernetes: one stream there
                except (LogsUnavailable, RunNotFound, SchedulerUnavailable) as exc:
                    log.info("logs of %s (rank %d, %s) not kept: %s", experiment_id, rank, stream, exc)
                    continue
                with sessions() as session, session.begin():
                    session.execute(_kept(session, experiment_id=experiment_id, rank=rank, stream=stream, text=text, now=now))


def _kept(session: Session, *, experiment_id: str, rank: int, stream: str, text: str, now: datetime) -> Any:
    """One tail written whether or not it was kept before: ``INSERT ... ON CONFLICT DO UPDATE``, one
    statement that two workers keeping the same run at once (their views of the membership differ
    for a pass) both complete, the second after the first commits. A DELETE then an INSERT made the
    second one's INSERT fail on the primary key. Unchanged text keeps when it last changed (the idle
    policy's "no log output since"), as read from the row it replaces, under that row's lock."""
    insert = pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert
    statement = insert(RunLog).values(experiment_id=experiment_id, rank=rank, stream=stream, text=text, captured_at=now, changed_at=now)
    unchanged = and_(RunLog.text == statement.excluded.text, RunLog.changed_at.is_not(None))
    return statement.on_conflict_do_update(index_elements=[RunLog.experiment_id, RunLog.rank, RunLog.stream],
                                           set_={"text": statement.excluded.text, "captured_at": statement.excluded.captured_at,
                                                 "changed_at": case((unchanged, RunLog.changed_at), else_=statement.excluded.changed_at)})


def keep_running(sessions: sessionmaker[Session], runner: Any, *, bound: ColumnElement[bool] | None, now: datetime, limit: int,
                 every_seconds: float, tail_bytes: int = DEFAULT_TAIL_BYTES) -> list[str]:
    """Keep the tails of at most ``limit`` running runs: those never kept first, then the longest
    ago, none kept within ``every_seconds``. One query and ``limit`` runs' reads per pass, however
    many runs there are; returns their ids."""
    kept = select(RunLog.experiment_id, func.max(RunLog.captured_at).label("at")).group_by(RunLog.experiment_id).subquery()
    query = (select(Experiment.id).outerjoin(kept, kept.c.experiment_id == Experiment.id)
             .where(Experiment.state == State.RUNNING.value, Experiment.run_id.is_not(None),
                    or_(kept.c.at.is_(None), kept.c.at <= now - timedelta(seconds=every_seconds)))
             .order_by(kept.c.at.is_not(None), kept.c.at, Experiment.id).limit(limit))
    if bound is not None:
        query = query.where(bound)
    with sessions() as session:
        chosen = list(session.scalars(query))
    keep(sessions, runner, chosen, now=now, tail_bytes=tail_bytes)
    return chosen


def _stored(session: Session, experiment_id: str, stream: str) -> dict[int, str]:
    rows = session.scalars(select(RunLog).where(RunLog.experiment_id == experiment_id, RunLog.stream == stream).order_by(RunLog.rank))
    return {row.rank: row.text for row in rows}


# ---- one read ----------------------------------------------------------------------------------
def read(session: Session, runner: Any, exp: Experiment, query: LogQuery) -> dict[str, Any]:
    """Each asked rank's lines: live where the scheduler answers, else kept. ``lines`` holds them
    all (prefixed ``[rank N]`` when several ranks are shown)."""
    notes: list[str] = []
    live_ranks: tuple[int, ...] | None = None
    if exp.run_id is not None and (why := not_bound(runner, exp.cluster, exp.scheduler)) is not None:
        notes.append(why)  # its run id could name another cluster's Job or allocation here
    elif exp.run_id is not None:
        try:
            live_ranks = ranks(runner, exp.run_id)
        except (RunNotFound, SchedulerUnavailable) as exc:
            notes.append(str(exc) if isinstance(exc, SchedulerUnavailable) else f"the scheduler no longer knows run {exp.run_id}")
    stored = _stored(session, exp.id, query.stream)
    wanted = (query.rank,) if query.rank is not None else (live_ranks or tuple(sorted(stored)) or (0,))
    shown = []
    for rank in wanted:
        text, source = None, "none"
        if live_ranks is not None and exp.run_id is not None:
            try:
                text = read_logs(runner, exp.run_id, rank=rank, stderr=query.stderr, tail_bytes=query.tail_bytes, since_seconds=query.since_seconds)
                source = "scheduler"
            except LogsFilterRefused as exc:
                raise _refused(exc) from None
            except (LogsUnavailable, RunNotFound, SchedulerUnavailable) as exc:
                notes.append(str(exc) if not isinstance(exc, RunNotFound) else f"the scheduler no longer knows run {exp.run_id}")
        if text is None and rank in stored:
            text, source = stored[rank], "stored"
            if query.since_seconds is not None:
                notes.append("the kept tail has no timestamps: --since does not apply to it")
        lines = (text or "").splitlines()
        if query.tail_lines is not None:
            lines = lines[-query.tail_lines:] if query.tail_lines else []
        shown.append({"rank": rank, "source": source, "lines": lines})
    sources = {r["source"] for r in shown}
    several = len(shown) > 1
    answer: dict[str, Any] = {
        "id": exp.id, "stream": query.stream, "source": sources.pop() if len(sources) == 1 else "mixed",
        "lines": [f"[rank {r['rank']}] {line}" if several else line for r in shown for line in r["lines"]],
        "ranks": shown,
    }
    if notes and answer["source"] != "scheduler":
        answer["note"] = "; ".join(dict.fromkeys(notes))
    return answer


# ---- follow ------------------------------------------------------------------------------------
_END = object()


def follow(sessions: sessionmaker[Session], runner: Any, exp: Experiment, query: LogQuery, *, limit: int) -> AsyncIterator[str] | None:
    """The masked lines of the asked ranks as the run writes them, or None when the scheduler no
    longer knows the run (the caller shows the kept tail). Filter mistakes raise ApiError (422)
    here, before anything is streamed, and so does a tenant that already has ``limit`` follows
    open (429): each holds a thread and a scheduler connection per rank while it runs, and one
    token must not be able to open thousands."""
    if exp.run_id is None or getattr(runner, "logs", None) is None or not_bound(runner, exp.cluster, exp.scheduler) is not None:
        return None
    if _following.count(exp.tenant) >= limit:
        raise _too_many(exp.tenant, limit)
    run_id, stop = exp.run_id, threading.Event()
    try:
        wanted = (query.rank,) if query.rank is not None else ranks(runner, run_id)
        streams = {rank: runner.logs(run_id, rank=rank, stderr=query.stderr, tail_bytes=query.tail_bytes, tail_lines=query.tail_lines,
                                     since_seconds=query.since_seconds, follow=True, stop=stop) for rank in wanted}
    except LogsFilterRefused as exc:
        raise _refused(exc) from None
    except RunNotFound:
        return None
    except (LogsUnavailable, SchedulerUnavailable) as exc:
        raise ApiError(503, f"cannot follow the logs of {exp.id} now: {exc}", fix="retry later, or read the kept tail without follow=true") from None
    return _merged(sessions, exp.id, exp.tenant, limit, streams, stop, several=len(wanted) > 1)


def _too_many(tenant: str, limit: int) -> ApiError:
    return ApiError(429, f"tenant {tenant} already follows {limit} logs at once", field="follow",
                    fix="close a follow (gpufleet exp logs --follow) first, or read the logs without follow=true")


class _Following:
    """Open follows per tenant. Counted while a follow's generator runs (claimed at its start,
    released in its finally), so a response that is never streamed holds nothing."""

    def __init__(self) -> None:
        self._open: dict[str, int] = {}
        self._lock = threading.Lock()

    def count(self, tenant: str) -> int:
        with self._lock:
            return self._open.get(tenant, 0)

    def claim(self, tenant: str, limit: int) -> bool:
        with self._lock:
            if self._open.get(tenant, 0) >= limit:
                return False
            self._open[tenant] = self._open.get(tenant, 0) + 1
            return True

    def release(self, tenant: str) -> None:
        with self._lock:
            self._open[tenant] -= 1
            if not self._open[tenant]:
                del self._open[tenant]


_following = _Following()


def _read_rank(rank: int, chunks: Iterator[bytes], out: queue.Queue[tuple[int, Any]]) -> None:
    try:
        for text in masked_stream(decoded(chunks)):
            out.put((rank, text))
    except (RunNotFound, SchedulerUnavailable, LogsUnavailable) as exc:
        out.put((rank, masked(f"[gpufleet: the logs of rank {rank} ended: {exc}]\n")))  # the scheduler's words pass the detector too
    finally:
        out.put((rank, _END))


def _ended(sessions: sessionmaker[Session], experiment_id: str) -> bool:
    with sessions() as session:
        state = session.scalar(select(Experiment.state).where(Experiment.id == experiment_id))
    return state is None or State(state) in TERMINAL


async def _merged(sessions: sessionmaker[Session], experiment_id: str, tenant: str, limit: int, streams: dict[int, Iterator[bytes]], stop: threading.Event, *,
                  several: bool) -> AsyncIterator[str]:
    """Async on purpose: an idle follower waits on the event loop (POLL_SECONDS timers), not in
    the worker threads the service's other requests run in, so many followers cannot starve
    them. Each rank is read in its own thread; the state check runs in a worker for a moment.
    Counted in ``_following`` while it runs; one over the limit (several started at once, past
    follow's check) says so in a line and ends, before any scheduler is asked."""
    if not _following.claim(tenant, limit):
        yield f"[gpufleet: {_too_many(tenant, limit).error}; close a follow first]\n"
        return
    lines = _lines(sessions, experiment_id, streams, stop, several=several)
    try:
        async for text in lines:
            yield text
    finally:
        await lines.aclose()  # now, not when collected: its finally stops the readers
        _following.release(tenant)


async def _lines(sessions: sessionmaker[Session], experiment_id: str, streams: dict[int, Iterator[bytes]], stop: threading.Event, *,
                 several: bool) -> AsyncIterator[str]:
    out: queue.Queue[tuple[int, Any]] = queue.Queue()
    for rank, chunks in streams.items():
        threading.Thread(target=_read_rank, args=(rank, chunks, out), name=f"logs-{experiment_id[:8]}-{rank}", daemon=True).start()
    open_streams = len(streams)
    checked = quiet_since = time.monotonic()
    ended_at: float | None = None
    try:
        while open_streams:
            try:
                rank, item = out.get_nowait()
            except queue.Empty:
                await asyncio.sleep(POLL_SECONDS)
                rank, item = -1, ""
            now = time.monotonic()
            if item is _END:
                open_streams -= 1
            elif item:
                quiet_since = now
                yield "".join(f"[rank {rank}] {line}" for line in item.splitlines(keepends=True)) if several else item
            if ended_at is None and now - checked >= CHECK_SECONDS:
                checked = now
                ended_at = now if await asyncio.to_thread(_ended, sessions, experiment_id) else None
            if ended_at is not None and now - max(ended_at, quiet_since) >= DRAIN_SECONDS:
                return
    finally:
        stop.set()  # also when the client went away: each reader ends at its next chunk or heartbeat
