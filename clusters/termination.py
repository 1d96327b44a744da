"""SIGTERM unwinds a gpufleet command the way Ctrl-C does, so what it started is cleaned up.

Python's default SIGTERM ends the process at once: no ``finally`` block and no ``atexit`` hook
runs. A ``gpufleet synth`` stopped that way (``timeout``, a CI job cancelled, ``kill``) left its
staging directory beside ``--out``, a synthesis worker synthesizing for nobody until the end, and
the jsii temporary directories of every process (gpufleet's kernel launcher, jsii's extracted
runtime, the Node kernel's own), because each of them is removed by an exit hook.

Inside ``sigterm_unwinds`` a SIGTERM raises ``Terminated`` in the main thread instead: the
command's own ``finally`` blocks stop the processes it started and remove what it wrote, and
the exit hooks stop the jsii kernel and remove its files. ``Terminated`` is a ``BaseException``,
like ``KeyboardInterrupt``, so no ``except Exception`` on the way swallows it.

The process then ends the way a SIGTERM ends it by default (killed by the signal: a shell's 143,
what systemd counts as a clean stop), by sending the signal to itself with the default action after
the last exit hook, as Python does for an uncaught ``KeyboardInterrupt``.

A further SIGTERM while it unwinds is ignored: a signal to the whole process group reaches a
synthesis worker and then its caller stops it with one more, which must not cut its clean-up short.
What keeps a stop prompt is a timer: if the unwinding has not ended the process ``GRACE_SECONDS``
after the first SIGTERM, the timer thread ends it with ``EXIT_TERMINATED`` (SIGKILL still ends it
at once).
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import NoReturn

# 128 + SIGTERM: what a shell reports for a process SIGTERM ended (the grace timer's exit status).
EXIT_TERMINATED = 128 + signal.SIGTERM
# 128 + SIGINT: what a shell reports for a process Ctrl-C ended, and what a command Ctrl-C unwound exits with.
EXIT_INTERRUPTED = 128 + signal.SIGINT
# Room for a synthesis worker's clean-up (``stacks.parallel.STOP_SECONDS``: jsii's exit hook alone may take
# 5 s waiting for a busy kernel and 5 s joining its stderr reader) and this process's own; well inside what
# systemd (90 s) and Kubernetes (30 s) give a stopped process before SIGKILL.
GRACE_SECONDS = 20.0


_state = {"terminated": False, "hooked": False, "holding": 0, "pending": False}


class Terminated(BaseException):
    """The process got SIGTERM: unwind, clean up, and die of the signal."""


def _die_of_sigterm() -> None:
    """The last exit hook (registered before any other of gpufleet's or jsii's, so it runs after them)."""
    if not _state["terminated"]:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _unwinding(_signum: int, _frame: FrameType | None) -> None:
    """A SIGTERM after the first: the process is already unwinding."""


def _terminate(_signum: int, _frame: FrameType | None) -> None:
    signal.signal(signal.SIGTERM, _unwinding)
    _state["terminated"] = True
    deadline = threading.Timer(GRACE_SECONDS, os._exit, (EXIT_TERMINATED,))
    deadline.daemon = True
    deadline.start()
    if _state["holding"]:
        _state["pending"] = True  # raised when the step ``held`` guards is whole (the grace runs meanwhile)
        return
    raise Terminated


@contextmanager
def held() -> Iterator[None]:
    """A step that must not stop half-way, such as swapping a new output tree for the previous one
    (two renames): ``Terminated`` raised between them would leave neither tree in place, and the
    caller's ``finally`` would then delete the new one. A SIGTERM inside raises ``Terminated`` when
    the block ends, replacing an exception the block raised meanwhile; the grace timer already runs.
    Only the main thread's blocks count: the handler runs there, and ``Terminated`` must be raised there.
    Another thread's block (a checkov scan thread storing a result) changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _state["holding"] += 1
    try:
        yield
    finally:
        _state["holding"] -= 1
        if _state["pending"] and not _state["holding"]:
            _state["pending"] = False
            raise Terminated


@contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """Within this block (entered in the main thread) SIGTERM raises ``Terminated``; the handler before it
    is put back after, unless a SIGTERM came, or a Ctrl-C (``KeyboardInterrupt``) left the block: then the
    process is on its way out, and the exit hooks still to run must not be cut short by the default action
    of a further one. Elsewhere than the main thread
    Python refuses signal handlers, and the block changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if not _state["hooked"]:
        atexit.register(_die_of_sigterm)
        _state["hooked"] = True
    previous = signal.signal(signal.SIGTERM, _terminate)
    interrupted = False
    try:
        yield
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        if interrupted and not _state["terminated"]:
            _interrupted()
        elif not _state["terminated"]:
            signal.signal(signal.SIGTERM, previous)


def _interrupted() -> None:
    """Ctrl-C unwound the block: the process is on its way out, as after a SIGTERM. A SIGTERM now (a synthesis
    stopping its workers, which Ctrl-C reached too) must not cut its exit hooks short, and killed the worker
    before it stopped its kernel and removed the kernel's files; it is ignored, with the same grace."""
    signal.signal(signal.SIGTERM, _unwinding)
    deadline = threading.Timer(GRACE_SECONDS, os._exit, (EXIT_TERMINATED,))
    deadline.daemon = True
    deadline.start()


def run_to_end(args: list[str], timeout: float | None = None, **popen: object) -> subprocess.CompletedProcess:
    """``subprocess.run`` (``check=False``; ``popen`` are ``Popen``'s arguments; past ``timeout`` the child is
    killed and ``subprocess.TimeoutExpired`` raised, as there) for a child that must not be cut short.
    ``subprocess.run`` SIGKILLs its child on any exception it sees, ``Terminated`` included: terraform, which on its own SIGTERM stops and releases its state lock, then left the
    lock held; gpufleet-exec, which on its SIGTERM stops its task and revokes the task's Vault token,
    left the token alive; a base synthesis of ``gpufleet preview`` (``main.py``, which unwinds on SIGTERM)
    left its jsii files. On ``Terminated`` the child is left to act on the SIGTERM its process group
    got (or to finish, when only this process got one) and waited for, its output still read; the
    grace timer bounds that wait, and a child outliving it goes on alone, as before SIGTERM unwound."""
    with subprocess.Popen(args, **popen) as proc:  # type: ignore[call-overload]
        try:
            out, err = proc.communicate(timeout=timeout)
        except Terminated:
            proc.communicate()
            raise
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
        except BaseException:
            proc.kill()
            raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def exit_now(code: int) -> NoReturn:
    """End this process with ``code`` after its exit hooks, without the interpreter's teardown.

    A process that synthesized holds the synthesis's objects (cluster configs, a jsii proxy per kernel
    object, cdktf's manifests): at 100 clusters the teardown that frees them one by one takes 0.1-0.15 s,
    after the work is done, and a ``gpufleet synth`` of 200 clusters waits for it twice (its worker's,
    before the merge, and its own). Here the exit hooks run as at any exit (``atexit``, in the same
    order: jsii's stops the kernel and the launcher's removes its files; ``logging`` flushes its
    handlers; ``weakref.finalize`` and ``TemporaryDirectory`` clean up), the standard streams are
    flushed, and ``os._exit`` skips the rest. What is skipped only frees memory: gpufleet's synthesis
    writes every file inside a ``with`` block and keeps no object whose ``__del__`` writes anything.
    A process still running a thread that is not a daemon (normal exit would wait for it) exits the
    usual way; so does one being profiled or traced (``python -m cProfile -o out gpufleet ...``, a
    debugger, coverage: such a tool writes its results once the program's ``SystemExit`` reaches it,
    which ``os._exit`` never raises), and one whose standard stream cannot take its last output (a
    full disk, a closed pipe): the interpreter's own flush then says so on stderr and ends the process
    with 120 (CPython's ``Py_Exit``), where swallowing the error ended it 0 with the output lost; the
    exit hooks, already run, are not run again (``atexit._run_exitfuncs`` clears them). A stream that
    is None (a process started with that descriptor closed) or closed is skipped, as the interpreter
    skips it."""
    if sys.getprofile() is not None or sys.gettrace() is not None or any(
            thread is not threading.main_thread() and not thread.daemon for thread in threading.enumerate()):
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        if stream is None or getattr(stream, "closed", False):
            continue
        try:
            stream.flush()
        except OSError:
            sys.exit(code)
    os._exit(code)
