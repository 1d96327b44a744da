"""The vendored ForceNew tables: which attribute changes make a provider replace a resource.

Tables live in ``forcenew/<provider>.json``, written by ``python -m preview.regen``
from the provider's Go source at the tag gpufleet pins (provenance in each file's ``_meta``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

TABLE_DIR = Path(__file__).resolve().parent / "forcenew"


@dataclass(frozen=True)
class Rule:
    path: str
    kind: str
    """``attribute``: any change forces replacement; ``block``: adding or removing blocks does."""
    optional_computed: bool
    source: str


@dataclass(frozen=True)
class Table:
    provider: str
    version: str
    rules: dict[str, dict[str, Rule]]
    """resource type -> dotted path (list indexes dropped) -> rule."""

    def covers(self, rtype: str) -> bool:
        return rtype in self.rules


@dataclass(frozen=True)
class Tables:
    by_provider: dict[str, Table]

    def rules(self, rtype: str) -> dict[str, Rule] | None:
        """None when no table covers the type (the preview then says so instead of guessing)."""
        for table in self.by_provider.values():
            if table.covers(rtype):
                return table.rules[rtype]
        return None

    def versions(self) -> dict[str, str]:
        """registry source address (as in required_providers) -> the version the table was read at."""
        return {t.provider: t.version for t in self.by_provider.values()}


def _load(path: Path) -> Table:
    data = json.loads(path.read_text(encoding="utf-8"))
    meta = data["_meta"]
    rules = {
        rtype: {p: Rule(p, e["kind"], bool(e.get("optional_computed")), f"{meta['provider']}@{meta['tag']}:{e['file']}:{e['line']}")
                for p, e in paths.items() if not e.get("computed_only")}
        for rtype, paths in data["resources"].items()
    }
    return Table(provider=meta["registry"], version=meta["version"], rules=rules)


@cache
def load_tables(directory: Path = TABLE_DIR) -> Tables:
    return Tables({path.stem: _load(path) for path in sorted(Path(directory).glob("*.json"))})
