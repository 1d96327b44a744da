"""Every Kueue object gpufleet declares is valid against Kueue's own v1beta2 CRD schemas (vendored, v0.19.2).

A CRD's structural schema does not reject unknown fields: the API server silently prunes them,
so a misspelt or removed field (v1beta1's ``cohort`` or ``admissionChecks`` in v1beta2) would
apply and then do nothing. Besides the JSON-schema check (types, enums, required, min/max), every
key must be a declared property. CEL rules (``x-kubernetes-validations``) are not evaluated here.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import jsonschema
import pytest
from jsonschema.exceptions import ValidationError

from clusters.derive.pools import derive_gpu_pools
from clusters.derive.tenants import derive_tenants
from constructs_lib.kueue import cluster_queue, dws_objects, resource_flavor

SCHEMAS = json.loads((Path(__file__).resolve().parents[1] / "schemas" / "kueue-v1beta2-v0.19.2.json").read_text())


def _pattern(validator, pattern, instance, schema):
    """Kubernetes patterns are RE2: ``^(?i)...`` puts the flag after the anchor, which Python's re refuses."""
    if isinstance(instance, str) and not re.search(pattern.replace("^(?i)", "(?i)^"), instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


Validator = jsonschema.validators.extend(jsonschema.Draft7Validator, {"pattern": _pattern})


def unknown_fields(value: object, schema: dict, path: str = "") -> list[str]:
    """Keys the schema does not declare (the API server would prune them without a word)."""
    if isinstance(value, dict):
        props = schema.get("properties")
        if props is None:
            extra = schema.get("additionalProperties")
            return [f for k, v in value.items() for f in unknown_fields(v, extra, f"{path}.{k}")] if isinstance(extra, dict) else []
        return [f for k, v in value.items()
                for f in ([f"{path}.{k}"] if k not in props else unknown_fields(v, props[k], f"{path}.{k}"))]
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [f for i, v in enumerate(value) for f in unknown_fields(v, schema["items"], f"{path}[{i}]")]
    return []


def problems(manifest: dict) -> list[str]:
    kind = SCHEMAS.get(manifest["kind"])
    if kind is None:
        return [f"kind {manifest['kind']} is not in the vendored schemas"]
    schema = kind["schema"]
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in Validator(schema).iter_errors(manifest)]
    return errors + [f"unknown field {f}" for f in unknown_fields(manifest, schema)]


def declared(stack_json) -> list[dict]:
    found = []
    for stack in ("prod-gke-scheduler", "dev-gke-scheduler", "train-a3mega-scheduler"):
        found += [r["manifest"] for r in stack_json(stack)["resource"]["kubernetes_manifest"].values()
                  if r["manifest"]["apiVersion"].startswith("kueue.x-k8s.io/")]
    return found


def test_schemas_are_the_served_storage_version():
    assert SCHEMAS["_meta"]["tag"] == "v0.19.2" and SCHEMAS["_meta"]["commit"]
    assert all(SCHEMAS[k]["served"] and SCHEMAS[k]["storage"] for k in SCHEMAS if k != "_meta")


def test_every_synthesized_kueue_object_matches_its_crd(stack_json):
    manifests = declared(stack_json)
    # dev-gke's DWS pool brings the provisioning AdmissionCheck and its config; train-a3mega the Topology.
    assert {m["kind"] for m in manifests} == {"ResourceFlavor", "ClusterQueue", "LocalQueue", "AdmissionCheck", "ProvisioningRequestConfig", "Topology"}
    for m in manifests:
        assert m["apiVersion"] == "kueue.x-k8s.io/v1beta2"
        assert problems(m) == [], m["metadata"]["name"]


def test_dws_objects_match_their_crds(example_configs):
    prod = {c.name: c for c in example_configs}["prod-gke"]
    dws = dataclasses.replace(derive_gpu_pools(prod)[1], spot=False, queued_provisioning=True)
    for m in (*dws_objects(), cluster_queue(derive_tenants(prod)[0], dws, "prod-gke"), resource_flavor(dws)):
        assert problems(m) == [], m["kind"]


@pytest.mark.parametrize(("mutate", "expected"), [
    (lambda s: s.update(cohort=s.pop("cohortName")), "unknown field .spec.cohort"),
    (lambda s: s.update(admissionChecks=["dws-prov"]), "unknown field .spec.admissionChecks"),
    (lambda s: s.update(queueingStrategy="FIFO"), "is not one of"),
    (lambda s: s["preemption"].update(withinClusterQueue="Sometimes"), "is not one of"),
])
def test_the_check_catches_v1beta1_leftovers_and_bad_enums(example_configs, mutate, expected):
    """The toolkit's own DWS template puts v1beta1's spec.admissionChecks into a v1beta2 ClusterQueue: pruned on apply."""
    prod = {c.name: c for c in example_configs}["prod-gke"]
    queue = cluster_queue(derive_tenants(prod)[0], derive_gpu_pools(prod)[0], "prod-gke")
    mutate(queue["spec"])
    assert any(expected in p for p in problems(queue)), problems(queue)
