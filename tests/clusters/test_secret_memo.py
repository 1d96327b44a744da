"""Within ``remembering_clean`` (``load_all``) ``secret_problems`` remembers strings it found clean
(clusters/source.py ``_CLEAN``): the same Problems as scanning every string every time, a credential never
remembered, the name next to a string part of what is remembered (a 40-hex string is harmless as a name
and a key as an api_key), and nothing remembered outside the block (an API request's job text) or after it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusters import source
from clusters.secrets import detect

HEX40 = "0123456789abcdef0123456789abcdef01234567"
FAKE_HF = "hf_" + "A1b2C3d4E5f6G7h8I9j0K1l2"


def _doc(text: str) -> source.YamlDocument:
    return source.parse_yaml(Path("doc.yaml"), text)


@pytest.fixture(autouse=True)
def cold() -> Iterator[None]:
    with source.remembering_clean():
        yield


def _remembered() -> set[tuple[str, str]]:
    clean = source._CLEAN.get()
    assert clean is not None
    return clean


def test_a_string_clean_under_one_name_is_still_a_credential_under_another() -> None:
    assert source.secret_problems(_doc(f"name: '{HEX40}'\n")) == []
    assert (HEX40, "name") in _remembered()
    problems = source.secret_problems(_doc(f"env:\n  api_key: '{HEX40}'\n"))
    assert [(p.line, p.field) for p in problems] == [(2, "env.api_key")]
    assert "hex40-key" in problems[0].message


def test_a_credential_is_never_remembered_and_is_found_every_time() -> None:
    doc = _doc(f"env:\n  HF_HOME: {FAKE_HF}\n")
    first, second = source.secret_problems(doc), source.secret_problems(doc)
    assert first == second and len(first) == 1
    assert not any(value == FAKE_HF for value, _ in _remembered())


def test_remembered_results_are_the_scanned_ones() -> None:
    """Every string of every repository YAML file, scanned cold and then again from memory."""
    tests = Path(__file__).resolve().parents[1]
    docs = [source.parse_yaml(p, p.read_text()) for p in sorted((tests / "fleet" / "clusters").glob("*.yaml"))]
    docs.append(_doc(f"a: {FAKE_HF}\nname: '{HEX40}'\nenv: {{api_key: '{HEX40}'}}\n"))
    cold = [source.secret_problems(doc) for doc in docs]
    assert _remembered()
    assert [source.secret_problems(doc) for doc in docs] == cold
    assert all(detect(value, field) is None for value, field in _remembered())


def test_long_strings_are_not_remembered() -> None:
    long = "x" * source._CLEAN_LONGEST
    assert source.secret_problems(_doc(f"a: {long}\nargs: ['--{long}', b]\n")) == []
    assert not any(long in value or long in field for value, field in _remembered())


def test_nothing_is_remembered_outside_the_block_or_after_it_nor_in_another_thread() -> None:
    """An API request parses a tenant's job text outside any block: its strings must not stay in the process."""
    seen: list[object] = []
    thread = threading.Thread(target=lambda: seen.append(source._CLEAN.get()))
    thread.start()
    thread.join()
    assert seen == [None]
    with source.remembering_clean():
        source.secret_problems(_doc("a: kept-inside\n"))
        assert ("kept-inside", "a") in _remembered()
    assert ("kept-inside", "a") not in _remembered()


def test_load_all_remembers_within_its_load_only() -> None:
    from clusters.loader import load_all

    fleet = Path(__file__).resolve().parents[1] / "fleet" / "clusters"
    before = set(_remembered())
    calls: list[object] = []
    original = source.detect
    try:
        source.detect = lambda value, field="": calls.append((value, field)) or original(value, field)
        load_all(fleet)
    finally:
        source.detect = original
    assert calls and len(set(calls)) == len(calls)  # each pair scanned once
    assert _remembered() == before  # the load's own set is gone with it
