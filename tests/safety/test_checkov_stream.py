"""Stacks scanned while synthesis writes them (checkov_scan.Stream) give ``run``'s summary and cache, never a copy's
result for a stack whose final bytes differ; a synthesis that fails stores nothing. Real checkov 3.3.30."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from safety import checkov_cache, checkov_scan

STACKS = ("dev-gke", "dev-gke-scheduler", "prod-gke")
FAILING = {"resource": {"google_compute_firewall": {"ssh": {"name": "ssh", "network": "default", "source_ranges": ["0.0.0.0/0"],
                                                            "allow": [{"protocol": "tcp", "ports": ["22"]}]}}}}


@pytest.fixture()
def stacks(fleet_out: Path, tmp_path: Path) -> list[Path]:
    copies = []
    for name in STACKS:
        copies.append(tmp_path / "out" / "stacks" / name)
        shutil.copytree(fleet_out / "stacks" / name, copies[-1])
    return copies


def _scanned(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Stack names ``run`` (the part after synthesis) scanned."""
    from tests.safety.test_checkov_cache import count_scans

    return count_scans(monkeypatch)


def _drained(stream: checkov_scan.Stream, names: list[str]) -> None:
    """Wait until the stream's worker scanned ``names`` (so ``finish`` has copies' results to use)."""
    deadline = time.monotonic() + 300
    while not set(names) <= set(stream.results):
        assert time.monotonic() < deadline, stream.results
        time.sleep(0.1)


def _entries(cache: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(cache.rglob("*.json"))}


def test_streamed_results_are_runs_summary_and_cache(stacks: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(checkov_cache.CACHE_ENV, str(tmp_path / "plain-cache"))
    plain = checkov_scan.run(stacks)  # the skips of .checkov-skips.yaml, as a Stream uses
    monkeypatch.setenv(checkov_cache.CACHE_ENV, str(tmp_path / "stream-cache"))
    scanned = _scanned(monkeypatch)
    with checkov_scan.streamed(True) as stream:
        assert stream is not None
        for directory in reversed(stacks):  # in any order
            stream.add(directory)
        _drained(stream, list(STACKS))
        summary = stream.finish(stacks)
    assert scanned == []  # every result came from the stream
    assert summary == plain and summary.ok
    assert _entries(tmp_path / "stream-cache") == _entries(tmp_path / "plain-cache") != {}


def test_a_stack_whose_final_bytes_differ_from_its_copy_is_scanned_again(stacks: list[Path], tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(checkov_cache.CACHE_ENV, "off")
    scanned = _scanned(monkeypatch)
    with checkov_scan.streamed(True) as stream:
        assert stream is not None
        for directory in stacks:
            stream.add(directory)
        _drained(stream, list(STACKS))
        (stacks[0] / "cdk.tf.json").write_text(json.dumps(FAILING, indent=2))  # rewritten after it was handed over
        summary = stream.finish(stacks)
    assert scanned == [STACKS[0]]
    assert summary == checkov_scan.run(stacks)
    assert {f.check_id for f in summary.stacks[0].failures} >= {"CKV_GCP_2"}


def test_a_stream_closed_without_finish_stores_nothing_and_leaves_nothing(stacks: list[Path], tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A synthesis that fails after some stacks were scanned: the cache stays as it was, no worker or copy is left."""
    monkeypatch.setenv(checkov_cache.CACHE_ENV, str(tmp_path / "cache"))
    with checkov_scan.streamed(True) as stream:
        assert stream is not None
        stream.add(stacks[0])
        _drained(stream, [STACKS[0]])
        worker, root = stream.worker, stream.root
    assert _entries(tmp_path / "cache") == {}
    assert worker is not None and worker.ended and worker.process.poll() is not None
    assert not root.exists()


def test_a_stack_told_twice_is_scanned_after_synthesis(stacks: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Two copies of one name could be scanned in either order: neither result is used."""
    monkeypatch.setenv(checkov_cache.CACHE_ENV, "off")
    scanned = _scanned(monkeypatch)
    with checkov_scan.streamed(True) as stream:
        assert stream is not None
        for directory in [*stacks, stacks[0]]:
            stream.add(directory)
        _drained(stream, list(STACKS[1:]))
        summary = stream.finish(stacks)
    assert scanned == [STACKS[0]]
    assert summary == checkov_scan.run(stacks)


def test_a_cache_another_user_could_write_is_reported_once_as_run_reports_it(stacks: list[Path], tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch,
                                                                            capfd: pytest.CaptureFixture) -> None:
    """``cache_trust.prepare`` prints one line when it refuses a cache: a streamed check prints it once, as the scan
    after synthesis does, not once when the stream starts and again in ``finish``."""
    cache = tmp_path / "shared-cache"
    cache.mkdir()
    cache.chmod(0o777)
    monkeypatch.setenv(checkov_cache.CACHE_ENV, str(cache))
    plain = checkov_scan.run(stacks[:1])
    assert capfd.readouterr().err.count("chmod go-w") == 1
    with checkov_scan.streamed(True) as stream:
        assert stream is not None
        stream.add(stacks[0])
        _drained(stream, [STACKS[0]])
        summary = stream.finish(stacks[:1])
    assert summary == plain
    assert capfd.readouterr().err.count("chmod go-w") == 1
    assert _entries(cache) == {}


def test_a_stack_the_streams_worker_could_not_scan_is_scanned_again(stacks: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """The stream's worker runs beside synthesis (the memory of both at once): killed there, every stack it had
    is an error, which is no result of the stack's bytes. ``finish`` scans those stacks again, with a fresh worker,
    so the check reports what the scan after synthesis reports."""
    monkeypatch.setenv(checkov_cache.CACHE_ENV, "off")
    with checkov_scan.streamed(True) as stream:
        assert stream is not None
        stream.add(stacks[0])
        _drained(stream, [STACKS[0]])
        assert stream.worker is not None
        stream.worker.process.kill()
        for directory in stacks[1:]:
            stream.add(directory)
        _drained(stream, list(STACKS[1:]))
        assert all(stream.results[name].error for name in STACKS[1:])
        summary = stream.finish(stacks)
    assert summary == checkov_scan.run(stacks) and summary.ok


def _tell_hits(stream: checkov_scan.Stream | None, stacks: list[Path]) -> None:
    """Tell ``stream`` every stack, all of them in the cache (``_filled``): each is kept as a hit."""
    assert stream is not None
    for directory in stacks:
        stream.add(directory)
    assert sorted(stream.served) == sorted(STACKS)


def _filled(stacks: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[checkov_scan.CheckovSummary, dict[str, bytes]]:
    """``run``'s summary of ``stacks`` and the cache it filled (``$GPUFLEET_CHECKOV_CACHE`` points at it)."""
    monkeypatch.setenv(checkov_cache.CACHE_ENV, str(tmp_path / "cache"))
    return checkov_scan.run(stacks), _entries(tmp_path / "cache")


def test_stacks_the_cache_holds_are_served_without_a_copy_a_scan_or_a_store(stacks: list[Path], tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A one-cluster edit: the rest of the fleet is in the cache. ``add`` looks each stack up from its bytes and
    copies only a miss (copying every stack first was a third of the main process's time in a one-edit check at
    200 clusters); ``finish`` gives ``run``'s summary and writes no entry again."""
    plain, entries = _filled(stacks[1:], tmp_path, monkeypatch)
    stored: list[str] = []
    real_store = checkov_cache.store
    monkeypatch.setattr(checkov_cache, "store", lambda cache, digest, result: (stored.append(result.stack), real_store(cache, digest, result)))
    scanned = _scanned(monkeypatch)
    with checkov_scan.streamed(True) as stream:
        assert stream is not None
        for directory in stacks:
            stream.add(directory)
        assert sorted(p.name for p in stream.root.iterdir()) == [STACKS[0]]  # only the miss was copied
        assert sorted(stream.served) == sorted(STACKS[1:])
        _drained(stream, [STACKS[0]])
        summary = stream.finish(stacks)
    assert scanned == [] and stored == [STACKS[0]]
    assert summary == checkov_scan.run(stacks) and summary.stacks[1:] == plain.stacks
    assert {k: v for k, v in _entries(tmp_path / "cache").items() if k in entries} == entries


def test_a_served_stack_whose_final_bytes_differ_is_not_served(stacks: list[Path], tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A hit is a result of the bytes ``add`` read: a stack rewritten afterwards gets its own (here: a scan)."""
    _filled(stacks, tmp_path, monkeypatch)
    scanned = _scanned(monkeypatch)
    with checkov_scan.streamed(True) as stream:
        _tell_hits(stream, stacks)
        (stacks[0] / "cdk.tf.json").write_text(json.dumps(FAILING, indent=2))
        summary = stream.finish(stacks)
    assert scanned == [STACKS[0]]
    assert summary == checkov_scan.run(stacks)
    assert {f.check_id for f in summary.stacks[0].failures} >= {"CKV_GCP_2"}


def test_a_served_stack_told_twice_is_looked_up_again(stacks: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two stacks of one name: the first one's hit is dropped, and ``finish`` decides from the final bytes."""
    _filled(stacks, tmp_path, monkeypatch)
    other = tmp_path / "elsewhere" / STACKS[0]
    other.mkdir(parents=True)
    (other / "cdk.tf.json").write_text(json.dumps(FAILING, indent=2))
    scanned = _scanned(monkeypatch)
    with checkov_scan.streamed(True) as stream:
        assert stream is not None
        for directory in [*stacks, other]:
            stream.add(directory)
        assert sorted(stream.served) == sorted(STACKS[1:])
        summary = stream.finish(stacks)
    assert scanned == []  # the final dev-gke is the cached one: served by run's lookup
    assert summary == checkov_scan.run(stacks) and summary.ok


@pytest.mark.parametrize("change", ["settings", "rules"])
def test_results_of_settings_or_rules_changed_during_the_stream_are_neither_served_nor_stored(
        change: str, stacks: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A red team's find: a hit's key, and a scan's result, are of the rules and checkov's settings the stream
    started with. A ``.checkov.yaml`` written (or a rule file edited) before ``finish``: every stack is decided
    then, under the new key, and what the cache keeps is what ``run`` with the new settings gives."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    _filled(stacks, tmp_path, monkeypatch)
    with checkov_scan.streamed(True) as stream:
        _tell_hits(stream, stacks)
        if change == "settings":
            (tmp_path / "home" / ".checkov.yaml").write_text("check: CKV_GCP_2\n")
        else:
            rules = tmp_path / "checkov_exempt.py"
            rules.write_text(Path(checkov_cache.checkov_exempt.__file__).read_text() + "\n# an edit\n")
            monkeypatch.setattr(checkov_cache, "_RULES", (*checkov_cache._RULES[:2], rules))
        summary = stream.finish(stacks)
    scanned = _scanned(monkeypatch)
    assert checkov_scan.run(stacks) == summary and scanned == []  # the cache now holds them under the new key
    monkeypatch.setenv(checkov_cache.CACHE_ENV, "off")
    assert summary == checkov_scan.run(stacks)  # and they are checkov's with the new settings
    if change == "settings":
        assert sum(s.passed for s in summary.stacks) < 30  # only CKV_GCP_2 runs


def test_results_of_another_checkov_version_are_neither_served_nor_stored(stacks: list[Path], tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The fact-check of the fix above: checkov upgraded while a check streams (its version is part of every key)
    is the same case as changed settings. Every stack is decided in ``finish``, under the new version's key."""
    _filled(stacks, tmp_path, monkeypatch)
    with checkov_scan.streamed(True) as stream:
        _tell_hits(stream, stacks)
        real = checkov_cache.checkov_version
        monkeypatch.setattr(checkov_cache, "checkov_version", lambda binary: real(binary) + ";upgraded")
        scanned = _scanned(monkeypatch)
        summary = stream.finish(stacks)
    assert sorted(scanned) == sorted(STACKS)  # nothing served: the cache holds no result of the new version
    assert summary == checkov_scan.run(stacks)
    rescanned = _scanned(monkeypatch)
    assert checkov_scan.run(stacks) == summary and rescanned == []  # stored under the new version's key
