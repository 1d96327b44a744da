"""Which stage a long command is in: a rich spinner on a terminal, one plain ``stage: <what>`` line
per stage elsewhere (CI logs keep every stage, in order, without control characters)."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.status import Status


class Stages:
    """``with Stages(console) as stages: stages.step("synthesizing 6 stacks"); ...``"""

    def __init__(self, console: Console, *, terminal_only: bool = False) -> None:
        """``terminal_only``: the command prints its own line per stage already (exp watch)."""
        self._console = console
        self._terminal_only = terminal_only
        self._status: Status | None = None

    def step(self, what: str) -> None:
        if not self._console.is_terminal:
            if not self._terminal_only:
                self._console.print(f"stage: {what}", highlight=False, markup=False)
            return
        if self._status is None:
            self._status = self._console.status(what)
            self._status.start()
        else:
            self._status.update(what)

    def __enter__(self) -> Stages:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None
