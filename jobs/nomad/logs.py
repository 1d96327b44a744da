"""A Nomad run's output through the client filesystem logs API, ``GET /v1/client/fs/logs/:alloc_id``.

Checked against hashicorp/nomad (commit aa026cc, after v1.11.0-rc.1):

- Parameters (command/agent/fs_endpoint.go:267-326, ``Logs``): ``task`` (required, else 400 "must
  provide task name"), ``type`` ``stdout``|``stderr`` (else 400), ``follow`` and ``plain`` (booleans,
  default false), ``offset`` (int64), ``origin`` ``start``|``end`` (default start; else 400 "origin
  must be start or end"). With ``origin=end`` the offset counts back from the end of the newest log
  file (client/fs_endpoint.go:563: ``offset *= -1``). api/fs.go:259-272 sends the same names.
- Framing: ``plain=true`` is the raw bytes, Content-Type text/plain (command/agent/fs_endpoint.go:332-336);
  otherwise a stream of JSON ``StreamFrame`` objects, concatenated (the client's json.Decoder reads
  them one after another, api/fs.go:286-299): ``{"Offset": int, "Data": base64, "File": str,
  "FileEvent": str}``, every field omitempty (client/lib/streamframer/framer.go:20-33). ``Offset``
  is the file offset *after* the frame's data (client/fs_endpoint.go:701-711, framer.go:268). An idle
  stream sends a heartbeat frame ``{}`` every second (client/fs_endpoint.go:50, streamHeartbeatRate),
  which is what lets a follower notice its run ended: Nomad itself keeps a follow open after the
  task exits (logsImpl waits for the next log file, client/fs_endpoint.go:607).
- Errors, as plain-text bodies with the status (command/agent/http.go:764-770): an allocation the
  client or server no longer knows (garbage-collected) is 404 ``Unknown allocation "<id>"``
  (nomad/structs/errors.go:33,136-137; client/fs_endpoint.go:364; nomad/client_fs_endpoint.go:
  392) or 404 ``state for allocation <id> not found on client`` (client/fs_endpoint.go:369);
  a task the allocation does not have is 400 ``unknown task name "<task>"`` (client/fs_endpoint.go:
  437); a task not started yet is 404 ``task "<task>" not started yet. No logs available``
  (client/fs_endpoint.go:445); a task with no log file yet is 404 ``log entry for task "<task>"
  and log type "<type>" not found`` (client/fs_endpoint.go:910).
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from jobs.logs import arriving, last_lines
from jobs.nomad.client import NomadError
from jobs.spec import TASK

if TYPE_CHECKING:
    from jobs.nomad.client import NomadClient

# The first window of a follow is gathered this long at most before it is shown.
INITIAL_WINDOW_SECONDS = 0.5
# A follow reads at most this long without a byte; Nomad's heartbeat comes every second.
FOLLOW_READ_TIMEOUT_SECONDS = 30.0


class AllocationGone(Exception):
    """Nomad no longer knows the allocation (garbage-collected with its job, or its node is gone)."""


def _params(*, task: str, stderr: bool, follow: bool, plain: bool, origin: str, offset: int) -> dict[str, str]:
    return {"task": task, "type": "stderr" if stderr else "stdout", "follow": str(follow).lower(), "plain": str(plain).lower(),
            "origin": origin, "offset": str(offset)}


def _empty(status: int, text: str) -> bool:
    """A known answer meaning "no output yet": raises for a gone allocation, NomadError for the rest."""
    if status == 404 and (text.startswith("Unknown allocation") or "not found on client" in text):
        raise AllocationGone(text)
    if status == 404 and ("not started yet" in text or text.startswith("log entry for task")):
        return True
    raise NomadError(f"logs: Nomad answered {status} ({text.splitlines()[0][:200] if text else 'no message'}); "
                     "check NOMAD_TOKEN has read-logs in the run's namespace")


def read_tail(client: NomadClient, alloc_id: str, *, stderr: bool, tail_bytes: int, task: str = TASK) -> bytes:
    """The last ``tail_bytes`` of the task's stdout (or stderr), as Nomad keeps them on its client,
    and one byte more when there is more: so the caller sees the window began inside a line (and
    drops that piece, which could be the second half of a credential the detector cannot know)."""
    path = f"/v1/client/fs/logs/{alloc_id}"
    response = client.get(path, _params(task=task, stderr=stderr, follow=False, plain=True, origin="end", offset=tail_bytes + 1))
    if response.status_code != 200:
        _empty(response.status_code, response.text.strip())
        return b""
    return response.content[-(tail_bytes + 1):]


def _frames(response: object, stop: threading.Event) -> Iterator[dict[str, object]]:
    """Each StreamFrame of a ``plain=false`` answer, heartbeats (``{}``) included. A stream that
    breaks off (no heartbeat for FOLLOW_READ_TIMEOUT_SECONDS, a reset) is a NomadError."""
    import urllib3

    decoder, buffer = json.JSONDecoder(), ""
    try:
        for chunk in arriving(response.raw):  # type: ignore[attr-defined]
            buffer += chunk.decode("utf-8")
            while buffer := buffer.lstrip():
                try:
                    frame, end = decoder.raw_decode(buffer)
                except ValueError:
                    break  # the rest of this frame is still on its way
                buffer = buffer[end:]
                yield frame
            if stop.is_set():
                return
    except urllib3.exceptions.HTTPError as exc:
        raise NomadError(f"logs: the follow stream from Nomad broke off ({type(exc).__name__}); follow again") from None


def follow(client: NomadClient, alloc_id: str, *, stderr: bool, tail_bytes: int, tail_lines: int | None, stop: threading.Event,
           task: str = TASK) -> Iterator[bytes]:
    """The last ``tail_bytes`` (only its last ``tail_lines`` lines when given), then each new chunk
    as the task writes it; ``b""`` on each heartbeat so the caller can look at the clock and the
    run. Ends when ``stop`` is set (checked at least every heartbeat) or Nomad closes the stream."""
    path = f"/v1/client/fs/logs/{alloc_id}"
    params = _params(task=task, stderr=stderr, follow=True, plain=False, origin="end", offset=tail_bytes)
    response = client.get(path, params, stream=True, read_timeout_seconds=FOLLOW_READ_TIMEOUT_SECONDS)
    if response.status_code != 200:
        text = response.text.strip()
        response.close()
        _empty(response.status_code, text)
        return
    first, cut, burst, burst_until = True, False, b"", time.monotonic() + INITIAL_WINDOW_SECONDS
    try:
        for frame in _frames(response, stop):
            data = base64.b64decode(str(frame.get("Data") or ""))
            if first and data:
                first = False
                cut = int(frame.get("Offset") or 0) > len(data)  # began mid-file: the first line is cut
            if cut and data:
                # Dropped up to its newline, which may be frames later (a line longer than a frame):
                # any rest of it could start with the second half of a credential.
                cut = b"\n" not in data
                data = b"" if cut else data[data.find(b"\n") + 1:]
            if burst is not None:
                # The window Nomad sends at once ends at its first heartbeat, at tail_bytes, or after a
                # short bound: a task that prints without pause would otherwise never see a heartbeat
                # and the follower would see nothing (bench/logs.py found 20 s of silence).
                burst += data
                if data and len(burst) < tail_bytes and time.monotonic() < burst_until:
                    continue
                yield last_lines(burst, tail_lines)
                burst = None
                if data:
                    continue
            yield data
            if stop.is_set():
                return
        if burst:
            yield last_lines(burst, tail_lines)
    finally:
        response.close()
