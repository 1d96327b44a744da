"""Regenerate ``nomad_autoscaler_keys.json``: the HCL keys the Nomad Autoscaler decodes and the values
it accepts, read from hashicorp/nomad-autoscaler's source at a fixed tag.

Usage (the ``fetch`` tool or ``git clone --bare`` gives the git dir):
``python tests/constructs_lib/vendor/extract_autoscaler.py <path to a nomad-autoscaler git dir>``.
Struct keys are the ``hcl:"name[,optional|,label|,block]"`` tags; target keys are the gce-mig
plugin's ``configKey*`` constants plus the shared ``TargetConfigKey*`` ones in sdk/target.go.
Every value table records where it was read (``_where``: file:line at ``_provenance.commit``), so a
reviewer can open the line; a pattern that no longer matches stops the script instead of writing
an empty table.
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
GCE = "plugins/builtin/target/gce-mig/plugin/plugin.go"
STRATEGIES = ("pass-through", "target-value", "threshold")
PROMETHEUS = "plugins/builtin/apm/prometheus/plugin/plugin.go"
NOMAD_APM = ("plugins/builtin/apm/nomad/plugin/metrics.go", "plugins/builtin/apm/nomad/plugin/node.go")
OUT = Path(__file__).with_name("nomad_autoscaler_keys.json")


class Source:
    """One file at TAG, with line numbers for what a pattern matched."""

    def __init__(self, git_dir: str, path: str) -> None:
        self.path = path
        self.text = subprocess.run(["git", "--git-dir", git_dir, "show", f"{TAG}:{path}"], capture_output=True, text=True, check=True).stdout

    def line(self, pattern: str) -> str:
        match = re.search(pattern, self.text, re.M)
        if match is None:
            raise SystemExit(f"{self.path}: pattern {pattern!r} not found at {TAG}; re-read the source before regenerating")
        return f"{self.path}:{self.text.count(chr(10), 0, match.start()) + 1}"

    def all(self, pattern: str) -> list[str]:
        found = re.findall(pattern, self.text, re.M)
        if not found:
            raise SystemExit(f"{self.path}: pattern {pattern!r} not found at {TAG}")
        return found


def struct_keys(source: Source, name: str) -> dict[str, str]:
    body = re.search(rf"^type {name} struct \{{\n(.*?)^\}}", source.text, re.M | re.S)
    if body is None:
        raise SystemExit(f"struct {name} not found")
    return {key: kind or "required" for key, kind in re.findall(r'hcl:"([^",]*)(?:,([a-z]+))?"', body.group(1)) if key}


def strategy_kinds(source: Source) -> dict[str, str]:
    """Config key -> how the plugin parses it: ``int`` (strconv.ParseInt/Atoi) or ``float``
    (strconv.ParseFloat, or threshold's parseBound, which calls it)."""
    consts = dict(source.all(r'(runConfigKey\w+)\s*=\s*"([a-z_]+)"'))
    kinds = {}
    for var, const in re.findall(r"(\w+) := (?:eval\.Check\.Strategy\.Config|config)\[(runConfigKey\w+)\]", source.text):
        if re.search(rf"strconv\.(ParseInt|Atoi)\({var}\b", source.text):
            kinds[consts[const]] = "int"
        elif re.search(rf"(strconv\.ParseFloat|parseBound\(\w+,) ?\(?{var}\b", source.text):
            kinds[consts[const]] = "float"
    return dict(sorted(kinds.items()))


def main(git_dir: str) -> None:
    commit = subprocess.run(["git", "--git-dir", git_dir, "rev-list", "-n1", TAG], capture_output=True, text=True, check=True).stdout.strip()
    src = {p: Source(git_dir, p) for p in [*STRUCTS, GCE, "sdk/target.go", "sdk/policy.go", "policy/file/parse.go", "policy/policy.go",
                                           "policy/file/source.go", "sdk/helper/scaleutils/node_drain.go", "sdk/helper/scaleutils/cluster.go",
                                           "sdk/helper/scaleutils/nodepool/nodepool.go", "sdk/helper/scaleutils/nodeselector/selector.go",
                                           PROMETHEUS, *NOMAD_APM, *(f"plugins/builtin/strategy/{s}/plugin/plugin.go" for s in STRATEGIES)]}
    data: dict[str, object] = {"_provenance": {"repo": "hashicorp/nomad-autoscaler", "tag": TAG, "commit": commit, "files": sorted(src),
                                               "extracted": "2026-12-04", "by": "tests/constructs_lib/vendor/extract_autoscaler.py"}}
    where: dict[str, str] = {}
    for path, names in STRUCTS.items():
        for name in names:
            data[name] = struct_keys(src[path], name)
            where[name] = src[path].line(rf"^type {name} struct")
    gce, sdk, policy, parse = src[GCE], src["sdk/target.go"], src["sdk/policy.go"], src["policy/file/parse.go"]
    data["gce_mig_target_keys"] = sorted(set(gce.all(r'configKey\w+\s*=\s*"([a-z_]+)"')) | set(sdk.all(r'TargetConfig\w*\s*=\s*"([a-z_]+)"')))
    where["gce_mig_target_keys"] = gce.line(r"configKeyCredentials\s*=")
    # calculateMIG: project, then region or zone, then mig_name, each "required config param".
    gce_consts = dict(gce.all(r'(configKey\w+)\s*=\s*"([a-z_]+)"'))
    data["gce_mig_required_one_of"] = [[gce_consts["configKeyProject"]], sorted([gce_consts["configKeyRegion"], gce_consts["configKeyZone"]]),
                                       [gce_consts["configKeyMIGName"]]]
    where["gce_mig_required_one_of"] = gce.line(r"func \(t \*TargetPlugin\) calculateMIG")
    data["target_int_keys"] = [gce_consts["configKeyRetryAttempts"]]
    where["target_int_keys"] = gce.line(r"strconv\.Atoi\(retryAttemptsStr\)")
    # NewClusterNodePoolIdentifier: at least one of node_class, datacenter, node_pool ("node pool identification method required").
    sdk_consts = dict(sdk.all(r'(TargetConfig\w+)\s*=\s*"([A-Za-z_]+)"'))
    pool = src["sdk/helper/scaleutils/nodepool/nodepool.go"]
    data["pool_identifier_keys"] = sorted(sdk_consts[c] for c in pool.all(r"cfg\[sdk\.(TargetConfigKey\w+)\]"))
    where["pool_identifier_keys"] = pool.line(r"node pool identification method required")
    data["node_selector_strategies"] = sorted(sdk.all(r'TargetNodeSelectorStrategy\w+\s*=\s*"([a-z_]+)"'))
    where["node_selector_strategies"] = src["sdk/helper/scaleutils/nodeselector/selector.go"].line(r"unsupported node selector strategy")
    data["policy_types"] = sorted(policy.all(r'ScalingPolicyType\w+\s*=\s*"([a-z_]+)"'))
    where["policy_types"] = policy.line(r"ScalingPolicyTypeCluster\s*=")
    data["on_error_values"] = sorted(policy.all(r'ScalingPolicyOnError\w+\s*=\s*"([a-z_]+)"'))
    where["on_error_values"] = policy.line(r"invalid value for on_check_error")
    where["validate"] = policy.line(r"func \(p \*ScalingPolicy\) Validate")
    where["min_max"] = src["policy/policy.go"].line(r"func \(pr \*Processor\) ValidatePolicy")
    where["file_policy_validated"] = src["policy/file/source.go"].line(r"ValidatePolicy\(scalingPolicy\)")
    where["file_type_default_cluster"] = parse.line(r"decodePolicy\.Type = sdk\.ScalingPolicyTypeCluster")
    hcl_fields = dict(policy.all(r'(\w+HCL)\s+string\s+`hcl:"([a-z_]+),optional"`'))
    data["duration_fields"] = sorted(hcl_fields[go] for go in parse.all(r"time\.ParseDuration\(\w+(?:\.Doc)?\.(\w+HCL)\)"))
    where["duration_fields"] = parse.line(r"func decodePolicyDoc")
    agent = src["agent/config/config.go"]
    agent_hcl = dict(agent.all(r'(\w+HCL)\s+string\s+`hcl:"([a-z_]+),optional"'))
    data["agent_duration_fields"] = sorted(agent_hcl[go] for go in agent.all(r"time\.ParseDuration\(cfg\.\w+\.(\w+HCL)\)"))
    where["agent_duration_fields"] = agent.line(r"time\.ParseDuration\(cfg\.")
    scale = {f: src[f"sdk/helper/scaleutils/{f}"] for f in ("node_drain.go", "cluster.go")}
    keys_by_const = dict(sdk.all(r'(TargetConfigKey\w+)\s*=\s*"([a-z_]+)"'))
    data["target_duration_keys"] = sorted(keys_by_const[c] for c in scale["node_drain.go"].all(
        r"cfg\[sdk\.(TargetConfigKey\w+)\]; ok \{(?:\n[^\n]*){0,8}?\n\s*\w+, err := time\.ParseDuration"))
    where["target_duration_keys"] = scale["node_drain.go"].line(r"time\.ParseDuration\(drainString\)")
    data["target_bool_keys"] = sorted({keys_by_const[c] for s in scale.values() for c in re.findall(
        r"cfg\[sdk\.(TargetConfigKey\w+)\]; ok \{(?:\n[^\n]*){0,8}?\n\s*\w+, err := strconv\.ParseBool", s.text)})
    where["target_bool_keys"] = scale["cluster.go"].line(r"strconv\.ParseBool\(val\)")
    data["strategy_config"] = {}
    for name in STRATEGIES:
        s = src[f"plugins/builtin/strategy/{name}/plugin/plugin.go"]
        data["strategy_config"][name] = strategy_kinds(s)
        where[f"strategy_config.{name}"] = s.line(r'runConfigKey\w+\s*=\s*"')
    tv, th = src["plugins/builtin/strategy/target-value/plugin/plugin.go"], src["plugins/builtin/strategy/threshold/plugin/plugin.go"]
    # Each inner list: at least one of these keys must be set; "exactly_one" also forbids two.
    data["strategy_required"] = {"pass-through": [], "target-value": [{"any_of": ["target"]}],
                                 "threshold": [{"any_of": ["lower_bound", "upper_bound"]}, {"exactly_one": ["delta", "percentage", "value"]}]}
    where["strategy_required.target-value"] = tv.line(r"missing required field `target`")
    where["strategy_required.threshold"] = th.line(r"only one of %q, %q or %q must be provided")
    prom = src[PROMETHEUS]
    data["prometheus_apm"] = {"required": ["address"], "bool": ["skip_verify"], "path": ["ca_cert"],
                              "keys": sorted(prom.all(r'configKey\w+\s*=\s*"([a-z_]+)"'))}
    where["prometheus_apm"] = prom.line(r"config value cannot be empty")
    metrics, node = (src[p] for p in NOMAD_APM)
    data["nomad_apm_node_query"] = {"form": "node_<operation>_<metric>/<node_class>/class",
                                    "operations": metrics.all(r'queryOpPercentageAllocated\s*=\s*"([a-z-]+)"'),
                                    "metrics": sorted(set(metrics.all(r'queryMetric(?:CPU|Mem)\s*=\s*"([a-z]+)"'))),
                                    "empty_pool_error": "no nodes identified within pool"}
    where["nomad_apm_node_query"] = node.line(r"func parseNodePoolQuery")
    where["nomad_apm_node_query.empty_pool_error"] = node.line(r"no nodes identified within pool")
    data["_where"] = dict(sorted(where.items()))
    OUT.write_text(json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
