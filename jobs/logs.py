"""A run's output, the same way for every scheduler: the tail of one stream, masked.

Each runner that can read logs has ``logs(run_id, *, stderr, tail_bytes) -> str`` (the local
runner reads its run's files; Nomad and GKE are not wired yet and say so). Every line that leaves
here has passed the project's one secret detector (``clusters.secrets.detect``): a line holding a
credential is replaced by ``[masked: <kind>]``, so it is never stored, streamed or shown.
"""

from __future__ import annotations

from typing import Any

from clusters.secrets import detect

DEFAULT_TAIL_BYTES = 256 * 1024


class LogsUnavailable(Exception):
    """This scheduler's logs cannot be read from here (the message says why and what to do)."""


def masked(text: str) -> str:
    """``text`` with each line that holds a credential replaced by ``[masked: <kind>]``."""
    out = []
    for line in text.splitlines(keepends=True):
        hit = detect(line.rstrip("\n"))
        out.append(f"[masked: {hit.kind}]" + ("\n" if line.endswith("\n") else "") if hit else line)
    return "".join(out)


def tail_text(data: bytes, tail_bytes: int) -> str:
    """The last ``tail_bytes`` of ``data`` as text, starting at a line boundary when cut."""
    if len(data) > tail_bytes:
        data = data[-tail_bytes:]
        data = data[data.find(b"\n") + 1:] if b"\n" in data else data
    return data.decode("utf-8", errors="replace")


def read_logs(runner: Any, run_id: str, *, stderr: bool = False, tail_bytes: int = DEFAULT_TAIL_BYTES) -> str:
    """The masked tail of the run's stdout (or stderr) from its scheduler."""
    reader = getattr(runner, "logs", None)
    if reader is None:
        raise LogsUnavailable(f"reading logs from {getattr(runner, 'scheduler', 'this scheduler')} is not supported yet; "
                              "use `nomad alloc logs` or `kubectl logs` for the run's scheduler ids (gpufleet exp show)")
    return masked(reader(run_id, stderr=stderr, tail_bytes=tail_bytes))
