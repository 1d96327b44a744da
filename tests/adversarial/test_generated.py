"""The generated adversarial suite: every field of the cluster, job and role schemas, five ways wrong.

Each case writes the shipped example with one mutation into a temp dir and runs it through the
real entry point in-process (``gpufleet clusters --clusters-dir``, ``gpufleet jobs render <file>``,
the inputs step of ``gpufleet check`` for roles). A case that must be rejected asserts exit 2, no
traceback, one ``file:line: field: message`` line naming the file and the field, no raw regex or
pydantic text, and a fix in words; every case asserts that nothing outside the temp dir's
gpufleet-made output changed. Counts by class are printed at the end of the run (conftest).
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.adversarial.conftest import RESULTS, tree_hash
from tests.adversarial.generate import REPO, Case, all_cases

CASES = all_cases()
RAW = re.compile(r"Input should|String should|should match pattern|instance of|type=|pydantic|\^\(|\[a-z|Traceback|Error\(")
FIX = re.compile(r"\b(add|remove|rename|write|set|use|pick|lower|raise|shorten|fix|delete|move|restore|pass|keep|list|drop|"
                 r"change|give|make|replace|save|ask|copy|put|choose|quote|name|shorten|split)\b", re.IGNORECASE)


def _dump(data: Any, path: Path) -> None:
    """JSON is YAML, one key per line (line numbers still point at the field), and ten times faster to write."""
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")


def _prepare(base: str, data: dict[str, Any], case: Case, tmp: Path) -> Path:
    """Write the mutated file (for roles: into a minimal repository copy); returns its path."""
    mutated = case.apply(data)
    if case.kind == "cluster":
        path = tmp / "clusters" / f"{base}.yaml"
    elif case.kind == "job":
        path = tmp / f"{base}.yaml"
    else:
        shutil.copytree(REPO / "vault_policies", tmp / "vault_policies", ignore=shutil.ignore_patterns("*.py", "__pycache__"))
        shutil.copytree(REPO / "clusters", tmp / "clusters", ignore=shutil.ignore_patterns("*.py", "*.json", "__pycache__"))
        path = tmp / "vault_policies" / "roles.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    _dump(mutated, path)
    return path


def _run(case: Case, path: Path, tmp: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    from gpufleet.cli import main

    if case.kind == "cluster":
        code = main(["clusters", "--clusters-dir", str(path.parent)])
    elif case.kind == "job":
        code = main(["jobs", "render", str(path), "--out-dir", str(tmp / "out")])
    else:
        return _run_role(tmp, capsys)
    captured = capsys.readouterr()
    return code, [line for line in captured.err.splitlines() if line.strip()]


def _run_role(tmp: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    """Roles reach users through `gpufleet check`'s inputs step (vault_policies.validate.check; the CLI exits 2
    on any of its problems); run exactly that on a copy of vault_policies/."""
    from vault_policies.validate import check

    problems = check(tmp)
    capsys.readouterr()
    return (2 if problems else 0), [f"error: {p}" for p in problems]


@pytest.fixture(scope="module", autouse=True)
def _unchanged_files_loaded_once() -> Iterator[None]:
    """A job case changes only the job file: the example clusters and Vault files are parsed once, not per case
    (`jobs render` would re-read them every time; YAML parsing is most of a case's cost)."""
    import clusters
    import jobs.loader
    from jobs.vault_refs import load_vault_view

    configs, view = clusters.load_all(REPO / "clusters"), load_vault_view(REPO / "vault_policies" / "roles.yaml", REPO / "vault_policies" / "policies")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(jobs.loader.clusters, "load_all", lambda directory=None: configs if directory is None else clusters.loader.load_all(directory))
        patch.setattr(jobs.loader, "load_vault_view", lambda *a, **k: view)
        yield


@pytest.mark.parametrize(("base", "data", "case"), CASES, ids=[c.id for _, _, c in CASES])
def test_generated_case(base: str, data: dict[str, Any], case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _prepare(base, data, case, tmp_path)
    before = tree_hash(tmp_path)
    code, lines = _run(case, path, tmp_path, capsys)
    RESULTS.append((case.kind, case.klass, "rejected" if code == 2 else "accepted" if code == 0 else f"exit {code}"))
    assert tree_hash(tmp_path) == before, "files outside gpufleet's output dir changed"
    assert code in (0, 2), (code, lines)
    if case.must_reject:
        assert code == 2, f"{case.id}: {case.value!r} was accepted (silent acceptance)"
    if code == 2:
        assert lines, "rejected without a message"
        for line in lines:
            assert not RAW.search(line), f"raw regex/pydantic text: {line}"
        named = [line for line in lines if f"{path}:" in line]
        assert named, f"no line names the file {path}: {lines}"
        fields = [m.group(1) for line in named if (m := re.match(rf"error: {re.escape(str(path))}(?::\d+)?: ([^:]+):", line))]
        if case.must_reject:  # an optional value may instead break a field that depends on it; that one is named
            assert any(case.field.startswith(f) or f.startswith(case.field) for f in fields), f"{case.field} not named in {lines}"
        assert all(FIX.search(line.split(": ", 2)[-1]) for line in named), f"no fix in words: {named}"
