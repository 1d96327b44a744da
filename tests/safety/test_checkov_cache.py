"""A cached checkov result is served only for the same input: JSON bytes, checkov version, skips, rules."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from safety import checkov_cache, checkov_exempt, checkov_scan

STACKS = ("dev-gke", "dev-gke-scheduler")


@pytest.fixture()
def scans(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """Stack names checkov really scanned (real checkov; the cache in a fresh directory)."""
    monkeypatch.setenv(checkov_cache.CACHE_ENV, str(tmp_path / "cache"))
    return count_scans(monkeypatch)


def count_scans(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Stack names ``checkov_scan.scan_chunks`` is handed from now on (the scan after synthesis)."""
    scanned: list[str] = []
    real = checkov_scan.scan_chunks

    def counting(chunks, skip_ids, binary, workers, done, warm=None):
        scanned.extend(d.name for chunk in chunks for d in chunk)
        return real(chunks, skip_ids, binary, workers, done, warm)

    monkeypatch.setattr(checkov_scan, "scan_chunks", counting)
    return scanned


@pytest.fixture()
def stacks(fleet_out: Path, tmp_path: Path) -> list[Path]:
    copies = []
    for name in STACKS:
        copies.append(tmp_path / "stacks" / name)
        shutil.copytree(fleet_out / "stacks" / name, copies[-1])
    return copies


def test_unchanged_stacks_are_served_from_the_cache(scans: list[str], stacks: list[Path]) -> None:
    first = checkov_scan.run(stacks, ["CKV_GCP_1"])
    assert sorted(scans) == sorted(STACKS)
    second = checkov_scan.run(stacks, ["CKV_GCP_1"])
    assert sorted(scans) == sorted(STACKS)  # nothing scanned again
    assert second == first


def test_a_changed_stack_json_is_scanned_again_alone(scans: list[str], stacks: list[Path]) -> None:
    first = checkov_scan.run(stacks, [])
    path = stacks[0] / "cdk.tf.json"
    path.write_bytes(path.read_bytes() + b"\n")  # one byte: same meaning, still a different input
    again = checkov_scan.run(stacks, [])
    assert scans == [*STACKS, STACKS[0]]
    assert again == first


def test_another_checkov_version_scans_everything_again(scans: list[str], stacks: list[Path],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    checkov_scan.run(stacks, [])
    monkeypatch.setattr(checkov_cache, "checkov_version", lambda binary: "0.0.0-other")
    checkov_scan.run(stacks, [])
    assert sorted(scans) == sorted(STACKS * 2)


@pytest.mark.parametrize("library", ["asteval", "PyYAML"])
def test_another_version_of_a_library_the_worker_renders_or_parses_with_is_another_key(library: str,
                                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """asteval renders expressions and libyaml parses the JSON inside the worker: a new version of either can change
    a result while checkov's own version stays, so each is part of the version the key holds."""
    import importlib.metadata
    import sys

    binary = str(Path(sys.executable).with_name("checkov"))  # this interpreter's checkov, the one the worker runs
    before = checkov_cache.checkov_version(binary)
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.0.0-other" if name == library else real(name))
    after = checkov_cache.checkov_version(binary)
    assert after != before and after.split(";")[0] == before.split(";")[0]  # checkov's own version unchanged


def test_other_skips_scan_everything_again(scans: list[str], stacks: list[Path]) -> None:
    checkov_scan.run(stacks, [])
    skipped = checkov_scan.run(stacks, ["CKV_GCP_1"])
    assert sorted(scans) == sorted(STACKS * 2)
    assert skipped.skipped_ids == ("CKV_GCP_1",)


def test_changed_exemption_rules_scan_everything_again(scans: list[str], stacks: list[Path],
                                                      monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    rules = tmp_path / "checkov_exempt.py"
    rules.write_text(Path(checkov_exempt.__file__).read_text())
    monkeypatch.setattr(checkov_cache, "_RULES", tuple(rules if p == Path(checkov_exempt.__file__) else p for p in checkov_cache._RULES))
    checkov_scan.run(stacks, [])
    rules.write_text(rules.read_text() + "\n# an edited rule\n")
    checkov_scan.run(stacks, [])
    assert sorted(scans) == sorted(STACKS * 2)


@pytest.mark.parametrize("name", ["checkov_scan.py", "checkov_worker.py", "checkov_exempt.py"])
def test_an_edit_to_any_code_that_makes_a_result_is_another_key(name: str, stacks: list[Path], tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    source = Path(checkov_scan.__file__).with_name(name)
    copy = tmp_path / name
    copy.write_text(source.read_text())
    monkeypatch.setattr(checkov_cache, "_RULES", tuple(copy if p == source else p for p in checkov_cache._RULES))
    before = checkov_cache.key(stacks[0], "3.3.30", ())
    copy.write_text(source.read_text() + "\n# an edit\n")
    assert checkov_cache.key(stacks[0], "3.3.30", ()) != before


def test_a_damaged_entry_is_a_miss_and_off_means_off(scans: list[str], stacks: list[Path],
                                                    monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    checkov_scan.run(stacks[:1], [])
    for entry in (tmp_path / "cache").rglob("*.json"):
        entry.write_text("{not json")
    checkov_scan.run(stacks[:1], [])
    monkeypatch.setenv(checkov_cache.CACHE_ENV, "off")
    checkov_scan.run(stacks[:1], [])
    assert scans == [STACKS[0]] * 3


def test_checkovs_own_config_files_and_environment_scan_everything_again(scans: list[str], stacks: list[Path], tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """checkov also reads its options from ``CKV_*`` variables (``CKV_SKIP_CHECK``, ``CKV_CHECK``, ...;
    checkov/common/util/ext_argument_parser.py ``env_var=``, checkov 3.3.30) and from ``.checkov.yaml``/
    ``.checkov.yml`` in the working directory and the home directory (checkov/common/util/config_utils.py
    ``get_default_config_paths``). A result stored while one of them skipped a check would otherwise be
    served after it is gone, hiding that check's failures."""
    base = checkov_scan.run(stacks, [])
    monkeypatch.setenv("CKV_SKIP_CHECK", "CKV_GCP_1")
    checkov_scan.run(stacks, [])
    assert sorted(scans) == sorted(STACKS * 2)
    monkeypatch.delenv("CKV_SKIP_CHECK")
    assert checkov_scan.run(stacks, []) == base and len(scans) == 4  # back to the first input: served

    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(home))
    assert checkov_scan.run(stacks, []) == base and len(scans) == 4  # no config file anywhere: same input
    (work / ".checkov.yaml").write_text("skip-check:\n  - CKV_GCP_1\n")
    checkov_scan.run(stacks, [])
    assert len(scans) == 6
    (work / ".checkov.yaml").unlink()
    (home / ".checkov.yml").write_text("skip-check:\n  - CKV_GCP_1\n")
    checkov_scan.run(stacks, [])
    assert len(scans) == 8


def test_a_result_in_a_cache_another_user_can_write_is_not_served(scans: list[str], stacks: list[Path],
                                                                  capfd: pytest.CaptureFixture) -> None:
    """A stored result is checkov's verdict: whoever can write the cache can turn failures into passes.
    A group- or world-writable cache is not used (clusters/cache_trust.py), and says so on stderr."""
    import json
    import os

    base = checkov_scan.run(stacks, [])
    cache = Path(os.environ[checkov_cache.CACHE_ENV])
    for entry in cache.rglob("*.json"):
        data = json.loads(entry.read_text())
        data.update(passed=data["passed"] + 1000, failures=[])
        entry.write_text(json.dumps(data))
    cache.chmod(0o777)
    assert checkov_scan.run(stacks, []) == base and len(scans) == 4
    assert "chmod go-w" in capfd.readouterr().err


def test_a_key_from_bytes_is_the_key_from_the_directory(stacks: list[Path]) -> None:
    """``Stream`` looks a stack up from the bytes it read (``key_of``), ``run`` from its directory (``key``), each with
    the rules and settings read once (``shared``): one key either way, so a result stored by one is found by the other."""
    for directory in stacks:
        data = (directory / "cdk.tf.json").read_bytes()
        expected = checkov_cache.key(directory, "3.3.30", ("CKV_GCP_61",))
        assert checkov_cache.key_of(directory.name, data, "3.3.30", ("CKV_GCP_61",)) == expected
        assert checkov_cache.key(directory, "3.3.30", ("CKV_GCP_61",), checkov_cache.shared()) == expected
        assert checkov_cache.key_of(directory.name + "x", data, "3.3.30", ("CKV_GCP_61",)) != expected
