"""Regenerate experiments/prices.yaml's per-region GPU prices from SkyPilot's GCP catalog (run by hand).

    curl -fsSLo /tmp/gcp-vms.csv https://raw.githubusercontent.com/skypilot-org/skypilot-catalog/<commit>/catalogs/v8/gcp/vms.csv
    python tools/refresh_gpu_prices.py --from /tmp/gcp-vms.csv --commit <commit>

The catalog (github.com/skypilot-org/skypilot-catalog, ``catalogs/v8/gcp/vms.csv``; columns
InstanceType, vCPUs, MemoryGiB, AcceleratorName, AcceleratorCount, GpuInfo, Region,
AvailabilityZone, Price, SpotPrice) lists each GPU on its own row (no InstanceType) with the
on-demand and Spot USD/hour of ``AcceleratorCount`` GPUs: the GPU SKU only, like this table.
SkyPilot regenerates it from the Cloud Billing catalog; this script keeps, per accelerator and
per region of clusters/*.yaml, the per-GPU list and Spot prices, and refuses a value a human
must look at instead:

- Spot missing, or not below list (the catalog has rows with Spot above on-demand);
- a list or Spot price more than 35% away from the reviewed ``default`` row of the same
  accelerator (the catalog mixes SKUs in places, e.g. H100 in us-central1 at 43% of us-east4).

A refused value is left out, so cost falls back to the reviewed ``default`` row; every refusal is
written to the file's ``refused`` list and printed. ``reservation`` (commitment) prices are not in
the catalog: they stay in the ``default`` rows, maintained by hand. Review the diff like code.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TABLE = ROOT / "experiments" / "prices.yaml"
CATALOG = "skypilot-org/skypilot-catalog"
CATALOG_PATH = "catalogs/v8/gcp/vms.csv"
# SkyPilot's accelerator names -> Compute Engine accelerator types (what GPU pools name).
ACCELERATORS = {
    "T4": "nvidia-tesla-t4",
    "L4": "nvidia-l4",
    "A100": "nvidia-tesla-a100",
    "A100-80GB": "nvidia-a100-80gb",
    "H100": "nvidia-h100-80gb",
    "H100-MEGA": "nvidia-h100-mega-80gb",
    "H200": "nvidia-h200-141gb",
    "B200": "nvidia-b200",
}
MAX_DRIFT = 0.35


def per_gpu(rows: Iterable[Mapping[str, str]], regions: set[str]) -> dict[str, dict[str, dict[str, float | None]]]:
    """accelerator type -> region -> {list, spot} per GPU-hour (lowest over the region's zones)."""
    out: dict[str, dict[str, dict[str, float | None]]] = {}
    for row in rows:
        name, region = row.get("AcceleratorName") or "", row.get("Region") or ""
        if row.get("InstanceType") or name not in ACCELERATORS or region not in regions:
            continue
        count = float(row.get("AcceleratorCount") or 0)
        if count <= 0 or not row.get("Price"):
            continue
        listed = float(row["Price"]) / count
        spot = float(row["SpotPrice"]) / count if row.get("SpotPrice") else None
        cell = out.setdefault(ACCELERATORS[name], {}).setdefault(region, {"list": listed, "spot": spot})
        cell["list"] = min(cell["list"] or listed, listed)
        if spot is not None:
            cell["spot"] = spot if cell["spot"] is None else min(cell["spot"], spot)
    return out


def build(current: Mapping[str, object], rows: Iterable[Mapping[str, str]], regions: set[str], *, commit: str, today: str) -> dict[str, object]:
    """The new table: ``current``'s reviewed default rows, plus the catalog's accepted per-region prices."""
    prices: dict[str, dict[str, object]] = {}
    refused: list[str] = []
    found = per_gpu(rows, regions)
    for accelerator, by_region in sorted(dict(current["prices"]).items()):  # type: ignore[call-overload]
        default = dict(by_region["default"])
        entry: dict[str, object] = {"default": default}
        for region, cell in sorted(found.get(accelerator, {}).items()):
            accepted: dict[str, float] = {}
            for kind in ("list", "spot"):
                value = cell[kind]
                where = f"{accelerator} {region} {kind}"
                if value is None:
                    refused.append(f"{where}: not in the catalog")
                elif kind == "spot" and cell["list"] is not None and value >= cell["list"]:
                    refused.append(f"{where} {value:.5f}: not below list {cell['list']:.5f}")
                elif abs(value - float(default[kind])) > MAX_DRIFT * float(default[kind]):
                    refused.append(f"{where} {value:.5f}: more than {MAX_DRIFT:.0%} from the reviewed default {default[kind]}")
                else:
                    accepted[kind] = round(value, 5)
            if accepted:
                entry[region] = accepted
        prices[accelerator] = entry
    return {
        "source": f"{CATALOG} {CATALOG_PATH} at {commit[:12]} (region rows); cloud.google.com/compute/gpus-pricing us-central1 (default rows, by hand)",
        "catalog": {"repo": CATALOG, "path": CATALOG_PATH, "commit": commit},
        "date": today,
        "currency": "USD",
        "regions": sorted(regions),
        "prices": prices,
        "refused": refused,
    }


def cluster_regions() -> set[str]:
    import clusters

    return {config.gcp.region for config in clusters.load_all()}


HEADER = """\
# GPU prices per GPU-hour in USD, by Compute Engine accelerator type, for cost estimates.
# Written by tools/refresh_gpu_prices.py from SkyPilot's machine-readable GCP catalog (see
# `catalog`: repo, path, commit); re-run it, do not edit the region rows by hand.
# Per accelerator: `default` is the reviewed table (us-central1, the Compute Engine "GPU pricing"
#   page, transcribed by hand; `reservation` = 1-year resource-based commitment, which no
#   machine-readable source here has) and the fallback for any region or kind not listed;
#   a region row holds the catalog's per-GPU `list` (on-demand) and `spot` prices for that region.
# `refused`: catalog values the script would not take (Spot not below list, or more than 35% from
#   the reviewed default: the catalog mixes SKUs in places); those fall back to `default`.
# Only the GPU SKU is priced; the VM's vCPU, memory and disks are not, so these are lower bounds.
"""


def main() -> None:
    from ruamel.yaml import YAML

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="source", type=Path, required=True, help="a copy of the catalog's catalogs/v8/gcp/vms.csv")
    parser.add_argument("--commit", required=True, help="the skypilot-catalog commit the copy was taken from (recorded in the file)")
    args = parser.parse_args()
    yaml = YAML(typ="safe")
    current = yaml.load(TABLE.read_text())
    with args.source.open(newline="") as handle:
        table = build(current, csv.DictReader(handle), cluster_regions(), commit=args.commit, today=datetime.date.today().isoformat())
    out = YAML()
    out.default_flow_style = None
    out.width = 200
    refused = table.pop("refused")
    with TABLE.open("w") as handle:
        handle.write(HEADER)
        out.dump(table, handle)
        handle.write("refused:\n" + "".join(f"  - {json.dumps(line)}\n" for line in refused) if refused else "refused: []\n")  # type: ignore[union-attr]
    table["refused"] = refused
    for line in table["refused"]:  # type: ignore[union-attr]
        print(f"refused: {line}")
    print(f"wrote {TABLE.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
