"""Render a preview: terminal lines, the JSON for machines and the PR comment's markdown section."""

from __future__ import annotations

import json
from typing import Any

from preview.diff import Finding, Kind, PreviewResult

FORMAT_VERSION = 1


def _value(value: Any) -> str:
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else value
    return text if len(text) <= 80 else text[:77] + "..."


def describe(finding: Finding) -> str:
    """One line: what happens to the resource and why."""
    where = f"{finding.stack}: {finding.address}"
    if finding.kind == Kind.DESTROYED:
        text = f"{where} is destroyed"
    elif finding.kind == Kind.REPLACED:
        changed = "; ".join(f"{c.path}: {_value(c.old)} -> {_value(c.new)}" for c in finding.changes)
        text = f"{where} is replaced (immutable: {changed})"
    elif finding.kind == Kind.RENAMED:
        text = f"{where} is renamed to {finding.new_address}"
    else:
        text = f"{where}: reviewed import record removed"
    return text


def to_json(result: PreviewResult, info: dict[str, str]) -> dict[str, Any]:
    return {
        "format_version": FORMAT_VERSION,
        "base": info,
        "exit_code": int(result.exit_code),
        "blocking": [f.qualified for f in result.blocking],
        "stacks": [
            {
                "stack": s.stack, "status": s.status, "created": s.created, "updated_in_place": s.updated_in_place,
                "replaced": s.replaced, "destroyed": s.destroyed, "no_forcenew_table": list(s.no_table),
                "findings": [
                    {"kind": f.kind.value, "address": f.address, "type": f.type, "protected": f.protected,
                     "why_protected": f.why_protected, "allowed": f.allowed, "blocking": f.blocking, "new_address": f.new_address,
                     "advice": f.advice,
                     "changes": [{"path": c.path, "old": c.old, "new": c.new, "forces_replacement": c.forces_replacement,
                                  "source": c.rule} for c in f.changes]}
                    for f in s.findings
                ],
            }
            for s in result.stacks
        ],
    }


def text_lines(result: PreviewResult, info: dict[str, str]) -> list[str]:
    lines = [f"preview against {info.get('ref')} ({info.get('commit', '')[:12]}, base synthesis cache: {info.get('cache')})"]
    if info.get("note"):
        lines.append(f"note: {info['note']}")
    for finding in result.findings:
        tag = "BLOCKED" if finding.blocking else ("allowed" if finding.allowed else ("protected" if finding.protected else "note"))
        protection = f" [{finding.why_protected}]" if finding.protected else " [not protected]"
        lines.append(f"{tag}: {describe(finding)}{protection}")
        if finding.advice:
            lines.append(f"    {finding.advice}")
    for s in result.stacks:
        if s.status == "unchanged":
            continue
        counts = f"{s.created} to create, {s.updated_in_place} in place, {s.replaced} replaced, {s.destroyed} destroyed"
        lines.append(f"stack {s.stack} ({s.status}): {counts}")
        if s.no_table:
            lines.append(f"    no ForceNew table for {', '.join(s.no_table)}: whether those updates replace is unknown")
    verdict = {0: "no changes", 3: "changes, nothing protected is destroyed or replaced", 4: "BLOCKED: protected resources are destroyed or replaced"}
    lines.append(f"preview: {verdict[int(result.exit_code)]}")
    if result.blocking:
        lines.append("to go ahead on purpose, name each with --allow-destroy <stack>/<address> and say why in the PR")
    return lines


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def markdown(data: dict[str, Any]) -> str:
    """The PR comment's top section, from the JSON of ``to_json`` (what CI passes between jobs)."""
    stacks = data.get("stacks", [])
    findings = [(s["stack"], f) for s in stacks for f in s["findings"]]
    blocking = [(s, f) for s, f in findings if f["blocking"]]
    destructive = [(s, f) for s, f in findings if f["kind"] in ("destroyed", "replaced", "renamed")]
    protected = [(s, f) for s, f in destructive if f["protected"]]
    base = data.get("base", {})
    head = f"### gpufleet preview (offline, against `{_cell(base.get('ref', '?'))}`)"
    if protected:
        names = ", ".join(f"`{s}/{f['address']}` ({f['kind']})" for s, f in protected)
        icon = "⛔" if blocking else "⚠️"
        summary = f"{icon} **this PR destroys or replaces {len(protected)} protected resource(s):** {names}"
    elif destructive:
        summary = f"🔄 this PR destroys or replaces {len(destructive)} resource(s), none of them protected"
    elif any(s["status"] != "unchanged" for s in stacks):
        summary = "✅ nothing protected is destroyed or replaced"
    else:
        summary = "✅ no changes"
    lines = [head, "", summary, ""]
    if findings:
        lines += ["| | stack | resource | what happens | protected |", "|---|---|---|---|---|"]
        for stack, f in findings:
            icon = "⛔" if f["blocking"] else ("✔️ allowed" if f["allowed"] else "")
            what = f["kind"] + (f" → `{f['new_address']}`" if f.get("new_address") else "")
            if f["kind"] == "replaced":
                what += ": " + "; ".join(f"`{c['path']}` {_value(c['old'])} → {_value(c['new'])}" for c in f["changes"])
            lines.append(f"| {icon} | `{_cell(stack)}` | `{_cell(f['address'])}` | {_cell(what)} | "
                         f"{_cell(f['why_protected']) if f['protected'] else 'no'} |")
        lines.append("")
        for stack, f in findings:
            if f["advice"] and (f["protected"] or f["kind"] == "renamed"):
                lines.append(f"- `{_cell(stack)}/{_cell(f['address'])}`: {_cell(f['advice'])}")
        lines.append("")
    changed = [s for s in stacks if s["status"] != "unchanged"]
    if changed:
        lines.append("In place per stack: " + ", ".join(
            f"`{s['stack']}` {s['status']}: +{s['created']} ~{s['updated_in_place']} ±{s['replaced']} -{s['destroyed']}" for s in changed))
        lines.append("")
    if blocking:
        lines.append("If intended: `gpufleet preview --allow-destroy <stack>/<address>` and say why in the PR; "
                     "`gpufleet plan <stack> --allow-destroy <stack>/<address>` for the plan.")
        lines.append("")
    return "\n".join(lines)
