"""The one place command modules get their rich consoles.

On a terminal rich fits tables to the window. In a pipe or a CI log it assumes 80 columns and folds
names mid-word (``train-a3mega-schedul`` / ``er``), so there the console is given room to print every
row in full: a log line can be as long as it needs, a cut name cannot be searched for.
"""

from __future__ import annotations

import os
import sys

from rich.console import Console

NON_TTY_WIDTH = 10_000


def make_console(*, stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    # None: the process was started with that descriptor closed (``gpufleet ... >&-``); it is no terminal
    width = None if (stream is not None and stream.isatty()) or os.environ.get("COLUMNS") else NON_TTY_WIDTH
    return Console(stderr=stderr, soft_wrap=True, width=width)
