"""Every string a cluster file can hold refuses a Terraform interpolation, found by walking the schema.

Cluster strings land in ``cdk.tf.json``, where Terraform evaluates ``${...}``/``%{...}``: a label
value ``${base64encode(file("/proc/self/environ"))}`` would print the plan runner's credentials.
The test does not list fields: it walks the pydantic model (so a field added later is planted
too) and plants the payload into every string leaf (values and map keys) of the example files
plus EXTRAS (the optional sections the examples leave out). A schema leaf that no document holds
fails the coverage test: add it to EXTRAS, and it is planted from then on.
"""

from __future__ import annotations

import copy
import json
import re
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError
from ruamel.yaml import YAML

import clusters
from clusters.checks import cross_check
from clusters.errors import ConfigError
from clusters.schema import ClusterConfig
from clusters.source import format_path
from tests.conftest import FLEET_CLUSTERS

PAYLOADS = ('${base64encode(file("/proc/self/environ"))}', "%{ for k in [1] }x%{ endfor }")
Path_ = tuple[str | int, ...]

# Optional fields the example files leave out, merged into a copy of one example each.
EXTRAS: dict[str, dict[str, Any]] = {
    "prod-nomad": {
        "state": {"backend": "tfc", "organization": "gpufleet", "workspace": "prod-nomad", "project": "gpufleet"},
        "checkpoints": {"retention_days": 14, "bucket": "acme-prod-nomad-ckpt"},
        # existing_servers: no internal load balancer here, so the UI record names the servers' host,
        # and no autoscaler of gpufleet's, so pools have fixed sizes.
        "gpu_pools": [{"name": "a100", "machine_type": "a2-highgpu-2g", "node_count": 6, "boot_disk_gb": 300},
                      {"name": "l4", "machine_type": "g2-standard-8", "node_count": 10, "spot": True}],
        "dns": {"zone_id": "0123456789abcdef0123456789abcdef", "zone_name": "example.com",
                "records": [{"name": "nomad.prod", "hostname": "nomad.corp.example.com"}]},
        "nomad": {"datacenter": "europe-west4", "vault_addr": "https://vault.example.com:8200", "region": "global",
                  "existing_servers": ["10.0.0.2:4647"], "planned_from": {"tfc_agent_pool": "gpufleet-vpc"}, "servers": {"count": 3, "machine_type": "e2-standard-4", "zones": ["europe-west4-a", "europe-west4-b", "europe-west4-c"],
                                                     "fewer_zones_reason": "staging cluster: one zone is enough"},
                  "client_machine_image": "projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accelerator-2204-amd64-with-nvidia-550"},
    },
    "prod-gke": {
        "gpu_pools": [{"name": "h100", "machine_type": "a3-highgpu-8g", "accelerator": "nvidia-h100-80gb", "min_nodes": 0, "max_nodes": 4,
                       "reservation": "h100-reservation-2026", "placement": "COMPACT", "placement_policy_name": "h100-compact", "zones": ["us-central1-a"],
                       "labels": {"workload": "pretrain"}, "taints": [{"key": "dedicated", "value": "pretrain"}]},
                      {"name": "l4-spot", "machine_type": "g2-standard-24", "min_nodes": 0, "max_nodes": 8, "spot": True}],
        "gke": {"release_channel": "REGULAR", "rbac_security_group": "gke-security-groups@example.com", "maintenance_start_time": "09:00",
                "min_master_version": "1.33.5-gke.1080000",
                "system_pool": {"machine_type": "e2-standard-8", "min_nodes": 1, "max_nodes": 3},
                "upgrade_exclusion": {"name": "no-node-upgrades", "start_time": "2026-12-01T00:00:00Z", "end_time": "2027-06-01T00:00:00Z"}},
    },
}


def _strip(annotation: Any) -> Any:
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _is_str(annotation: Any) -> bool:
    return annotation is str


def schema_leaves(annotation: Any, pattern: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Patterns (Model.field / [] / {key} / {value}) of every free string leaf under ``annotation``."""
    annotation = _strip(annotation)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        for name, field in annotation.model_fields.items():
            yield from schema_leaves(field.annotation, (*pattern, f"{annotation.__name__}.{name}"))
    elif origin in (tuple, list):
        yield from schema_leaves(args[0], (*pattern, "[]"))
    elif origin is dict:
        if _is_str(_strip(args[0])):
            yield (*pattern, "{key}")
        yield from schema_leaves(args[1], (*pattern, "{value}"))
    elif origin in (typing.Union, types.UnionType):
        for arg in args:
            yield from schema_leaves(arg, pattern)
    elif _is_str(annotation):
        yield pattern
    # Literal, enums, numbers and bools are closed sets or not strings: nothing to plant.


def _fits(arm: Any, data: Any) -> bool:
    """Which arm of a union ``data`` validates as; a discriminated union (state) picks by its Literal backend."""
    if isinstance(arm, type) and issubclass(arm, BaseModel):
        backend = arm.model_fields.get("backend")
        return isinstance(data, dict) and (backend is None or data.get("backend") in typing.get_args(_strip(backend.annotation)))
    origin = typing.get_origin(arm)
    return (origin in (tuple, list) and isinstance(data, list)) or (origin is dict and isinstance(data, dict)) or (arm is str and isinstance(data, str))


def data_leaves(annotation: Any, data: Any, path: Path_ = (), pattern: tuple[str, ...] = ()) -> Iterator[tuple[Path_, tuple[str, ...], bool]]:
    """(path in the document, schema pattern, is a map key) of every free string leaf in ``data``."""
    annotation = _strip(annotation)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel) and isinstance(data, dict):
        for name, field in annotation.model_fields.items():
            if name in data:
                yield from data_leaves(field.annotation, data[name], (*path, name), (*pattern, f"{annotation.__name__}.{name}"))
    elif origin in (tuple, list) and isinstance(data, list):
        for i, item in enumerate(data):
            yield from data_leaves(args[0], item, (*path, i), (*pattern, "[]"))
    elif origin is dict and isinstance(data, dict):
        for key, value in data.items():
            if _is_str(_strip(args[0])):
                yield (*path, key), (*pattern, "{key}"), True
            yield from data_leaves(args[1], value, (*path, key), (*pattern, "{value}"))
    elif origin in (typing.Union, types.UnionType):
        for arm in args:
            if _fits(_strip(arm), data):
                yield from data_leaves(arm, data, path, pattern)
                break
    elif _is_str(annotation) and isinstance(data, str):
        yield path, pattern, False


def _documents() -> dict[str, dict[str, Any]]:
    docs = {f"{p.stem}": YAML(typ="safe").load(p.read_text()) for p in sorted(FLEET_CLUSTERS.glob("*.yaml"))}
    for name, extra in EXTRAS.items():
        docs[f"{name}+extras"] = {**copy.deepcopy(docs[name]), **copy.deepcopy(extra)}
    return docs


DOCUMENTS = _documents()
PLANTS = [(doc, path, is_key) for doc, data in DOCUMENTS.items() for path, _, is_key in data_leaves(ClusterConfig, data)]


def _write(tmp_path: Path, doc: str, data: dict[str, Any]) -> Path:
    path = tmp_path / f"{doc.split('+')[0]}.yaml"
    path.write_text(json.dumps(data, indent=1))  # JSON is YAML, and dumps far faster than ruamel
    return path


def _plant(data: dict[str, Any], path: Path_, is_key: bool, payload: str) -> None:
    parent = data
    for part in path[:-1]:
        parent = parent[part]
    if is_key:
        parent[payload] = parent.pop(path[-1])
    else:
        parent[path[-1]] = payload


def test_every_schema_string_leaf_is_planted_somewhere() -> None:
    """Coverage: a string field added to the schema and absent from every document fails here until EXTRAS holds it."""
    planted = {pattern for data in DOCUMENTS.values() for _, pattern, _ in data_leaves(ClusterConfig, data)}
    missing = sorted(set(schema_leaves(ClusterConfig)) - planted)
    assert not missing, f"string fields no document holds (add them to EXTRAS): {missing}"
    assert len(planted) >= 30


@pytest.mark.parametrize("doc", sorted(DOCUMENTS))
def test_unplanted_documents_load(tmp_path: Path, doc: str) -> None:
    clusters.load(_write(tmp_path, doc, DOCUMENTS[doc]))


def test_fails_when_any_cluster_string_holds_a_terraform_interpolation(tmp_path: Path) -> None:
    """Through the loader, as ``gpufleet check`` reads the file: one line per problem at file:line."""
    payload = PAYLOADS[0]
    accepted = []
    for doc, path, is_key in PLANTS:
        data = copy.deepcopy(DOCUMENTS[doc])
        _plant(data, path, is_key, payload)
        file = _write(tmp_path, doc, data)
        try:
            clusters.load(file)
        except ConfigError as err:
            # At the leaf, or at the field holding it (a list item or a map key is reported on its field).
            where = {format_path(path[:k]) for k in range(max(1, len(path) - 2), len(path) + 1)}
            lines = [str(p) for p in err.problems]
            # pydantic names the discriminated-union arm in the location: state.gcs.bucket for state.bucket.
            fields = [re.sub(r"^state\.(local|gcs|tfc)\b", "state", p.field) for p in err.problems]
            planted_key = format_path((*path[:-1], payload)) if is_key else None
            assert where & set(fields) or any(planted_key and f.startswith(planted_key) for f in fields), (doc, path, lines)
            assert all("\n" not in line and line.startswith(f"{file}:") for line in lines), lines
            assert "Traceback" not in "".join(lines)
            continue
        accepted.append((doc, format_path(path)))
    assert not accepted, f"{len(accepted)} of {len(PLANTS)} planted strings were accepted: {accepted}"


def test_fails_when_any_cluster_string_holds_a_terraform_directive() -> None:
    """``%{`` too, at schema level (in memory: the loader path is covered above)."""
    accepted = []
    for doc, path, is_key in PLANTS:
        data = copy.deepcopy(DOCUMENTS[doc])
        _plant(data, path, is_key, PAYLOADS[1])
        try:
            config = ClusterConfig.model_validate(data)
        except ValidationError:
            continue
        if not cross_check(config, file_stem=doc.split("+")[0]):
            accepted.append((doc, format_path(path)))
    assert not accepted, f"{len(accepted)} of {len(PLANTS)} planted strings were accepted: {accepted}"
