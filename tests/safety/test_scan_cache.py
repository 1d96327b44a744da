"""The secret scan's memory of clean files: skips only exact bytes this detector found clean, never a finding."""

from __future__ import annotations

import json
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
