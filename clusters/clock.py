"""Today's date (UTC), the one clock cluster derivation reads.

Derived maintenance exclusions (clusters.derive.gke.derive_exclusion) and the expiry warnings of
``gpufleet check`` depend on the date. ``GPUFLEET_TODAY=YYYY-MM-DD`` pins it: tests use it as a
controlled clock, and an operator can preview what a later synthesis will renew.
"""

from __future__ import annotations

import os
from datetime import UTC, date, datetime

ENV_TODAY = "GPUFLEET_TODAY"


def today() -> date:
    pinned = os.environ.get(ENV_TODAY)
    if pinned:
        return date.fromisoformat(pinned)
    return datetime.now(UTC).date()
