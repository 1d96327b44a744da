"""docs/tutorial.md cannot drift from the code (issue 27).

Two checks. Every ``gpufleet`` command the README and the docs show (in shell blocks and inline
code) names commands and options the CLI has, read from the typer command tree. And the blocks the
tutorial marks ``<!-- runs here -->`` run, in order, as one bash script in a copy of the repository
(the suite's example fleet as its clusters/): a real OpenBao dev server (``gpufleet dev up``), the
control plane with its local scheduler, a submitted run followed to ``succeeded``, its logs and its
cost. Only the tutorial's port 8787 is swapped for a free one, so this runs beside ``make demo``.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import typer

from gpufleet.cli import app
from tests.conftest import FLEET_CLUSTERS, REPO_ROOT, copy_checkout
from tests.openbao_fixture import FAKE_KEYS

DOCS = REPO_ROOT / "docs"
TUTORIAL = DOCS / "tutorial.md"
MARK = "<!-- runs here -->"
BLOCK = re.compile(r"(?P<mark><!-- runs here -->\n)?```sh\n(?P<body>.*?)```", re.S)
INLINE = re.compile(r"`(gpufleet [^`]+)`")
# Where one command of a shell line ends.
SEPARATORS = re.compile(r"\)|\||;|&&|>|#")


def _pages() -> list[Path]:
    """The README and every hand-written page (the generated reference is checked by its own test)."""
    return [REPO_ROOT / "README.md", *sorted(p for p in DOCS.rglob("*.md") if "reference" not in p.parts)]


def _invocations(text: str) -> list[str]:
    """The argument words after each ``gpufleet`` of the page's shell blocks and inline code."""
    found = []
    lines = [line for m in BLOCK.finditer(text) for line in m.group("body").replace("\\\n", " ").splitlines()]
    lines += INLINE.findall(text)
    for line in lines:
        line = re.sub(r"(^|\s)#.*", "", line)  # a shell comment is prose
        for match in re.finditer(r"(?:^|(?<=[\s(]))gpufleet (.*)", line):
            found.append(SEPARATORS.split(match.group(1))[0].strip())
    return found


def _check(words: list[str], command: Any, where: str) -> list[str]:
    """Problems of one invocation: an unknown subcommand or an option its command lacks."""
    problems = []
    path = ["gpufleet"]
    rest = list(words)
    while rest and hasattr(command, "commands") and not rest[0].startswith(("-", "<", "$", "...")):  # options, placeholders
        word = rest.pop(0).strip("[]")
        alternatives = re.split(r"[|/]", word)  # `exp list|show`, `jobs dispatch/status/cancel`: each must exist
        shown = sorted(name for name, sub in command.commands.items() if not sub.hidden)
        if any(w not in shown for w in alternatives):
            return [f"{where}: `{' '.join(path)} {word}`: no such command; allowed: {', '.join(shown)}"]
        for other in alternatives[1:]:
            problems += _check(rest, command.commands[other], where)
        path.append(alternatives[0])
        command = command.commands[alternatives[0]]
    options = {opt for p in command.params for opt in [*getattr(p, "opts", []), *getattr(p, "secondary_opts", [])]} | {"--help"}
    for word in rest:
        for option in re.findall(r"(?:^|\[)(--?[a-z][a-z-]*)", word):
            if option not in options:
                problems.append(f"{where}: `{' '.join(path)}` has no option {option}; it has {', '.join(sorted(options))}")
    return problems


def test_every_gpufleet_command_in_the_tutorial_and_howtos_exists():
    root = typer.main.get_command(app)
    problems, seen = [], 0
    for page in _pages():
        for invocation in _invocations(page.read_text()):
            seen += 1
            problems += _check(invocation.split(), root, str(page.relative_to(REPO_ROOT)))
    assert seen > 30, "the command scan found almost nothing: the page format changed"
    assert problems == [], "\n".join(problems)


def test_the_command_check_catches_a_wrong_command_and_option():
    root = typer.main.get_command(app)
    assert _check("jobs stop x".split(), root, "t")[0].startswith("t: `gpufleet jobs stop`: no such command")
    assert _check("exp logs x --tial 5".split(), root, "t") == [_check(["exp", "logs", "--tial"], root, "t")[0]]
    assert _check("exp list|show --json".split(), root, "t") == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_tutorials_runnable_blocks_run(tmp_path: Path):
    text = TUTORIAL.read_text()
    blocks = [m.group("body") for m in BLOCK.finditer(text) if m.group("mark")]
    assert len(blocks) >= 5 and text.count(MARK) == len(blocks), "every runs-here mark must sit right above a ```sh block"
    part1 = text[text.index("## Part 1"):text.index("## Part 2")]
    assert part1.count("```sh") == part1.count(MARK), "the page says every block of part 1 runs here"
    repo = copy_checkout(tmp_path / "gpufleet")
    shutil.rmtree(repo / "clusters")
    shutil.copytree(FLEET_CLUSTERS, repo / "clusters")
    for stale in (".gpufleet", "jobs/out", "cdktf.out"):
        shutil.rmtree(repo / stale, ignore_errors=True)
    port = str(_free_port())
    script = "\n".join(["set -euo pipefail", "trap 'kill $(jobs -p) 2>/dev/null || true; gpufleet dev down 2>/dev/null || true' EXIT",
                        *(b.replace("8787", port) for b in blocks)])
    bin_dir = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VAULT_", "NOMAD_", "GPUFLEET_", "KUBECONFIG"))}
    env.update({"PATH": f"{bin_dir}:{env.get('PATH', '')}", "COLUMNS": "200"})
    done = subprocess.run(["bash", "-c", script], cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    serve_log = (repo / ".gpufleet" / "tutorial-serve.log")
    assert done.returncode == 0, output + (serve_log.read_text()[-3000:] if serve_log.exists() else "")
    assert "succeeded" in done.stdout and "step  300 loss" in done.stdout, "the run's own lines, from gpufleet exp logs"
    assert "GPU-hours" in done.stdout and "cost by tenant/job" in done.stdout and "finetune/finetune-llama" in done.stdout
    assert "stopped OpenBao dev server" in done.stderr
    for data in FAKE_KEYS.values():
        for value in data.values():
            assert value not in output, "a key from Vault reached the tutorial's output"
