"""Finding the command-line tools gpufleet's packages install (checkov, bao) the same way everywhere.

Lives beside the error types because every layer that shells out needs it and all of them
already depend on ``clusters``; standard library only.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from clusters.errors import UserError


def installed_tool(name: str, install_hint: str) -> str:
    """``name`` beside this interpreter (the project venv), else on PATH; a UserError with the fix otherwise."""
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise UserError(f"{name} not found beside {sys.executable} or on PATH; {install_hint}")
    return found
