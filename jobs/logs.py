"""A run's output, the same way for every scheduler: one rank's stream, masked.

Each runner that can read logs has ``logs(run_id, *, rank, stderr, tail_bytes, tail_lines,
since_seconds, follow, stop) -> Iterator[bytes]``: without ``follow`` one chunk, the tail; with it
the tail and then each chunk as the task writes it (``b""`` when nothing came for a while, so the
caller can look at the run), until the run's stream ends or ``stop`` is set. ``ranks(run_id)``
names the ranks that have output. Every line that leaves here has passed the project's one secret
detector (``clusters.secrets.detect``): a line holding a credential is replaced by
``[masked: <kind>]``, so it is never stored, streamed or shown. A streamed line is masked only once
it is complete, so a key split across two chunks is still seen whole.
"""

from __future__ import annotations

import codecs
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from clusters.secrets import detect

DEFAULT_TAIL_BYTES = 256 * 1024
# A streamed line longer than this (a progress bar without newlines) is masked and sent as it is.
MAX_LINE_BYTES = 64 * 1024


class LogsUnavailable(Exception):
    """This scheduler's logs cannot be read from here (the message says why and what to do)."""


class LogsFilterRefused(LogsUnavailable):
    """The filters ask for what this run's scheduler cannot give (a rank it does not have, a time
    filter on files without timestamps, stderr on Kubernetes); the message names the fix."""


def masked(text: str) -> str:
    """``text`` with each line that holds a credential replaced by ``[masked: <kind>]``."""
    out = []
    for line in text.splitlines(keepends=True):
        hit = detect(line.rstrip("\n"))
        out.append(f"[masked: {hit.kind}]" + ("\n" if line.endswith("\n") else "") if hit else line)
    return "".join(out)


def masked_stream(chunks: Iterable[str]) -> Iterator[str]:
    """Complete lines of ``chunks``, masked; ``""`` passes through (a tick with no output). What is
    left without a newline at the end is masked and sent last."""
    pending = ""
    for chunk in chunks:
        if not chunk:
            yield ""
            continue
        pending += chunk
        cut = pending.rfind("\n") + 1
        if not cut and len(pending) > MAX_LINE_BYTES:
            cut = len(pending)
        if cut:
            yield masked(pending[:cut])
            pending = pending[cut:]
    if pending:
        yield masked(pending)


def arriving(response: Any, size: int = 64 * 1024) -> Iterator[bytes]:
    """The body of a streamed urllib3 response as it arrives: ``read1`` returns what is there (a
    chunk of a chunked answer, or what a close-delimited one has sent so far) instead of waiting
    for ``size`` bytes or the end, which ``stream()`` does on an answer without chunked encoding."""
    while chunk := response.read1(size):
        yield chunk


def decoded(chunks: Iterable[bytes]) -> Iterator[str]:
    """UTF-8 text of a byte stream, a character split across two chunks kept whole."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for chunk in chunks:
        yield decoder.decode(chunk)
    if rest := decoder.decode(b"", final=True):
        yield rest


def tail_text(data: bytes, tail_bytes: int) -> str:
    """The last ``tail_bytes`` of ``data`` as text, starting at a line boundary when cut. Readers
    hand over one byte more than ``tail_bytes`` when there is more, so a cut is seen: a window
    starting inside a line could start inside a credential, whose second half the detector
    cannot recognise."""
    if len(data) > tail_bytes:
        data = data[-tail_bytes:]
        data = data[data.find(b"\n") + 1:] if b"\n" in data else data
    return data.decode("utf-8", errors="replace")


def last_lines(data: bytes, lines: int | None) -> bytes:
    """The last ``lines`` lines of ``data`` (all of it for None)."""
    if lines is None:
        return data
    if lines == 0:
        return b""
    parts = data.splitlines(keepends=True)
    return b"".join(parts[-lines:])


def read_logs(runner: Any, run_id: str, *, rank: int = 0, stderr: bool = False, tail_bytes: int = DEFAULT_TAIL_BYTES,
              since_seconds: int | None = None) -> str:
    """The masked tail of one rank's stdout (or stderr) from its scheduler."""
    reader = getattr(runner, "logs", None)
    if reader is None:
        raise LogsUnavailable(f"reading logs from {getattr(runner, 'scheduler', 'this scheduler')} is not supported; "
                              "use `nomad alloc logs` or `kubectl logs` for the run's scheduler ids (gpufleet exp show)")
    data = b"".join(reader(run_id, rank=rank, stderr=stderr, tail_bytes=tail_bytes, tail_lines=None, since_seconds=since_seconds,
                           follow=False, stop=threading.Event()))
    return masked(tail_text(data, tail_bytes))


def ranks(runner: Any, run_id: str) -> tuple[int, ...]:
    """The ranks of the run that have (or will have) output; one for a runner without ``ranks``."""
    reader = getattr(runner, "ranks", None)
    return tuple(reader(run_id)) if reader is not None else (0,)
