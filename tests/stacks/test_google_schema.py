"""Every attribute of every synthesized google resource exists, at that nesting, in the pinned provider's schema.

The vendored extract (tests/schemas/google-6.50.0.json, with its provenance and regeneration
command) lists each resource type's arguments and nested blocks at hashicorp/google 6.50.0. A
misspelt or misplaced attribute would otherwise surface only at ``terraform plan`` against the
real provider, which CI here cannot download. Enum values and immutability are not in the
extract; the ForceNew table (../shared/data) and the constructs' docstrings cover those.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "schemas" / "google-6.50.0.json").read_text())
META = {"//", "lifecycle", "depends_on", "provider", "count", "for_each", "provisioner", "connection"}


def unknown(value: object, tree: dict, path: str) -> list[str]:
    if isinstance(value, list):
        return [u for i, item in enumerate(value) for u in unknown(item, tree, f"{path}[{i}]")]
    if not isinstance(value, dict):
        return [f"{path}: a value where the schema has a block"]
    found = []
    for key, item in value.items():
        if key not in tree:
            found.append(f"{path}.{key}")
        elif isinstance(tree[key], dict):
            found += unknown(item, tree[key], f"{path}.{key}")
    return found


def problems(stack: dict) -> list[str]:
    """Resources under their type, data sources under ``data.<type>`` (regen_google.py DATA_TYPES)."""
    found = []
    blocks = [(rtype, rtype, items) for rtype, items in stack.get("resource", {}).items()]
    blocks += [(f"data.{rtype}", f"data.{rtype}", items) for rtype, items in stack.get("data", {}).items()]
    for key, label, resources in blocks:
        if not key.removeprefix("data.").startswith("google_"):
            continue
        if key not in SCHEMA:
            found.append(f"{key}: not in the vendored schema; add it to tests/schemas/regen_google.py TYPES or DATA_TYPES and regenerate")
            continue
        for name, body in resources.items():
            found += unknown({k: v for k, v in body.items() if k not in META}, SCHEMA[key], f"{label}.{name}")
    return found


def test_extract_names_its_provider_version_and_source():
    meta = SCHEMA["_meta"]
    assert meta["provider_version"] == "6.50.0" and "cdktf-cdktf-provider-google==16.12.1" in meta["source"]
    assert SCHEMA["google_container_cluster"]["control_plane_endpoints_config"]["dns_endpoint_config"] == {
        "allow_external_traffic": None, "endpoint": None}


def test_every_google_resource_of_the_example_fleet_matches_the_schema(fleet_out):
    stacks = sorted((fleet_out / "stacks").glob("*/cdk.tf.json"))
    checked = 0
    for path in stacks:
        stack = json.loads(path.read_text())
        checked += sum(len(v) for k, v in stack.get("resource", {}).items() if k.startswith("google_"))
        assert problems(stack) == [], path.parent.name
    assert checked > 40


@pytest.mark.parametrize(("path", "value", "expected"), [
    (("google_container_cluster", "gke", "control_plane_endpoint_config"), {"dns_endpoint_config": {}},
     "google_container_cluster.gke.control_plane_endpoint_config"),
    (("google_container_node_pool", "pool_h100", "node_config", "local_ssd_config"), {"local_ssd_count": 16},
     "google_container_node_pool.pool_h100.node_config.local_ssd_config"),
    (("google_container_node_pool", "pool_h100", "network_config", "accelerator_network_profile"), "auto",
     "google_container_node_pool.pool_h100.network_config.accelerator_network_profile"),
])
def test_the_walk_catches_misspelt_and_not_yet_released_attributes(stack_json, path, value, expected):
    """accelerator_network_profile exists only after 6.50.0 (review, _changes_at_provider_head): the walk refuses it."""
    stack = json.loads(json.dumps(stack_json("prod-gke")))
    node = stack["resource"]
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    assert expected in problems(stack)


def test_the_walk_covers_data_sources(stack_json):
    stack = json.loads(json.dumps(stack_json("prod-gke")))
    assert problems(stack) == [] and stack["data"]["google_compute_reservation"]
    stack["data"]["google_compute_reservation"]["reservation_h100"]["reservation_block"] = "b1"
    assert problems(stack) == ["data.google_compute_reservation.reservation_h100.reservation_block"]
