"""What hashicorp/nomad-autoscaler v0.4.9 refuses in its agent config and file policies, as pure
functions over the parsed HCL, driven by the table extracted from its source
(vendor/nomad_autoscaler_keys.json; every table's file:line is in its ``_where``).

Go's parsers are ported rather than approximated by a regex, because the autoscaler hands the
strings to them: ``time.ParseDuration`` (go/src/time/format.go), ``strconv.ParseBool``,
``strconv.ParseInt(s, 10, 64)`` / ``Atoi`` and ``strconv.ParseFloat(s, 64)`` (decimal forms).
"""

from __future__ import annotations

import json
import re
from fractions import Fraction
from collections.abc import Mapping
from pathlib import Path

RULES = json.loads((Path(__file__).parent / "vendor" / "nomad_autoscaler_keys.json").read_text())

# go/src/time/format.go unitMap: both micro signs are accepted.
_UNITS = {"ns": 1, "us": 1_000, "\u00b5s": 1_000, "\u03bcs": 1_000, "ms": 1_000_000, "s": 10**9, "m": 60 * 10**9, "h": 3600 * 10**9}
_MAX_NS = (1 << 63) - 1


def go_parse_duration(text: str) -> int:
    """time.ParseDuration: ``[-+]?([0-9]*(\\.[0-9]*)?[a-z]+)+``, "0" alone without a unit, a unit
    after every number, no spaces, the total within int64 nanoseconds. Returns nanoseconds;
    raises ValueError where Go returns an error."""
    s, neg = text, False
    if s[:1] in ("-", "+"):
        neg, s = s[0] == "-", s[1:]
    if s == "0":
        return 0
    if not s:
        raise ValueError(f"time: invalid duration {text!r}")
    total = Fraction(0)
    while s:
        number = re.match(r"([0-9]*)(\.([0-9]*))?", s)
        assert number is not None
        whole, fraction = number.group(1), number.group(3) or ""
        if not whole and not fraction:
            raise ValueError(f"time: invalid duration {text!r}")
        s = s[number.end():]
        unit = re.match(r"[^0-9.]*", s).group(0)  # type: ignore[union-attr]
        if not unit:
            raise ValueError(f"time: missing unit in duration {text!r}")
        if unit not in _UNITS:
            raise ValueError(f"time: unknown unit {unit!r} in duration {text!r}")
        s = s[len(unit):]
        total += int(whole or "0") * _UNITS[unit] + (Fraction(int(fraction), 10 ** len(fraction)) * _UNITS[unit] if fraction else 0)
    if total > _MAX_NS + (1 if neg else 0):
        raise ValueError(f"time: invalid duration {text!r}")
    return -int(total) if neg else int(total)


def go_parse_bool(text: str) -> bool:
    """strconv.ParseBool accepts exactly these twelve spellings."""
    if text in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if text in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    raise ValueError(f"strconv.ParseBool: parsing {text!r}: invalid syntax")


def go_parse_int(text: str) -> int:
    """strconv.ParseInt(s, 10, 64) / Atoi: optional sign, decimal digits, no underscores (those
    are allowed only with base 0), within int64."""
    if not re.fullmatch(r"[+-]?[0-9]+", text) or not -(1 << 63) <= int(text) <= _MAX_NS:
        raise ValueError(f"strconv.ParseInt: parsing {text!r}: invalid syntax")
    return int(text)


def go_parse_float(text: str) -> float:
    """strconv.ParseFloat(s, 64), decimal and special forms (gpufleet writes no hex floats)."""
    if not re.fullmatch(r"[+-]?(([0-9](_?[0-9])*)?\.?[0-9](_?[0-9])*([eE][+-]?[0-9]+)?|inf|infinity|nan)", text, re.I):
        raise ValueError(f"strconv.ParseFloat: parsing {text!r}: invalid syntax")
    return float(text.replace("_", ""))


_PARSERS = {"int": go_parse_int, "float": go_parse_float, "bool": go_parse_bool, "duration": go_parse_duration}


def _parses(kind: str, value: object) -> bool:
    if not isinstance(value, str):
        return False
    try:
        _PARSERS[kind](value)
    except ValueError:
        return False
    return True


def _required(where: str, config: Mapping[str, object], groups: list[list[str]]) -> list[str]:
    return [f"{where}: needs one of {group}" for group in groups if not any(config.get(k) for k in group)]


def target_errors(where: str, config: Mapping[str, object]) -> list[str]:
    """gce-mig target config: a string map (map[string]string) of keys the plugin or the shared
    cluster scale utils read, the MIG located (calculateMIG), a node pool identified
    (NewClusterNodePoolIdentifier), every parsed value parsing, a known node selector."""
    errors = [f"{where}: {k} is not a gce-mig key" for k in config if k not in RULES["gce_mig_target_keys"]]
    errors += [f"{where}: {k} must be a string" for k, v in config.items() if not isinstance(v, str)]
    errors += _required(where, config, RULES["gce_mig_required_one_of"])
    errors += _required(where, config, [RULES["pool_identifier_keys"]])
    for kind, keys in (("duration", RULES["target_duration_keys"]), ("bool", RULES["target_bool_keys"]), ("int", RULES["target_int_keys"])):
        errors += [f"{where}: {k} {config[k]!r} is not a Go {kind}" for k in keys if k in config and not _parses(kind, config[k])]
    strategy = config.get("node_selector_strategy")
    if strategy is not None and strategy not in RULES["node_selector_strategies"]:
        errors.append(f"{where}: node_selector_strategy {strategy!r} not in {RULES['node_selector_strategies']}")
    return errors


def strategy_errors(where: str, name: str, config: Mapping[str, object]) -> list[str]:
    """A strategy plugin's run config: known keys, parsed as the plugin parses them, required ones present."""
    kinds = RULES["strategy_config"].get(name)
    if kinds is None:
        return [f"{where}: strategy {name!r} is not one gpufleet checks ({sorted(RULES['strategy_config'])})"]
    errors = [f"{where}: {k} is not a {name} key" for k in config if k not in kinds]
    errors += [f"{where}: {k} {v!r} is not a Go {kinds[k]}" for k, v in config.items() if k in kinds and not _parses(kinds[k], v)]
    for rule in RULES["strategy_required"][name]:
        (mode, keys), = rule.items()
        present = [k for k in keys if config.get(k)]
        if not present or (mode == "exactly_one" and len(present) > 1):
            errors.append(f"{where}: needs {mode.replace('_', ' ')} {keys}")
    return errors


def policy_errors(doc: Mapping[str, object], agent: Mapping[str, object]) -> list[str]:
    """A file policy (``scaling`` blocks) as the agent loading it would judge it: decodePolicyDoc
    (durations; empty type means cluster), ScalingPolicy.Validate (type, on_check_error/on_error,
    a check, a strategy per check, no app-sizing on cluster policies), Processor.ValidatePolicy
    (0 <= min <= max), the check's APM and strategy and the target named as plugins the agent
    config declares, and each plugin's own config rules."""
    errors: list[str] = []
    declared = {kind: set(agent.get(kind, {})) for kind in ("apm", "strategy", "target")}
    for name, scaling in doc["scaling"].items():  # type: ignore[union-attr]
        kind = scaling.get("type") or "cluster"
        if kind not in RULES["policy_types"]:
            errors.append(f"{name}: type {kind!r} not in {RULES['policy_types']}")
        low, high = scaling.get("min", 0), scaling.get("max")
        if not isinstance(high, int) or not isinstance(low, int) or not 0 <= low <= high:
            errors.append(f"{name}: min {low!r} / max {high!r} (0 <= min <= max)")
        body = scaling.get("policy", {})
        if body.get("on_check_error", "") not in ("", *RULES["on_error_values"]):
            errors.append(f"{name}: on_check_error {body['on_check_error']!r} not in {RULES['on_error_values']}")
        checks = body.get("check", {})
        if not checks:
            errors.append(f"{name}: no checks")
        for field in RULES["duration_fields"]:
            for place in [body, *checks.values()]:
                if field in place and not _parses("duration", place[field]):
                    errors.append(f"{name}: {field} {place[field]!r} is not a Go duration")
        for check_name, check in checks.items():
            where = f"{name}/check {check_name}"
            strategies = check.get("strategy", {})
            if len(strategies) != 1:
                errors.append(f"{where}: needs exactly one strategy")
            for strategy, config in strategies.items():
                if kind in ("cluster", "horizontal") and strategy.startswith("app-sizing"):
                    errors.append(f"{where}: app-sizing strategy on a {kind} policy")
                if strategy not in declared["strategy"]:
                    errors.append(f"{where}: strategy {strategy!r} is not declared in the agent config")
                errors += strategy_errors(where, strategy, config)
            if check.get("on_error", "") not in ("", *RULES["on_error_values"]):
                errors.append(f"{where}: on_error {check['on_error']!r} not in {RULES['on_error_values']}")
            # An empty source means the built-in nomad-apm (policy/policy.go CanonicalizeCheck).
            if check.get("source") not in declared["apm"]:
                errors.append(f"{where}: source {check.get('source')!r} is not an apm declared in the agent config")
            if not check.get("query"):
                errors.append(f"{where}: no query")
        targets = body.get("target", {})
        if len(targets) != 1:
            errors.append(f"{name}: needs exactly one target")
        for target, config in targets.items():
            if target not in declared["target"]:
                errors.append(f"{name}: target {target!r} is not declared in the agent config")
            errors += target_errors(f"{name}/target {target}", config)
    return errors


def agent_errors(agent: Mapping[str, object]) -> list[str]:
    """The agent config: every duration field a Go duration (agent/config/config.go), the
    Prometheus APM's config (address required, skip_verify a bool, only keys it reads)."""
    errors: list[str] = []

    def walk(node: object, path: str) -> None:
        if isinstance(node, Mapping):
            for key, value in node.items():
                if key in RULES["agent_duration_fields"] and not _parses("duration", value):
                    errors.append(f"{path}{key} {value!r} is not a Go duration")
                walk(value, f"{path}{key}.")

    walk(agent, "")
    prom = RULES["prometheus_apm"]
    for name, plugin in agent.get("apm", {}).items():  # type: ignore[union-attr]
        if plugin.get("driver") != "prometheus":
            continue
        config = plugin.get("config", {})
        errors += [f"apm {name}: {k} required" for k in prom["required"] if not config.get(k)]
        errors += [f"apm {name}: {k} {config[k]!r} is not a Go bool" for k in prom["bool"] if k in config and not _parses("bool", config[k])]
        errors += [f"apm {name}: {k} is not a key the prometheus APM reads" for k in config
                   if k not in prom["keys"] and not k.startswith("header_")]
    return errors
