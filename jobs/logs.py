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
import re
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from clusters.secrets import detect

DEFAULT_TAIL_BYTES = 256 * 1024
# A streamed line longer than this without a newline (a progress bar) is cut at a carriage return (masked_stream).
MAX_LINE_BYTES = 64 * 1024
TAIL_CUT_NOTE = "[gpufleet: the kept tail is part of one line; it was left out]\n"
LONG_LINE_NOTE = f"[gpufleet: a line longer than {MAX_LINE_BYTES // 1024} KiB without a line break was left out]\n"


class LogsUnavailable(Exception):
    """This scheduler's logs cannot be read from here (the message says why and what to do)."""


class LogsFilterRefused(LogsUnavailable):
    """The filters ask for what this run's scheduler cannot give (a rank it does not have, a time
    filter on files without timestamps, stderr on Kubernetes); the message names the fix."""


# A private key printed as PEM spans lines: only its BEGIN line holds what the detector knows, the
# base64 body lines alone look like any data. Lines between BEGIN and END are masked, and a run of
# body-like lines (held, at most PEM_HELD_LINES) is masked when an END line follows it: a tail cut
# inside a key starts with its body and has no BEGIN line.
PEM_BODY = re.compile(r"^[A-Za-z0-9+/]{16,128}={0,2}\r?$")
PEM_END = re.compile(r"-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----")
PEM_HELD_LINES = 256
# Inside a key: its body, a blank line or an RFC 1421 header (Proc-Type, DEK-Info of an encrypted
# key). Another line means the BEGIN was not followed by a key: masking stops there.
PEM_INSIDE = re.compile(r"^(?:[A-Za-z0-9+/=]*|[A-Za-z-]+: .*)\r?$")


class Masker:
    """Masks text line by line, remembering across calls whether it is inside a PEM private key:
    one Masker per stream, so a key split over chunks is masked whole."""

    def __init__(self) -> None:
        self._in_key = False
        self._key_lines = 0
        self._held: list[str] = []

    def feed(self, text: str) -> str:
        """The complete lines of ``text`` masked; body-like lines may be held for a later call."""
        out: list[str] = []
        for line in text.splitlines(keepends=True):
            bare = line.rstrip("\r\n")
            end = "\n" if line.endswith("\n") else ""
            if self._in_key and (PEM_END.search(bare) or PEM_INSIDE.match(bare)):
                out.append(f"[masked: private-key]{end}")
                self._key_lines += 1
                self._in_key = not PEM_END.search(bare) and self._key_lines < PEM_HELD_LINES
            elif PEM_END.search(bare):
                out.extend("[masked: private-key]" + ("\n" if held.endswith("\n") else "") for held in self._held)
                self._held = []
                out.append(f"[masked: private-key]{end}")
            elif PEM_BODY.match(bare) and len(self._held) < PEM_HELD_LINES:
                self._held.append(line)
            else:
                out.extend(self._release())
                hit = detect(bare)
                self._in_key = hit is not None and hit.kind == "private-key" and not PEM_END.search(bare)
                self._key_lines = 0
                out.append(f"[masked: {hit.kind}]{end}" if hit else line)
        return "".join(out)

    def _release(self) -> list[str]:
        held, self._held = self._held, []
        return [masked_line(line) for line in held]

    def flush(self) -> str:
        """What is held, masked line by line: the stream ended without an END line."""
        return "".join(self._release())


def masked_line(line: str) -> str:
    hit = detect(line.rstrip("\r\n"))
    return f"[masked: {hit.kind}]" + ("\n" if line.endswith("\n") else "") if hit else line


def masked(text: str) -> str:
    """``text`` with each line that holds a credential replaced by ``[masked: <kind>]``, and every
    line of a PEM private key (Masker)."""
    masker = Masker()
    return masker.feed(text) + masker.flush()


def masked_stream(chunks: Iterable[str]) -> Iterator[str]:
    """Complete lines of ``chunks``, masked; ``""`` passes through (a tick with no output). What is
    left without a newline at the end is masked and sent last.

    A line longer than MAX_LINE_BYTES is sent up to its last carriage return (a progress bar's
    redraw; the detector reads each redraw as a line of its own); one without any is left out
    with a note up to its newline: cut anywhere else, a credential could fall across the cut."""
    pending, skipping, masker = "", False, Masker()
    for chunk in chunks:
        if not chunk:
            yield masker.flush()  # a quiet moment: held lines go out, at worst late ("" when none)
            continue
        if skipping:
            newline = chunk.find("\n")
            if newline < 0:
                continue
            chunk, skipping = chunk[newline + 1:], False
        pending += chunk
        cut = pending.rfind("\n") + 1
        if not cut and len(pending) > MAX_LINE_BYTES:
            cut = pending.rfind("\r") + 1
            if not cut:
                pending, skipping = "", True
                yield masker.flush() + LONG_LINE_NOTE
                continue
        if cut:
            yield masker.feed(pending[:cut])
            pending = pending[cut:]
    yield masker.feed(pending) + masker.flush() if pending else masker.flush()


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
    cannot recognise (or inside a UTF-8 sequence). A window with no newline starts after its first
    carriage return (a progress bar's redraw), and with neither it is one cut line: left out with
    a note, never kept in part."""
    if len(data) > tail_bytes:
        data = data[-tail_bytes:]
        boundary = data.find(b"\n")
        if boundary < 0:
            boundary = data.find(b"\r")
        if boundary < 0:
            return TAIL_CUT_NOTE if len(TAIL_CUT_NOTE) <= tail_bytes else ""
        data = data[boundary + 1:]
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
    return fit(masked(tail_text(data, tail_bytes)), tail_bytes)


def fit(text: str, tail_bytes: int) -> str:
    """``text`` (already masked) without its first whole lines while its UTF-8 is longer than
    ``tail_bytes``: decoding (U+FFFD for each undecodable byte is three) and masking can lengthen a
    tail, and what is kept in the database stays within its configured bound."""
    data = text.encode()
    if len(data) <= tail_bytes:
        return text
    data = data[-tail_bytes:]
    return data[data.find(b"\n") + 1:].decode() if b"\n" in data else ""


def ranks(runner: Any, run_id: str) -> tuple[int, ...]:
    """The ranks of the run that have (or will have) output; one for a runner without ``ranks``."""
    reader = getattr(runner, "ranks", None)
    return tuple(reader(run_id)) if reader is not None else (0,)
