"""Durations as people write them ("30s", "1h30m") and as Nomad's API wants them (integer ns).

Nomad's JSON takes every duration as integer nanoseconds; a bare 30 there means 30 ns, so
job files never hold raw numbers for durations: an int is read as seconds, a string needs units.
"""

from __future__ import annotations

import re

NS_PER_SECOND = 1_000_000_000
_UNITS = {"ms": 1_000_000, "s": NS_PER_SECOND, "m": 60 * NS_PER_SECOND, "h": 3600 * NS_PER_SECOND}
_DURATION = re.compile(r"^(?:\d+(?:ms|h|m|s))+$")
_PART = re.compile(r"(\d+)(ms|h|m|s)")


def parse_duration_ns(value: object) -> int:
    """Nanoseconds from seconds (int) or a Go-style duration string ("90s", "30m", "1h30m")."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"{value!r} is not a duration; write seconds (30) or a string with units like '30s', '5m', '24h'")
    if isinstance(value, int):
        ns = value * NS_PER_SECOND
    else:
        text = value.strip()
        if not _DURATION.match(text):
            raise ValueError(f"{value!r} is not a duration; write seconds (30) or a string with units like '30s', '5m', '24h'")
        ns = sum(int(n) * _UNITS[unit] for n, unit in _PART.findall(text))
    if ns <= 0:
        raise ValueError(f"{value!r} must be a positive duration; write e.g. '30s'")
    return ns
