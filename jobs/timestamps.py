"""The schedulers' own clocks, read as naive UTC (the control plane's time convention).

Cost needs them when the reconciler missed a state: a run that went from queued straight to
an end was never seen placed, and only the scheduler knows when it held its GPUs.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

# Go marshals time.Time as RFC 3339 with up to nine fractional digits; Python reads six.
_FRACTION = re.compile(r"(\.\d{6})\d+")
# Go's zero time.Time (a task that never started or never finished).
_GO_ZERO_YEAR = 1


def rfc3339(text: object) -> datetime | None:
    """``2026-12-03T08:01:02.123456789Z`` (Go) or ``2026-12-03T08:01:02Z`` (Kubernetes metav1.Time) ->
    naive UTC; None for a missing, unparsable or zero time."""
    if not isinstance(text, str) or not text:
        return None
    try:
        parsed = datetime.fromisoformat(_FRACTION.sub(r"\1", text).replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.year <= _GO_ZERO_YEAR:
        return None
    return (parsed.astimezone(UTC) if parsed.tzinfo else parsed).replace(tzinfo=None)


def unix_nanos(value: object) -> datetime | None:
    """Nomad's ``CreateTime``/``ModifyTime`` (int64 Unix nanoseconds) -> naive UTC; None for 0 or missing."""
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        return None
    return datetime.fromtimestamp(value / 1e9, UTC).replace(tzinfo=None)
