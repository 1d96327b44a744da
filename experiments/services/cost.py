"""Cost: GPU-hours from the experiment's state timestamps x its GPUs, priced from prices.yaml
(per region where it has the region's price, else its reviewed default row).

A run holds its GPUs from the moment it is placed (provisioning: the node is up and the
allocation pulls its image) until it ends; before that nothing bills for it. The price kind
follows the pool: spot pools pay Spot, pools on a reservation pay the commitment, others list.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from clusters.derive.pools import GpuPoolSpec
from clusters.errors import UserError

PRICES = Path(__file__).resolve().parent.parent / "prices.yaml"


@dataclass(frozen=True)
class PriceTable:
    source: str
    date: str
    currency: str
    # accelerator -> ("default" or a region) -> kind -> USD per GPU-hour
    per_gpu_hour: tuple[tuple[str, tuple[tuple[str, tuple[tuple[str, float], ...]], ...]], ...]

    def price(self, accelerator: str, kind: str, region: str | None = None) -> float:
        """The region's price of that kind where prices.yaml has one, else the reviewed default."""
        table = dict(self.per_gpu_hour)
        if accelerator not in table:
            raise KeyError(f"no price for accelerator {accelerator!r} in {PRICES.name}; add it with its source")
        rows = {name: dict(kinds) for name, kinds in table[accelerator]}
        return rows.get(region or "", {}).get(kind, rows["default"][kind])


@lru_cache(maxsize=1)
def load_prices(path: Path = PRICES) -> PriceTable:
    data = YAML(typ="safe").load(path.read_text())
    rows = tuple(sorted(
        (name, tuple(sorted((where, tuple(sorted((k, float(v)) for k, v in kinds.items()))) for where, kinds in by_region.items())))
        for name, by_region in data["prices"].items()))
    return PriceTable(str(data["source"]), str(data["date"]), str(data["currency"]), rows)


def prices_at_start() -> PriceTable:
    """``load_prices`` when the service starts (it is read once there, not by the first submits): a
    missing or broken file stops the start with one line, the user error every bad input gets, not a
    traceback (before, each submit was a 500 while it was broken)."""
    try:
        return load_prices()
    except (OSError, YAMLError, KeyError, TypeError, ValueError, AttributeError) as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"experiments/{PRICES.name}" + (f" line {mark.line + 1}" if mark is not None else "")
        problem = exc.strerror if isinstance(exc, OSError) and exc.strerror else (str(exc).strip().splitlines() or [""])[0]
        raise UserError(f"{where}: not a price table ({type(exc).__name__}: {problem}); fix: restore it with git,"
                        " or regenerate it with tools/refresh_gpu_prices.py (source, date, currency, prices)") from None


def price_kind(pool: GpuPoolSpec) -> str:
    if pool.spot:
        return "spot"
    return "reservation" if pool.reservation else "list"


def gpu_hours(*, gpus: int, placed_at: datetime | None, finished_at: datetime | None, now: datetime) -> float:
    if placed_at is None:
        return 0.0
    end = finished_at or now
    return max(0.0, (end - placed_at).total_seconds()) / 3600 * gpus
