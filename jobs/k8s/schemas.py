"""Validate manifests against the vendored upstream schemas in ``jobs/k8s/openapi`` (see its regenerate.py).

Kubernetes kinds come from the Kubernetes OpenAPI (strict: an unknown field is an error, as
with the API server's strict field validation); Kueue kinds from Kueue's CRDs. The same
validators run in ``gpufleet jobs render`` and in the Kubernetes API double.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

SCHEMAS_DIR = Path(__file__).resolve().parent / "openapi"
SCHEMA_FILES = {
    ("batch/v1", "Job"): "k8s-job-batch-v1.json",
    ("v1", "Service"): "k8s-service-v1.json",
    ("v1", "Secret"): "k8s-secret-v1.json",
    ("apps/v1", "DaemonSet"): "k8s-daemonset-apps-v1.json",
    ("kueue.x-k8s.io/v1beta2", "Workload"): "kueue-workloads-v1beta2.json",
    ("kueue.x-k8s.io/v1beta1", "LocalQueue"): "kueue-localqueues-v1beta1.json",
    ("kueue.x-k8s.io/v1beta2", "LocalQueue"): "kueue-localqueues-v1beta2.json",
}


class SchemaError(ValueError):
    """A manifest the API server would refuse; the message names the kind, object and field."""


@cache
def validator(api_version: str, kind: str) -> Any:
    from jsonschema import Draft202012Validator

    name = SCHEMA_FILES.get((api_version, kind))
    if name is None:
        raise SchemaError(f"no vendored schema for {api_version} {kind}; allowed: {', '.join(f'{a} {k}' for a, k in sorted(SCHEMA_FILES))}")
    return Draft202012Validator(json.loads((SCHEMAS_DIR / name).read_text()))


def errors(manifest: dict[str, Any]) -> list[str]:
    """Every schema violation as 'Kind name: path: message', in a stable order."""
    api_version, kind = manifest.get("apiVersion", ""), manifest.get("kind", "")
    name = (manifest.get("metadata") or {}).get("name", "?")
    found = validator(api_version, kind).iter_errors(manifest)
    return sorted(f"{kind} {name}: {'.'.join(str(p) for p in error.absolute_path) or '(root)'}: {error.message}" for error in found)


def require_valid(manifests: list[dict[str, Any]]) -> None:
    problems = [line for manifest in manifests for line in errors(manifest)]
    if problems:
        raise SchemaError("; ".join(problems))
