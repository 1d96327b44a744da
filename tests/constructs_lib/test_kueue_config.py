"""Kueue manager configuration (review D11): the committed file is the rendered one, every key is a
field of Kueue v0.19.2's Configuration type, and the settings do what gpufleet relies on."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from clusters.derive.tenants import TENANT_LABEL
from constructs_lib.kueue_config import manager_config, render

ROOT = Path(__file__).resolve().parents[2]
TABLE = json.loads((ROOT / "tests" / "schemas" / "kueue-config-v1beta2-v0.19.2.json").read_text())
# Go types whose JSON gpufleet does not descend into (Kubernetes API types, maps): their keys are free.
OPAQUE = ("metav1.", "configv1alpha1.", "map[")
# configuration_types.go v0.19.2: RequeuingTimestamp constants; QuotaCheckStrategy constants.
TIMESTAMPS = {"Eviction", "Creation"}
QUOTA_STRATEGIES = {"BlockUndeclared", "IgnoreUndeclared"}


def unknown_keys(node: dict[str, Any], struct: str = "Configuration", path: str = "") -> list[str]:
    if struct not in TABLE["structs"]:
        return [f"{path.rstrip('.')} (type {struct} not in the vendored table; regenerate it with that struct)"]
    fields = TABLE["structs"][struct]
    found = []
    for key, value in node.items():
        if struct == "Configuration" and key in ("apiVersion", "kind"):
            continue
        if key not in fields:
            found.append(f"{path}{key}")
            continue
        go_type = fields[key].lstrip("*")
        if isinstance(value, dict) and not go_type.startswith(OPAQUE):
            found += unknown_keys(value, go_type, f"{path}{key}.")
    return found


def test_committed_file_is_the_rendered_one():
    assert (ROOT / "deploy" / "kueue" / "controller_manager_config.yaml").read_text() == render()


def test_every_key_is_a_field_of_kueues_configuration_type():
    config = manager_config()
    assert config["apiVersion"] == TABLE["apiVersion"] and config["kind"] == "Configuration"
    assert unknown_keys(config) == []
    assert config["waitForPodsReady"]["requeuingStrategy"]["timestamp"] in TIMESTAMPS
    assert config["resources"]["quotaCheckStrategy"] in QUOTA_STRATEGIES


@pytest.mark.parametrize(("path", "bad"), [((), "manageJobsWithoutQueueNames"), (("waitForPodsReady",), "timeoutSeconds"),
                                            (("resources",), "excludedResourcePrefixes")])
def test_a_misspelt_key_is_caught(path, bad):
    config = copy.deepcopy(manager_config())
    node = config
    for part in path:
        node = node[part]
    node[bad] = 1
    assert unknown_keys(config) == [".".join((*path, bad))]


def test_the_file_parses_as_one_document():
    assert YAML(typ="safe").load(render()) == manager_config()


def test_namespace_selector_manages_tenant_namespaces_and_nothing_else(stack_json):
    (expression,) = manager_config()["managedJobsNamespaceSelector"]["matchExpressions"]
    assert expression == {"key": TENANT_LABEL, "operator": "Exists"}
    for stack in ("prod-gke-scheduler", "train-a3mega-scheduler", "dev-gke-scheduler"):
        namespaces = stack_json(stack)["resource"]["kubernetes_namespace_v1"].values()
        assert namespaces and all(TENANT_LABEL in ns["metadata"]["labels"] for ns in namespaces)


def test_all_ranks_or_none_and_never_a_second_start():
    ready = manager_config()["waitForPodsReady"]
    assert ready["timeout"] and ready["requeuingStrategy"]["backoffLimitCount"] == 0
    assert manager_config()["manageJobsWithoutQueueName"] is True
    assert "excludeResourcePrefixes" not in manager_config()["resources"]
