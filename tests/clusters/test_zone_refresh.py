"""tools/refresh_gcp_zones.py turns gcloud's JSON into the table the checks read."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

from clusters import gcp_zones

REPO = Path(__file__).resolve().parents[2]


def test_refresh_builds_the_table_from_gcloud_json(tmp_path: Path) -> None:
    source = tmp_path / "gcloud"
    source.mkdir()
    zone = "https://www.googleapis.com/compute/v1/projects/p/zones/{}"
    (source / "zones.json").write_text(json.dumps([{"name": "us-central1-a", "status": "UP"}, {"name": "us-central1-b", "status": "UP"},
                                                   {"name": "us-central1-x", "status": "DOWN"}]))
    (source / "machine-types.json").write_text(json.dumps([{"name": "a3-highgpu-8g", "zone": "us-central1-a"},
                                                           {"name": "g2-standard-8", "zone": zone.format("us-central1-b")}]))
    (source / "accelerator-types.json").write_text(json.dumps([{"name": "nvidia-tesla-t4", "zone": zone.format("us-central1-a")}]))
    out = tmp_path / "gcp_zones.json"
    tool = runpy.run_path(str(REPO / "tools" / "refresh_gcp_zones.py"))
    assert tool["main"](["--from", str(source), "--out", str(out)]) == 0
    table = gcp_zones.load.__wrapped__(out)
    assert table.zones == {"us-central1-a": frozenset({"A3", "N1"}), "us-central1-b": frozenset({"G2"})}
    assert "gcloud" in table.source and table.retrieved
