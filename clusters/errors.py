"""One error shape for every reviewed input file (clusters, jobs, Vault roles and policies).

A reviewer reads one line per problem and can fix it without opening the code:
``clusters/prod-h100.yaml:14: gpu_pools[0].gpus_per_node: 4 does not match ...; set ...``.
The CLI prints ``str(problem)`` per line and exits 2; nothing else is written.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """A single user-facing input error; ``message`` carries the bad value, what is allowed and the fix."""

    file: str
    line: int | None
    field: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        field = f" {self.field}:" if self.field else ""
        return f"{where}:{field} {self.message}"


class ConfigError(Exception):
    """Raised with every problem found in one pass, so a reviewer fixes them all at once."""

    def __init__(self, problems: list[Problem] | tuple[Problem, ...], skipped: tuple[str, ...] = ()) -> None:
        self.problems = tuple(problems)
        # Checks not run because their input is among the problems (one root cause, one error line).
        self.skipped = skipped
        super().__init__("\n".join(str(p) for p in self.problems))


class UserError(Exception):
    """A bad CLI argument or environment (unknown stack, missing file): one line, exit 2."""
