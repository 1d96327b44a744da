"""experiments/prices.yaml and tools/refresh_gpu_prices.py: per-region prices from SkyPilot's GCP
catalog, refused where the catalog contradicts itself or the reviewed defaults, and a cost lookup
that falls back to the reviewed default row."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from ruamel.yaml import YAML

import clusters
from clusters.derive.pools import derive_gpu_pools
from experiments.services.cost import PRICES, load_prices

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import refresh_gpu_prices as refresh  # noqa: E402
from tests.conftest import load_fleet

CURRENT = {"prices": {"nvidia-h100-80gb": {"default": {"list": 11.06, "spot": 4.42, "reservation": 6.97}},
                      "nvidia-l4": {"default": {"list": 0.56, "spot": 0.22, "reservation": 0.35}}}}


def _row(name: str, count: str, region: str, price: str, spot: str, instance: str = "") -> dict[str, str]:
    return {"InstanceType": instance, "AcceleratorName": name, "AcceleratorCount": count, "Region": region,
            "AvailabilityZone": f"{region}-a", "Price": price, "SpotPrice": spot}


def test_build_takes_per_gpu_prices_and_refuses_what_contradicts() -> None:
    rows = [
        _row("L4", "8", "us-central1", "4.48032", "1.7848"),  # 8 GPUs: 0.56004 / 0.2231 each
        _row("L4", "1", "us-central1", "0.56004", "0.2231"),
        _row("L4", "1", "asia-east1", "0.64847", "0.2311"),  # not a region of clusters/
        _row("H100", "1", "us-central1", "4.20076", "2.9926"),  # list 62% below the reviewed default
        _row("H100", "1", "europe-west4", "12.73552", "13.0"),  # Spot above list
        _row("A100", "1", "us-central1", "2.93391", "1.4341"),  # not in the current table: ignored
        _row("", "", "us-central1", "0.73948", "0.36975", instance="a2-highgpu-1g"),  # a VM row
    ]
    table = refresh.build(CURRENT, rows, {"us-central1", "europe-west4"}, commit="a" * 40, today="2026-12-03")
    assert table["prices"]["nvidia-l4"] == {"default": CURRENT["prices"]["nvidia-l4"]["default"], "us-central1": {"list": 0.56004, "spot": 0.2231}}
    assert table["prices"]["nvidia-h100-80gb"] == {"default": CURRENT["prices"]["nvidia-h100-80gb"]["default"],
                                                   "us-central1": {"spot": 2.9926}, "europe-west4": {"list": 12.73552}}
    assert table["refused"] == ["nvidia-h100-80gb europe-west4 spot 13.00000: not below list 12.73552",
                                "nvidia-h100-80gb us-central1 list 4.20076: more than 35% from the reviewed default 11.06"]
    assert table["catalog"] == {"repo": "skypilot-org/skypilot-catalog", "path": "catalogs/v8/gcp/vms.csv", "commit": "a" * 40}


def test_the_checked_in_table_names_its_source_and_obeys_the_rules() -> None:
    data = YAML(typ="safe").load(PRICES.read_text())
    assert data["catalog"]["repo"] == "skypilot-org/skypilot-catalog" and re.fullmatch(r"[0-9a-f]{40}", data["catalog"]["commit"])
    regions = {c.gcp.region for c in load_fleet()}
    assert set(data["regions"]) == regions
    used = {pool.accelerator for config in load_fleet() for pool in derive_gpu_pools(config)}
    assert used <= set(data["prices"]), used - set(data["prices"])
    for accelerator, rows in data["prices"].items():
        default = rows["default"]
        assert set(default) == {"list", "spot", "reservation"} and default["spot"] < default["list"], accelerator
        for region, cell in rows.items():
            if region == "default":
                continue
            assert region in regions and set(cell) <= {"list", "spot"}, (accelerator, region)
            for kind, value in cell.items():
                assert abs(value - default[kind]) <= refresh.MAX_DRIFT * default[kind], (accelerator, region, kind)
            assert cell.get("spot", 0) < cell.get("list", default["list"]), (accelerator, region)


def test_a_region_price_is_used_where_listed_else_the_reviewed_default() -> None:
    prices = load_prices()
    data = YAML(typ="safe").load(PRICES.read_text())
    l4 = data["prices"]["nvidia-l4"]
    assert prices.price("nvidia-l4", "list", "europe-west4") == l4["europe-west4"]["list"]
    assert prices.price("nvidia-l4", "reservation", "europe-west4") == l4["default"]["reservation"]  # no catalog commitment prices
    assert prices.price("nvidia-l4", "list", "mars-north1") == l4["default"]["list"]
    assert prices.price("nvidia-l4", "list") == l4["default"]["list"]
