"""Regenerate the vendored schema extracts in this folder (run by hand; tests only read the output).

Kubernetes: ``job-batch-v1.json``, ``service-v1.json``, ``secret-v1.json``, ``daemonset-apps-v1.json`` are the
``v<K8S>-local-strict`` schemas of the PyPI package kubernetes-validate, which converts
kubernetes/kubernetes ``api/openapi-spec`` of that release tag to JSON Schema 2020-12 and adds
``additionalProperties: false`` (what the API server's strict field validation, kubectl's default,
refuses as "unknown field"). Each file keeps only its kind and the definitions it references.

Kueue: ``kueue-*.json`` are ``spec.versions[].schema.openAPIV3Schema`` of
kubernetes-sigs/kueue ``config/components/crd/bases/kueue.x-k8s.io_<plural>.yaml`` at a release
tag, with ``additionalProperties: false`` added to every object that lists its properties and does
not keep unknown fields (same strictness). CEL rules (``x-kubernetes-validations``) are kept as
annotations; no JSON-schema validator runs them.

Descriptions are dropped (the upstream files carry them) so the extracts stay small.

    pip download --no-deps kubernetes-validate==1.37.0 -d /tmp/kv
    git clone --branch v0.19.2 https://github.com/kubernetes-sigs/kueue /tmp/kueue
    python jobs/k8s/openapi/regenerate.py --kubernetes-validate-wheel /tmp/kv/kubernetes_validate-1.37.0-py3-none-any.whl \
        --kubernetes-version 1.35.0 --kueue-repo /tmp/kueue --kueue-ref v0.19.2
"""

from __future__ import annotations

import argparse
import json
import subprocess
import zipfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
# daemonset-apps-v1: the GPUDirect runtime DaemonSets of the scheduler stack (constructs_lib/gpudirect_runtime.py).
K8S_KINDS = {"job-batch-v1": "Job", "service-v1": "Service", "secret-v1": "Secret", "daemonset-apps-v1": "DaemonSet"}
# (CRD plural, version served): the versions gpufleet writes (v1beta1 queues, constructs_lib/kueue.py)
# and reads (v1beta2 Workloads, the storage version since v0.16).
KUEUE_CRDS = (("workloads", "v1beta2"), ("localqueues", "v1beta1"), ("localqueues", "v1beta2"))
SCHEMA_KEYWORDS_WITH_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")


def strip(node: Any) -> Any:
    """Drop 'description' annotations, never a property that happens to be called description."""
    if isinstance(node, list):
        return [strip(item) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "description" and isinstance(value, str):
            continue
        if key in SCHEMA_KEYWORDS_WITH_SUBSCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: strip(sub) for name, sub in value.items()}
        else:
            out[key] = strip(value)
    return out


def _refs(node: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                found.add(value.rsplit("/", 1)[-1])
            else:
                found |= _refs(value)
    elif isinstance(node, list):
        for item in node:
            found |= _refs(item)
    return found


def _relink(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: ("#/$defs/" + v.rsplit("/", 1)[-1] if k == "$ref" and isinstance(v, str) else _relink(v)) for k, v in node.items()}
    if isinstance(node, list):
        return [_relink(item) for item in node]
    return node


def kubernetes_extract(wheel: Path, version: str, stem: str, provenance: str) -> dict[str, Any]:
    base = f"kubernetes_validate/kubernetes-json-schema/v{version}-local-strict/"
    with zipfile.ZipFile(wheel) as archive:
        root = json.loads(archive.read(base + f"{stem}.json"))
        definitions = json.loads(archive.read(base + "_definitions.json"))["$defs"]
    needed: set[str] = set()
    todo = _refs(root)
    while todo:
        name = todo.pop()
        if name not in needed:
            needed.add(name)
            todo |= _refs(definitions[name]) - needed
    schema = _relink(strip(root))
    schema.pop("$id", None)
    schema["$comment"] = provenance
    schema["$defs"] = {name: _relink(strip(definitions[name])) for name in sorted(needed)}
    return schema


def strict(node: Any) -> Any:
    if isinstance(node, list):
        return [strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {k: (({n: strict(s) for n, s in v.items()}) if k in SCHEMA_KEYWORDS_WITH_SUBSCHEMA_MAPS and isinstance(v, dict) else strict(v))
           for k, v in node.items()}
    if "properties" in out and "additionalProperties" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


def kueue_extract(repo: Path, ref: str, plural: str, version: str, provenance: str) -> dict[str, Any]:
    path = f"config/components/crd/bases/kueue.x-k8s.io_{plural}.yaml"
    text = subprocess.run(["git", "-C", str(repo), "show", f"{ref}:{path}"], check=True, capture_output=True, text=True).stdout
    crd = yaml.safe_load(text)
    served = next(v for v in crd["spec"]["versions"] if v["name"] == version)
    schema = strict(strip(served["schema"]["openAPIV3Schema"]))
    # The CRD schema leaves apiVersion/kind open; pin them so a manifest of another kind fails.
    schema["properties"]["apiVersion"] = {"type": "string", "enum": [f"kueue.x-k8s.io/{version}"]}
    schema["properties"]["kind"] = {"type": "string", "enum": [crd["spec"]["names"]["kind"]]}
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$comment": provenance, **schema}


def _write(name: str, schema: dict[str, Any]) -> None:
    (HERE / f"{name}.json").write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubernetes-validate-wheel", type=Path, required=True)
    parser.add_argument("--kubernetes-version", default="1.35.0")
    parser.add_argument("--kueue-repo", type=Path, required=True, help="a git clone of kubernetes-sigs/kueue")
    parser.add_argument("--kueue-ref", default="v0.19.2")
    args = parser.parse_args()
    today = datetime.now(UTC).date().isoformat()
    wheel_name = args.kubernetes_validate_wheel.name
    for stem in K8S_KINDS:
        provenance = (f"kubernetes/kubernetes api/openapi-spec at tag v{args.kubernetes_version}, as converted by PyPI {wheel_name} "
                      f"(v{args.kubernetes_version}-local-strict/{stem}.json + _definitions.json); extracted {today} by jobs/k8s/openapi/regenerate.py")
        _write(f"k8s-{stem}", kubernetes_extract(args.kubernetes_validate_wheel, args.kubernetes_version, stem, provenance))
    commit = subprocess.run(["git", "-C", str(args.kueue_repo), "rev-parse", f"{args.kueue_ref}^{{commit}}"], check=True, capture_output=True, text=True).stdout.strip()
    for plural, version in KUEUE_CRDS:
        provenance = (f"kubernetes-sigs/kueue config/components/crd/bases/kueue.x-k8s.io_{plural}.yaml at tag {args.kueue_ref} "
                      f"(commit {commit}), version {version} openAPIV3Schema; extracted {today} by jobs/k8s/openapi/regenerate.py")
        _write(f"kueue-{plural}-{version}", kueue_extract(args.kueue_repo, args.kueue_ref, plural, version, provenance))


if __name__ == "__main__":
    main()
