"""The generated reference pages (docs/reference/) match the code (issue 27): regenerated into a temp
dir by tools/gen_reference.py and compared byte for byte, so a schema, CLI, API or exit-code change
without `make docs` fails here with the page and the first differing line."""

from __future__ import annotations

import difflib
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO_ROOT

CHECKED_IN = REPO_ROOT / "docs" / "reference"


def _generate(out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO_ROOT / "tools" / "gen_reference.py"), "--out", str(out)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)


def test_reference_pages_are_up_to_date(tmp_path: Path) -> None:
    done = _generate(tmp_path)
    assert done.returncode == 0, done.stderr
    fresh = sorted(p.name for p in tmp_path.glob("*.md"))
    assert fresh == ["cli.md", "cluster-file.md", "exit-codes.md", "http-api.md", "job-file.md"]
    assert sorted(p.name for p in CHECKED_IN.glob("*.md")) == fresh, "docs/reference/ holds a page the generator does not write; run `make docs`"
    stale = []
    for name in fresh:
        new, old = (tmp_path / name).read_text(), (CHECKED_IN / name).read_text()
        if new != old:
            hunk = list(difflib.unified_diff(old.splitlines(), new.splitlines(), n=0, lineterm=""))[2:5]
            stale.append(f"docs/reference/{name} is stale ({' '.join(hunk)[:200]}); run `make docs` to update")
    assert stale == [], "\n".join(stale)


def test_generated_pages_name_what_the_code_has() -> None:
    """Spot checks that the pages are read from the code, not written by hand: a field, a command, an
    endpoint and an exit code each page must carry."""
    assert "| `secrets` | object (Secrets) \\| null | unset |" in (CHECKED_IN / "job-file.md").read_text()
    assert "| `gpudirect_cidr` |" in (CHECKED_IN / "cluster-file.md").read_text()
    cli = (CHECKED_IN / "cli.md").read_text()
    assert "## `gpufleet jobs cancel`" in cli and "## `gpufleet jobs stop`" not in cli, "the hidden deprecated alias stays out of the docs"
    assert "## `GET /api/v1/experiments/{experiment_id}/logs`" in (CHECKED_IN / "http-api.md").read_text()
    assert "| 79 | `EXIT_INTERCEPTED` |" in (CHECKED_IN / "exit-codes.md").read_text()


def test_placeholders_outside_code_survive_githubs_html_filter() -> None:
    """``jobs/<job>.yaml`` in a table cell is an unknown HTML tag to GitHub's renderer, which drops it
    (the reader sees ``jobs/.yaml``): the generator writes ``&lt;job>`` outside code, never inside."""
    sys.path.insert(0, str(REPO_ROOT / "tools"))
    try:
        from gen_reference import escape_placeholders
    finally:
        sys.path.remove(str(REPO_ROOT / "tools"))
    page = "<!-- header -->\n| Job name (jobs/<job>.yaml) | `gpufleet exp show <id>` | ``diag -r <level>`` |\n```sh\nplan <stack>\n```\n"
    assert escape_placeholders(page) == ("<!-- header -->\n| Job name (jobs/&lt;job>.yaml) | `gpufleet exp show <id>` | ``diag -r <level>`` |\n"
                                         "```sh\nplan <stack>\n```\n")
    assert "Job name (jobs/&lt;job>.yaml)" in (CHECKED_IN / "cli.md").read_text()
