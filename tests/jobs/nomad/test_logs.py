"""Nomad logs through ``/v1/client/fs/logs/:alloc_id`` against the API double (no Nomad binary
exists here), which answers as jobs/nomad/logs.py documents from hashicorp/nomad's source."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from jobs.loader import find, load
from jobs.nomad import logs as nomad_logs
from jobs.nomad.client import NomadClient, NomadError
from jobs.runner import NomadRunner, RunNotFound
from tests.jobs.nomad_double import NomadDouble

META = {"dataset_uri": "hf://datasets/demo/tiny@v1", "run_id": "demo-1"}


@pytest.fixture
def placed(nomad: NomadDouble, client_for: Callable[..., NomadClient]) -> tuple[NomadClient, str, str]:
    """A dispatched run of finetune-llama whose task started: (client, job id, alloc id)."""
    client = client_for(nomad)
    spec = load(find("finetune-llama"))
    client.register(spec)
    job_id = client.dispatch(spec, META, role_id="r", wrapping_token="s.wrap", idempotency_token="logs-1").dispatched_job_id
    return client, job_id, nomad.start_task(job_id)


def test_the_tail_is_asked_with_upstreams_parameter_names_and_values(nomad: NomadDouble, placed) -> None:
    client, _, alloc = placed
    nomad.write_log(alloc, "".join(f"step {i}\n" for i in range(100)))
    nomad.write_log(alloc, "oops\n", stderr=True)
    assert nomad_logs.read_tail(client, alloc, stderr=False, tail_bytes=16) == b"\nstep 98\nstep 99\n"  # 16 bytes and one more
    assert nomad_logs.read_tail(client, alloc, stderr=True, tail_bytes=1024) == b"oops\n"
    request = nomad.calls("GET", "fs-logs")[0]
    assert request.path == f"/v1/client/fs/logs/{alloc}"
    # command/agent/fs_endpoint.go:267-326: these names; type is stdout|stderr, origin start|end.
    assert request.query == {"task": ["train"], "type": ["stdout"], "follow": ["false"], "plain": ["true"], "origin": ["end"], "offset": ["17"]}
    assert request.headers["X-Nomad-Token"] == nomad.acl_token


def test_a_garbage_collected_allocation_is_gone_and_a_wrong_task_is_an_error(nomad: NomadDouble, placed) -> None:
    client, job_id, alloc = placed
    with pytest.raises(NomadError, match='unknown task name "eval"'):
        nomad_logs.read_tail(client, alloc, stderr=False, tail_bytes=10, task="eval")
    nomad.gc(job_id)
    with pytest.raises(nomad_logs.AllocationGone, match=f'Unknown allocation "{alloc}"'):
        nomad_logs.read_tail(client, alloc, stderr=False, tail_bytes=10)


def test_a_task_not_started_yet_has_no_output(nomad: NomadDouble, client_for: Callable[..., NomadClient]) -> None:
    client = client_for(nomad)
    spec = load(find("finetune-llama"))
    client.register(spec)
    job_id = client.dispatch(spec, META, role_id="r", wrapping_token="s.wrap", idempotency_token="logs-2").dispatched_job_id
    (alloc,) = [a["ID"] for a in nomad.state.allocations[job_id]]
    nomad.state.allocations[job_id][0]["TaskStates"] = {"train": {"State": "pending", "Events": []}}
    assert nomad_logs.read_tail(client, alloc, stderr=False, tail_bytes=10) == b""


def test_follow_decodes_frames_drops_the_cut_first_line_ticks_on_heartbeats_and_stops(nomad: NomadDouble, placed) -> None:
    client, _, alloc = placed
    nomad.heartbeat_seconds = 0.2
    nomad.write_log(alloc, "first line is long\nsecond\n")
    stop = threading.Event()
    chunks = nomad_logs.follow(client, alloc, stderr=False, tail_bytes=10, tail_lines=None, stop=stop)
    assert next(chunks) == b"second\n"  # the window began inside the first line
    nomad.write_log(alloc, "third\n")
    seen = b""
    for chunk in chunks:
        seen += chunk
        if chunk == b"" and b"third" in seen:
            stop.set()
    assert seen.replace(b"", b"") == b"third\n"
    request = nomad.calls("GET", "fs-logs")[0]
    assert (request.query["follow"], request.query["plain"], request.query["origin"]) == (["true"], ["false"], ["end"])


def test_the_runner_reads_the_newest_allocation_and_maps_gc_to_run_not_found(nomad: NomadDouble, placed) -> None:
    client, job_id, alloc = placed
    runner = NomadRunner(client, {})
    nomad.write_log(alloc, "hello\n")
    run_id = f"finetune/{job_id}"
    assert b"".join(runner.logs(run_id)) == b"hello\n"
    nomad.gc(job_id)
    with pytest.raises(RunNotFound):
        b"".join(runner.logs(run_id))


def test_a_tail_window_that_begins_inside_a_credential_drops_that_piece(nomad: NomadDouble, placed) -> None:
    """The window's first line is cut: its rest could be the second half of a key, which the
    detector cannot recognise; it must not be shown or stored."""
    import random

    from jobs.logs import read_logs
    from tests.safety.test_secret_matrix import NEW_FORMATS

    client, job_id, alloc = placed
    planted = NEW_FORMATS(random.Random(11))["groq"]
    nomad.write_log(alloc, f"GROQ_API_KEY={planted}\nstep 1\n")
    text = read_logs(NomadRunner(client, {}), f"finetune/{job_id}", tail_bytes=len(planted) - 4 + len("\nstep 1\n"))
    assert text == "step 1\n" and planted[-12:] not in text


def test_follow_with_tail_lines_starts_with_the_last_lines_of_the_window(nomad: NomadDouble, placed) -> None:
    client, _, alloc = placed
    nomad.heartbeat_seconds = 0.2
    nomad.write_log(alloc, "a\nb\nc\n")
    stop = threading.Event()
    chunks = nomad_logs.follow(client, alloc, stderr=False, tail_bytes=1024, tail_lines=2, stop=stop)
    assert next(chunks) == b"b\nc\n"  # the burst Nomad sent before its first heartbeat, cut to 2 lines
    stop.set()
    assert b"".join(chunks) == b""


def test_follow_shows_the_first_window_while_the_task_prints_without_pause(nomad: NomadDouble, placed) -> None:
    """bench/logs.py: the first window waited for Nomad's first heartbeat; the double (like a quiet-only
    heartbeat) sends none while the task prints every 0.1 s, so a follower saw nothing for 20 s."""
    client, _, alloc = placed
    nomad.heartbeat_seconds = 5.0
    nomad.write_log(alloc, "a\nb\n")
    done = threading.Event()

    def printer() -> None:
        for i in range(60):
            if done.is_set():
                return
            nomad.write_log(alloc, f"step {i}\n")
            done.wait(0.1)

    writer = threading.Thread(target=printer, daemon=True)
    writer.start()
    stop = threading.Event()
    got: list[bytes] = []

    def read() -> None:
        for chunk in nomad_logs.follow(client, alloc, stderr=False, tail_bytes=1024, tail_lines=None, stop=stop):
            if chunk:
                got.append(chunk)
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=4.0)
    stop.set()
    done.set()
    assert got and got[0].startswith(b"a\nb\n"), got
