"""Policy files that do not parse: one line with the line number, in words; no cascade; no traceback on Latin-1."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.openbao_fixture import REPO_ROOT
from vault_policies.policies import parse_policy
from vault_policies.validate import check


def test_fails_with_the_line_and_the_characters_expected(tmp_path: Path) -> None:
    path = tmp_path / "ml-keys-x.hcl"
    path.write_text('path "secret/data/x" {\n  capabilities = ["read"\n}\n')
    (problem,) = parse_policy(path)[1]
    assert problem.line == 3
    assert problem.message.startswith("invalid HCL: unexpected '}'; expected ',' or ']'") and "RIGHTBRACE" not in problem.message


def test_fails_on_an_unclosed_block_at_its_end(tmp_path: Path) -> None:
    path = tmp_path / "ml-keys-x.hcl"
    path.write_text('path "secret/data/x" {\n  capabilities = ["read"]\n\n')
    (problem,) = parse_policy(path)[1]
    assert problem.line == 3 and "the file ends inside a block or list" in problem.message and "a closing '}'" in problem.message


def test_fails_on_latin1_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "ml-keys-x.hcl"
    path.write_bytes(b'# caf\xe9\npath "secret/data/x" {\n  capabilities = ["read"]\n}\n')
    (problem,) = parse_policy(path)[1]
    assert str(problem) == f"{path}:1: not UTF-8 text (byte 5); save the file as UTF-8"


def test_a_broken_policy_is_reported_once_not_as_missing_for_its_role(tmp_path: Path) -> None:
    shutil.copytree(REPO_ROOT / "vault_policies", tmp_path / "vault_policies", ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    shutil.copytree(REPO_ROOT / "clusters", tmp_path / "clusters", ignore=shutil.ignore_patterns("*.py", "*.json", "__pycache__"))
    (tmp_path / "vault_policies" / "policies" / "ml-keys-finetune.hcl").write_text('path "secret/data/x" {\n')
    lines = [str(p) for p in check(tmp_path)]
    assert len(lines) == 1 and "ml-keys-finetune.hcl" in lines[0] and "invalid HCL" in lines[0], lines
