"""The secret scan's memory of clean files: skips only exact bytes this detector found clean, never a finding."""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import pytest

from safety import scan_cache, secret_scan
from tests.safety.test_secret_matrix import NEW_FORMATS


@pytest.fixture
def tree(fleet_out: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "cdktf.out"
    shutil.copytree(fleet_out, copy)
    return copy


@pytest.fixture
def scanned(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files the detector actually walked."""
    seen: list[str] = []
    real = secret_scan._scan

    def recording(data: bytes, path: Path):
        seen.append(Path(path).parent.name)
        return real(data, path)

    monkeypatch.setattr(secret_scan, "_scan", recording)
    return seen


def test_clean_files_are_skipped_and_a_changed_file_is_scanned_again(tree: Path, tmp_path: Path, scanned: list[str]) -> None:
    cache = tmp_path / "scan-cache"
    files = sorted(tree.rglob("*.json"))
    assert secret_scan.scan_paths([tree], cache=cache) == [] and len(scanned) == len(files)
    scanned.clear()
    assert secret_scan.scan_paths([tree], cache=cache) == [] and scanned == []  # every file remembered clean

    stack = tree / "stacks" / "dev-gke" / "cdk.tf.json"
    data = json.loads(stack.read_text())
    planted = NEW_FORMATS(random.Random(5))["groq"]
    data["locals"] = {"leak": planted}
    stack.write_text(json.dumps(data))
    for _ in range(2):  # a finding is never remembered: reported on every run
        scanned.clear()
        findings = secret_scan.scan_paths([tree], cache=cache)
        assert [(Path(f.file).parent.name, f.path, f.kind) for f in findings] == [("dev-gke", "$.locals.leak", "groq-key")]
        assert scanned == ["dev-gke"] and planted not in str(findings)


def test_a_changed_detector_or_a_deleted_cache_scans_everything_again(tree: Path, tmp_path: Path, scanned: list[str],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "scan-cache"
    secret_scan.scan_paths([tree], cache=cache)
    count = len(scanned)
    code = tmp_path / "secrets.py"
    code.write_text(scan_cache.DETECTOR_FILES[0].read_text() + "\n# a new format\n")
    monkeypatch.setattr(scan_cache, "DETECTOR_FILES", (code, scan_cache.DETECTOR_FILES[1]))
    scan_cache.detector_digest.cache_clear()
    try:
        scanned.clear()
        secret_scan.scan_paths([tree], cache=cache)
        assert len(scanned) == count
    finally:
        scan_cache.detector_digest.cache_clear()
    monkeypatch.undo()
    shutil.rmtree(cache)
    scanned.clear()
    monkeypatch.setattr(secret_scan, "_scan", lambda data, path: (scanned.append(path), [])[1])
    assert secret_scan.scan_paths([tree], cache=cache) == [] and len(scanned) == count


def test_a_clean_mark_in_a_cache_another_user_can_write_hides_nothing(tree: Path, tmp_path: Path,
                                                                      capfd: pytest.CaptureFixture) -> None:
    """An empty file named by a key is all a clean mark is: anyone able to write the cache could
    mark a file holding a secret clean. A group- or world-writable cache, one owned by another user
    and a mark that is a symlink are not trusted."""
    stack = tree / "stacks" / "dev-gke" / "cdk.tf.json"
    data = json.loads(stack.read_text())
    data["locals"] = {"leak": NEW_FORMATS(random.Random(5))["groq"]}
    stack.write_text(json.dumps(data))
    mark = scan_cache._path(tmp_path / "scan-cache", scan_cache.key(stack.read_bytes()))

    cache = tmp_path / "scan-cache"
    cache.mkdir(mode=0o777)
    cache.chmod(0o777)
    mark.parent.mkdir()
    mark.touch()  # planted by another user
    assert [f.kind for f in secret_scan.scan_paths([tree], cache=cache)] == ["groq-key"]
    assert "chmod go-w" in capfd.readouterr().err

    cache.chmod(0o700)
    os.chown(cache, 65534, 65534)
    assert [f.kind for f in secret_scan.scan_paths([tree], cache=cache)] == ["groq-key"]

    os.chown(cache, os.getuid(), os.getgid())
    shutil.rmtree(mark.parent)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / mark.name).touch()
    mark.parent.symlink_to(outside)
    assert [f.kind for f in secret_scan.scan_paths([tree], cache=cache)] == ["groq-key"]


def test_the_detector_digest_names_the_python_running_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The detector is regular expressions and ``json``/``base64`` of the standard library: another Python
    can match differently, so a clean mark made under one is not trusted under another."""
    scan_cache.detector_digest.cache_clear()
    base = scan_cache.detector_digest()
    monkeypatch.setattr("sys.version", "3.99.0 (another build)")
    scan_cache.detector_digest.cache_clear()
    try:
        assert scan_cache.detector_digest() != base
    finally:
        monkeypatch.undo()
        scan_cache.detector_digest.cache_clear()
