"""Regenerate ``nomad_api_fields.json``: the JSON field names of the Nomad api package structs
gpufleet sends, read from hashicorp/nomad's Go source at fixed tags.

Usage: ``python tests/jobs/vendor/extract_nomad_api.py <path to a hashicorp/nomad git dir>``.
A field's JSON name is its Go name unless a ``json:"name"`` tag renames it; ``json:"-"`` and
unexported fields are skipped; an embedded struct contributes its own fields.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

TAGS = ("v1.10.5", "v2.0.5")
FILES = ("api/jobs.go", "api/tasks.go", "api/resources.go", "api/constraint.go", "api/allocations.go")
STRUCTS = ("Job", "ParameterizedJobConfig", "TaskGroup", "Task", "Resources", "RequestedDevice", "Constraint", "Affinity",
           "RestartPolicy", "ReschedulePolicy", "EphemeralDisk", "JobRegisterRequest", "JobPlanRequest", "JobDispatchRequest",
           "JobListStub", "JobSummary", "TaskGroupSummary", "AllocationListStub", "TaskState", "TaskEvent")
OUT = Path(__file__).with_name("nomad_api_fields.json")
_STRUCT = re.compile(r"^type (\w+) struct \{\n(.*?)^\}", re.M | re.S)
_FIELD = re.compile(r"^\t(\w+)(?:\s+([^`\n]+?))?\s*(?:`([^`]*)`)?\s*(?://.*)?$")


def _fields(body: str, structs: dict[str, str]) -> list[str]:
    names: list[str] = []
    for line in body.splitlines():
        match = _FIELD.match(line)
        if not match or line.strip().startswith("//"):
            continue
        name, kind, tag = match.group(1), match.group(2), match.group(3) or ""
        if kind is None:  # embedded struct
            names += _fields(structs.get(name, ""), structs)
            continue
        if not name[0].isupper():
            continue
        json_tag = re.search(r'json:"([^"]*)"', tag)
        if json_tag:
            renamed = json_tag.group(1).split(",")[0]
            if renamed == "-":
                continue
            name = renamed or name
        names.append(name)
    return sorted(set(names))


def extract(git_dir: str, tag: str) -> dict[str, list[str]]:
    source = "".join(subprocess.run(["git", "--git-dir", git_dir, "show", f"{tag}:{f}"], capture_output=True, text=True, check=True).stdout
                     for f in FILES)
    structs = {m.group(1): m.group(2) for m in _STRUCT.finditer(source)}
    return {name: _fields(structs[name], structs) for name in STRUCTS}


def main(git_dir: str) -> None:
    commits = {t: subprocess.run(["git", "--git-dir", git_dir, "rev-list", "-n1", t], capture_output=True, text=True, check=True).stdout.strip()
               for t in TAGS}
    data = {
        "_provenance": {"repo": "hashicorp/nomad", "files": list(FILES), "tags": commits,
                        "extracted": "2026-12-03", "by": "tests/jobs/vendor/extract_nomad_api.py"},
        **{tag: extract(git_dir, tag) for tag in TAGS},
    }
    OUT.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
