"""``--json`` on every listing command (issue 27): each command that lists things has it, and the
ones added for it print what the table shows, as JSON a script can read."""

from __future__ import annotations

import json

import typer

from gpufleet.cli import app, main
from tests.conftest import FLEET_CLUSTERS

# The commands that list things (a table of rows). A new listing command goes here, with --json.
LISTINGS = (("clusters",), ("stacks",), ("api", "token", "list"), ("exp", "list"), ("exp", "events"), ("exp", "costs"))


def _command(path: tuple[str, ...]):  # type: ignore[no-untyped-def]
    command = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]
    return command


def test_every_listing_command_has_json():
    missing = [" ".join(path) for path in LISTINGS if not any("--json" in p.opts for p in _command(path).params)]
    assert missing == [], f"listing commands without --json: {missing}"


def test_clusters_json_lists_pools_tenants_and_gpu_ranges(capsys):
    assert main(["clusters", "--json", "--clusters-dir", str(FLEET_CLUSTERS)]) == 0
    rows = {row["cluster"]: row for row in json.loads(capsys.readouterr().out)}
    assert sorted(rows) == ["dev-gke", "prod-gke", "prod-nomad", "train-a3mega"]
    gke = rows["prod-gke"]
    assert (gke["scheduler"], gke["gpus_min"], gke["gpus_max"]) == ("gke", 32, 48)  # as the table shows: 32/48
    assert any(p["machine_type"] == "a3-highgpu-8g" and p["gpus_per_node"] == 8 for p in gke["pools"])
    assert {"name": "finetune", "gpu_quota": {"a100": 8, "l4": 6}} in rows["prod-nomad"]["tenants"]


def test_token_list_json_never_holds_the_token(tmp_path, capsys):
    sqlite_url = f"sqlite:///{tmp_path}/tokens.db"
    assert main(["api", "token", "create", "--tenant", "finetune", "--name", "ci", "--db", sqlite_url, "--quiet"]) == 0
    token = capsys.readouterr().out.strip()
    assert main(["api", "token", "list", "--json", "--db", sqlite_url]) == 0
    out = capsys.readouterr().out
    (row,) = json.loads(out)
    assert (row["tenant"], row["name"], row["admin"], row["revoked_at"]) == ("finetune", "ci", False, None)
    assert token not in out
