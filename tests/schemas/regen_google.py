"""Regenerate google-6.50.0.json: attribute names and nesting of the google resources gpufleet declares.

Source: the prebuilt cdktf bindings ``cdktf-cdktf-provider-google==16.12.1`` (pyproject.toml), which
cdktf generated from ``terraform providers schema -json`` of hashicorp/google 6.50.0 (the package
README says so). Each resource's config class lists its arguments and blocks; a block's struct
class lists its own. Python names are Terraform names except for a trailing ``_`` that jsii adds to
reserved words (``id_``, ``from_``).

Usage: .venv/bin/python tests/schemas/regen_google.py   (needs the pinned bindings installed)
"""

from __future__ import annotations

import importlib
import inspect
import json
import typing
from importlib import metadata
from pathlib import Path

PACKAGE = "cdktf_cdktf_provider_google"
DISTRIBUTION = "cdktf-cdktf-provider-google"
# Every google resource and data source a gpufleet construct can declare (the test fails on any other).
TYPES = (
    "compute_address", "compute_autoscaler", "compute_firewall", "compute_forwarding_rule", "compute_global_address",
    "compute_health_check", "compute_instance_group_manager", "compute_instance_template", "compute_network",
    "compute_region_autoscaler", "compute_region_backend_service", "compute_region_health_check",
    "compute_region_instance_group_manager", "compute_region_instance_template", "compute_router", "compute_router_nat",
    "compute_subnetwork", "container_cluster", "container_node_pool", "dns_managed_zone", "dns_record_set", "project_iam_member", "secret_manager_secret",
    "secret_manager_secret_iam_member", "secret_manager_secret_version", "service_account", "service_account_iam_member",
    "storage_bucket", "storage_bucket_iam_member",
)
# Data sources, stored as "data.google_<name>" (the reserved pools' reservation check, clusters.reservation;
# the project number of the checkpoint bucket's KSA principals, constructs_lib.checkpoint_bucket).
DATA_TYPES = ("compute_reservation", "project")
META = {"scope", "id", "connection", "count", "depends_on", "for_each", "lifecycle", "provider", "provisioners", "return"}


def _classes(annotation: object) -> list[type]:
    found = [annotation] if inspect.isclass(annotation) else []
    for arg in typing.get_args(annotation):
        found += _classes(arg)
    return found


def _struct(annotation: object, module: str) -> type | None:
    for cls in _classes(annotation):
        if cls.__module__.startswith(PACKAGE) and cls.__module__.startswith(module) and "__init__" in cls.__dict__:
            return cls
    return None


def walk(cls: type, top: bool = False) -> dict[str, object]:
    tree: dict[str, object] = {}
    for name, annotation in typing.get_type_hints(cls.__init__).items():
        if top and name in META or name == "return":
            continue
        sub = _struct(annotation, cls.__module__)
        tree[name.removesuffix("_") if name.endswith("_") else name] = walk(sub) if sub is not None and sub is not cls else None
    return dict(sorted(tree.items()))


def class_name(module: str) -> str:
    return "".join(part.capitalize() for part in module.split("_"))


def main() -> None:
    out: dict[str, object] = {"_meta": {
        "provider": "hashicorp/google", "provider_version": "6.50.0",
        "source": f"{DISTRIBUTION}=={metadata.version(DISTRIBUTION)} (prebuilt cdktf bindings generated from the provider schema)",
        "cross_checked": "hashicorp/terraform-provider-google tag v6.50.0 (956f5109), google/services/container/*.go,"
                         " google/services/compute/resource_compute_reservation.go (data source), google/services/storage/resource_storage_bucket.go",
        "regenerate": ".venv/bin/python tests/schemas/regen_google.py",
        "format": "resource type -> {attribute: null (argument) | {nested block attributes}}",
    }}
    for module in TYPES:
        mod = importlib.import_module(f"{PACKAGE}.{module}")
        out[f"google_{module}"] = walk(getattr(mod, class_name(module)), top=True)
    for module in DATA_TYPES:
        mod = importlib.import_module(f"{PACKAGE}.data_google_{module}")
        out[f"data.google_{module}"] = walk(getattr(mod, class_name(f"data_google_{module}")), top=True)
    Path(__file__).with_name("google-6.50.0.json").write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
