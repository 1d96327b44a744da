"""``vault_policies.policies.hcl_loads`` (one pyhcl parser per process) parses as ``hcl.loads`` (a new parser, and
new LALR tables, per call): the same values and the same errors, also after an error and from several threads."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import hcl
import pytest

from vault_policies.policies import hcl_loads

ROOT = Path(__file__).resolve().parents[2]
ODD = ['path "secret/data/x" { capabilities = ["read"] }', 'path "a" {\n  capabilities = ["read", "list"]\n}\n# c\n/* m */\n',
       'a = 1\nb = "two"\nc = [1, 2]\nd { e = true }\n', "", "   ", '{"path": {"a": {"capabilities": ["read"]}}}',
       'x = <<EOT\nheredoc ${var}\nEOT\n', 'a = 1.5e3\nb = -2\nc = 0x1F\n', 'a "b" "c" { d = "e" }\na "b" "f" { g = 1 }\n']
BROKEN = ['path "a" {', 'path "a" { capabilities = ["read" }', "= 1", 'a = "unterminated', "a = [1,,2]", "{ not json"]


def _outcome(parse, text: str) -> tuple[str, object]:
    try:
        return "ok", parse(text)
    except ValueError as exc:
        return "error", str(exc)


def _texts() -> list[str]:
    files = sorted((ROOT / "vault_policies").rglob("*.hcl")) + sorted((ROOT / "tests").rglob("*.hcl"))
    assert len(files) >= 6
    return [f.read_text() for f in files] + ODD + BROKEN


@pytest.mark.parametrize("text", _texts())
def test_the_same_result_or_the_same_error_as_hcl_loads(text: str) -> None:
    assert _outcome(hcl_loads, text) == _outcome(hcl.loads, text)


def test_a_parse_after_an_error_and_parses_from_threads_are_unaffected() -> None:
    texts = _texts()
    expected = [_outcome(hcl.loads, t) for t in texts]
    assert [_outcome(hcl_loads, t) for t in texts + texts] == expected + expected  # errors interleaved with parses
    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(lambda t: _outcome(hcl_loads, t), texts * 4)) == expected * 4
