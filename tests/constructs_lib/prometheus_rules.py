"""What Prometheus' rule loader (and ``promtool check rules``) accepts, for the rule files gpufleet prints.

Read from prometheus/prometheus v3.14.0 ``model/rulefmt/rulefmt.go``:

- ``Parse`` (:343-381) decodes with ``KnownFields(true)`` unless told to ignore unknown fields, so a key
  outside the structs below is an error; ``RuleGroups`` (:93) has only ``groups``.
- ``RuleGroup`` (:159-166): ``name``, ``interval``, ``query_offset``, ``limit``, ``rules``, ``labels``;
  ``Validate`` (:101-135): a non-empty, unique ``name``, valid label names (not ``__name__``) and values.
- ``Rule`` (:180-188): ``record``, ``alert``, ``expr``, ``for``, ``keep_firing_for``, ``labels``,
  ``annotations``; ``Rule.Validate`` (:202-285): exactly one of ``record``/``alert`` (:203-214),
  ``expr`` set (:217-221) and parsed by the PromQL parser (:222-226), valid label and annotation names.
  ``testTemplateParsing`` parses labels and annotations as Go templates; here only their ``{{ }}``
  balance is checked.
- ``for`` and ``keep_firing_for`` are ``model.Duration``: prometheus/common v0.70.1 (the version
  Prometheus v3.14.0's go.mod requires) ``model/time.go:183-250`` ``ParseDuration``: ``0``, or
  ``<digits><unit>`` pairs with units ``y w d h m s ms`` in that order, each at most once.

Label names are checked with the legacy ``[a-zA-Z_][a-zA-Z0-9_]*``: stricter than v3's UTF-8 default, so
a file that passes here loads with either validation scheme. The PromQL is parsed with promql-parser
(GreptimeTeam's Rust port of Prometheus' parser).
"""

from __future__ import annotations

import re

import promql_parser

_GROUP_KEYS = {"name", "interval", "query_offset", "limit", "rules", "labels"}
_RULE_KEYS = {"record", "alert", "expr", "for", "keep_firing_for", "labels", "annotations"}
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_UNITS = ["y", "w", "d", "h", "m", "s", "ms"]  # prometheus/common model/time.go:187-193, biggest first


def duration_ok(text: object) -> bool:
    """prometheus/common v0.70.1 model.ParseDuration: "0", or digit/unit pairs, units strictly descending."""
    if not isinstance(text, str) or text == "":
        return False
    if text == "0":
        return True
    if not re.fullmatch(r"(?:[0-9]+[^0-9]+)+", text):
        return False
    last = -1
    for _, unit in re.findall(r"([0-9]+)([^0-9]+)", text):
        if unit not in _UNITS or _UNITS.index(unit) <= last:
            return False
        last = _UNITS.index(unit)
    return True


def _names(mapping: object, where: str, *, allow_name_label: bool) -> list[str]:
    if mapping is None:
        return []
    if not isinstance(mapping, dict):
        return [f"{where}: not a mapping"]
    errors = [f"{where}: invalid name {k!r}" for k in mapping
              if not isinstance(k, str) or not _LABEL_NAME.fullmatch(k) or (k == "__name__" and not allow_name_label)]
    errors += [f"{where}.{k}: not a string" for k, v in mapping.items() if not isinstance(v, str)]
    errors += [f"{where}.{k}: unbalanced template braces" for k, v in mapping.items()
               if isinstance(v, str) and v.count("{{") != v.count("}}")]
    return errors


def rule_file_errors(data: object) -> list[str]:
    """Every reason Prometheus would refuse this rule file (already YAML-decoded); empty when it loads."""
    if not isinstance(data, dict) or set(data) != {"groups"} or not isinstance(data["groups"], list):
        return ["top level: exactly one key, groups, a list"]
    errors: list[str] = []
    seen: set[str] = set()
    for g, group in enumerate(data["groups"]):
        where = f"groups[{g}]"
        if not isinstance(group, dict):
            errors.append(f"{where}: not a mapping")
            continue
        errors += [f"{where}: unknown field {k!r}" for k in set(group) - _GROUP_KEYS]
        name = group.get("name")
        if not isinstance(name, str) or not name:
            errors.append(f"{where}: Groupname must not be empty")
        elif name in seen:
            errors.append(f"{where}: groupname {name!r} is repeated in the same file")
        else:
            seen.add(name)
        errors += [f"{where}.{k}: not a valid duration" for k in ("interval", "query_offset") if k in group and not duration_ok(group[k])]
        errors += _names(group.get("labels"), f"{where}.labels", allow_name_label=False)
        rules = group.get("rules")
        if not isinstance(rules, list):
            errors.append(f"{where}.rules: not a list")
            continue
        for r, rule in enumerate(rules):
            errors += _rule_errors(rule, f"{where}.rules[{r}]")
    return errors


def _rule_errors(rule: object, where: str) -> list[str]:
    if not isinstance(rule, dict):
        return [f"{where}: not a mapping"]
    errors = [f"{where}: unknown field {k!r}" for k in set(rule) - _RULE_KEYS]
    if ("record" in rule) == ("alert" in rule):
        errors.append(f"{where}: one of 'record' or 'alert' must be set, not both")
    if "alert" in rule and (not isinstance(rule["alert"], str) or not rule["alert"]):
        errors.append(f"{where}.alert: empty")
    if "record" in rule:
        errors += [f"{where}: invalid field {k!r} in recording rule" for k in ("for", "keep_firing_for", "annotations") if k in rule]
    expr = rule.get("expr")
    if not isinstance(expr, str) or not expr.strip():
        errors.append(f"{where}: field 'expr' must be set in rule")
    else:
        try:
            promql_parser.parse(expr)
        except ValueError as exc:
            errors.append(f"{where}.expr: could not parse expression: {exc}")
    errors += [f"{where}.{k}: not a valid duration: {rule[k]!r}" for k in ("for", "keep_firing_for") if k in rule and not duration_ok(rule[k])]
    errors += _names(rule.get("labels"), f"{where}.labels", allow_name_label=False)
    errors += _names(rule.get("annotations"), f"{where}.annotations", allow_name_label=True)
    return errors
