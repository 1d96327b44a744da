"""The checked-in table of GCP zones and the GPU machine series each offers (``gcp_zones.json``).

A zone that does not exist (``us-central1-e``), a misspelt region (``us-centra1``) or a machine
series a zone does not offer would only fail at apply time, or worse, in the middle of a scale-up.
The table records its source and date; ``tools/refresh_gcp_zones.py`` regenerates it from the
Compute Engine API when Google adds zones or GPUs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from collections.abc import Mapping
from functools import cache, cached_property
from pathlib import Path
from types import MappingProxyType

TABLE = Path(__file__).resolve().parent / "gcp_zones.json"


@dataclass(frozen=True)
class ZoneTable:
    source: str
    retrieved: str
    zones: dict[str, frozenset[str]]

    @cached_property
    def regions(self) -> Mapping[str, tuple[str, ...]]:
        """Zones by region, sorted; worked out once per table (every pool of every cluster file asks), read-only."""
        out: dict[str, list[str]] = {}
        for zone in sorted(self.zones):
            out.setdefault(region_of(zone), []).append(zone)
        return MappingProxyType({r: tuple(z) for r, z in out.items()})

    def offering(self, region: str, series: str) -> tuple[str, ...]:
        return tuple(z for z in self.regions.get(region, ()) if series in self.zones[z])

    @property
    def cite(self) -> str:
        return f"clusters/gcp_zones.json, {self.retrieved}"


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


@cache
def load(path: Path = TABLE) -> ZoneTable:
    """Part of the package (like the machine table), not a user file: it travels with the code."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return ZoneTable(data["source"], data["retrieved"], {z: frozenset(s) for z, s in data["zones"].items()})
