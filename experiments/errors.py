"""API errors: ``{"error", "field", "fix"}`` with the HTTP status that says who must act."""

from __future__ import annotations


class ApiError(Exception):
    def __init__(self, status: int, error: str, *, field: str | None = None, fix: str) -> None:
        super().__init__(error)
        self.status = status
        self.error = error
        self.field = field
        self.fix = fix

    def body(self) -> dict[str, str | None]:
        return {"error": self.error, "field": self.field, "fix": self.fix}


def split_message(message: str) -> tuple[str, str]:
    """gpufleet messages read 'what is wrong; allowed: ...; the fix': first clause vs the rest."""
    head, sep, rest = message.partition("; ")
    return head, rest if sep else "see the error"
