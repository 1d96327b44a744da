"""Regenerate clusters/gcp_zones.json from the Compute Engine API (run by hand when Google adds zones or GPUs).

    python tools/refresh_gcp_zones.py                 # runs gcloud (needs credentials and a project)
    python tools/refresh_gcp_zones.py --from DIR      # reads DIR/zones.json, machine-types.json, accelerator-types.json

The three files are the ``--format=json`` output of:

    gcloud compute zones list
    gcloud compute machine-types list --filter="name~'^(a2|a3|a4|g2)-'"
    gcloud compute accelerator-types list --filter="name=nvidia-tesla-t4"

Each zone gets the GPU machine series it offers (A2, A3, A4, G2, and N1 when it offers T4s to
attach). Review the diff like any other change: a zone that disappears fails cluster files using it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path

TABLE = Path(__file__).resolve().parents[1] / "clusters" / "gcp_zones.json"
COMMANDS = {
    "zones.json": ["gcloud", "compute", "zones", "list", "--format=json"],
    "machine-types.json": ["gcloud", "compute", "machine-types", "list", "--filter=name~'^(a2|a3|a4|g2)-'", "--format=json"],
    "accelerator-types.json": ["gcloud", "compute", "accelerator-types", "list", "--filter=name=nvidia-tesla-t4", "--format=json"],
}
SERIES_MEANING = {
    "A2": "a2-highgpu-*, a2-megagpu-*, a2-ultragpu-* (NVIDIA A100)",
    "A3": "a3-highgpu-*, a3-megagpu-*, a3-ultragpu-* (NVIDIA H100/H200)",
    "A4": "a4-highgpu-* (NVIDIA B200)",
    "G2": "g2-standard-* (NVIDIA L4)",
    "N1": "n1-* with NVIDIA T4s attachable in the zone",
}


def _short_zone(value: str) -> str:
    return value.rsplit("/", 1)[-1]


def build(zones: list[dict], machine_types: list[dict], accelerators: list[dict], *, today: str) -> dict:
    table: dict[str, set[str]] = {_short_zone(z["name"]): set() for z in zones if z.get("status", "UP") == "UP"}
    for machine in machine_types:
        zone = _short_zone(machine["zone"])
        if zone in table:
            table[zone].add(machine["name"].split("-", 1)[0].upper())
    for accelerator in accelerators:
        zone = _short_zone(accelerator["zone"])
        if zone in table:
            table[zone].add("N1")
    return {
        "source": "Compute Engine API via gcloud: zones list, machine-types list (a2/a3/a4/g2), accelerator-types list (nvidia-tesla-t4)",
        "retrieved": today,
        "retrieved_from": "tools/refresh_gcp_zones.py",
        "series_meaning": SERIES_MEANING,
        "zones": {zone: sorted(series) for zone, series in sorted(table.items())},
    }


def _read(source: Path | None, name: str) -> list[dict]:
    if source is not None:
        return json.loads((source / name).read_text(encoding="utf-8"))
    done = subprocess.run(COMMANDS[name], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"error: {' '.join(COMMANDS[name])} failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}")
    return json.loads(done.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="source", type=Path, help="directory with zones.json, machine-types.json, accelerator-types.json")
    parser.add_argument("--out", type=Path, default=TABLE, help="where to write the table (default: clusters/gcp_zones.json)")
    args = parser.parse_args(argv)
    data = build(*(_read(args.source, name) for name in COMMANDS), today=datetime.date.today().isoformat())
    if not data["zones"]:
        sys.exit("error: no zones in the input; nothing written")
    tmp = args.out.with_name(f".{args.out.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    tmp.replace(args.out)
    print(f"wrote {len(data['zones'])} zones to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
