"""Stages of long commands: plain ``stage:`` lines in a pipe (CI logs), a spinner on a terminal."""

from __future__ import annotations

import io

from rich.console import Console

from gpufleet.progress import Stages
from tests.gpufleet.test_cli_fleet import run


def test_synth_prints_its_stages_as_plain_lines_in_a_pipe(tmp_path):
    result = run("synth", "prod-nomad", "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "stage: loading cluster files" and lines[1].startswith("stage: synthesizing")
    assert lines[-1].startswith("synthesized 1 stack(s)") and "\x1b" not in result.stdout


def test_a_terminal_gets_a_spinner_not_stage_lines():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=80)
    with Stages(console) as stages:
        stages.step("synth")
        stages.step("checkov")
    assert "stage:" not in out.getvalue()
    quiet = io.StringIO()
    with Stages(Console(file=quiet, force_terminal=False), terminal_only=True) as stages:
        stages.step("waiting")
    assert quiet.getvalue() == ""


def test_a_command_started_with_its_stdout_closed_runs_instead_of_crashing_at_import() -> None:
    """``gpufleet ... >&-``: Python gives such a process ``sys.stdout = None``; the consoles built at import asked
    it ``isatty()`` and every command ended with an AttributeError traceback before it started."""
    import subprocess
    import sys
    from pathlib import Path

    gpufleet = str(Path(sys.executable).with_name("gpufleet"))
    done = subprocess.run([gpufleet, "--help"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=60,
                          preexec_fn=lambda: __import__("os").close(1))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
