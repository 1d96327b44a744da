"""Regenerate ``nomad_autoscaler_keys.json``: the HCL keys the Nomad Autoscaler decodes, read from
hashicorp/nomad-autoscaler's source at a fixed tag.

Usage: ``python tests/constructs_lib/vendor/extract_autoscaler.py <path to a nomad-autoscaler git dir>``.
Struct keys are the ``hcl:"name[,optional|,label|,block]"`` tags; target keys are the gce-mig
plugin's ``configKey*`` constants plus the shared ``TargetConfigKey*`` ones in sdk/target.go.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

TAG = "v0.4.9"
STRUCTS = {
    "agent/config/config.go": ("Agent", "Nomad", "Policy", "HighAvailability", "Plugin"),
    "sdk/policy.go": ("FileDecodeScalingPolicies", "FileDecodeScalingPolicy", "FileDecodePolicyDoc", "FileDecodePolicyCheckDoc",
                      "ScalingPolicyStrategy", "ScalingPolicyTarget"),
}
OUT = Path(__file__).with_name("nomad_autoscaler_keys.json")


def show(git_dir: str, path: str) -> str:
    return subprocess.run(["git", "--git-dir", git_dir, "show", f"{TAG}:{path}"], capture_output=True, text=True, check=True).stdout


def struct_keys(source: str, name: str) -> dict[str, str]:
    body = re.search(rf"^type {name} struct \{{\n(.*?)^\}}", source, re.M | re.S)
    if body is None:
        raise SystemExit(f"struct {name} not found")
    keys = {}
    for key, kind in re.findall(r'hcl:"([^",]*)(?:,([a-z]+))?"', body.group(1)):
        if key:
            keys[key] = kind or "required"
    return keys


def main(git_dir: str) -> None:
    commit = subprocess.run(["git", "--git-dir", git_dir, "rev-list", "-n1", TAG], capture_output=True, text=True, check=True).stdout.strip()
    data: dict[str, object] = {"_provenance": {"repo": "hashicorp/nomad-autoscaler", "tag": TAG, "commit": commit,
                                               "files": [*STRUCTS, "plugins/builtin/target/gce-mig/plugin/plugin.go", "sdk/target.go",
                                                         "policy/file/parse.go", "sdk/helper/scaleutils/node_drain.go", "sdk/helper/scaleutils/cluster.go"],
                                               "extracted": "2026-12-03", "by": "tests/constructs_lib/vendor/extract_autoscaler.py"}}
    for path, names in STRUCTS.items():
        source = show(git_dir, path)
        for name in names:
            data[name] = struct_keys(source, name)
    gce = show(git_dir, "plugins/builtin/target/gce-mig/plugin/plugin.go")
    sdk = show(git_dir, "sdk/target.go")
    data["gce_mig_target_keys"] = sorted(set(re.findall(r'configKey\w+\s*=\s*"([a-z_]+)"', gce)) |
                                         {k for k in re.findall(r'TargetConfig\w*\s*=\s*"([a-z_]+)"', sdk)})
    data["node_selector_strategies"] = sorted(re.findall(r'TargetNodeSelectorStrategy\w+\s*=\s*"([a-z_]+)"', sdk))
    # Values, not only keys: what ScalingPolicy.Validate (sdk/policy.go) and decodePolicyDoc
    # (policy/file/parse.go) accept, and which target keys sdk/helper/scaleutils parses how.
    policy = show(git_dir, "sdk/policy.go")
    data["policy_types"] = sorted(re.findall(r'ScalingPolicyType\w+\s*=\s*"([a-z_]+)"', policy))
    data["on_error_values"] = sorted(re.findall(r'ScalingPolicyOnError\w+\s*=\s*"([a-z_]+)"', policy))
    parse = show(git_dir, "policy/file/parse.go")
    hcl_fields = {go: key for go, key in re.findall(r'(\w+HCL)\s+string\s+`hcl:"([a-z_]+),optional"`', policy)}
    data["duration_fields"] = sorted(hcl_fields[go] for go in re.findall(r"time\.ParseDuration\(\w+(?:\.Doc)?\.(\w+HCL)\)", parse))
    scale = {f: show(git_dir, f"sdk/helper/scaleutils/{f}") for f in ("node_drain.go", "cluster.go")}
    keys_by_const = dict(re.findall(r'(TargetConfigKey\w+)\s*=\s*"([a-z_]+)"', sdk))
    data["target_duration_keys"] = sorted(keys_by_const[c] for c in re.findall(r"cfg\[sdk\.(TargetConfigKey\w+)\]; ok \{(?:\n[^\n]*){0,8}?\n\s*\w+, err := time\.ParseDuration", scale["node_drain.go"]))
    data["target_bool_keys"] = sorted({keys_by_const[c] for src in scale.values()
                                       for c in re.findall(r"cfg\[sdk\.(TargetConfigKey\w+)\]; ok \{(?:\n[^\n]*){0,8}?\n\s*\w+, err := strconv\.ParseBool", src)})
    OUT.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
