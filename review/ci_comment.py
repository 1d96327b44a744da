"""One pull-request comment for all stacks, built from the per-stack summaries the plan gate wrote.

The first line is a fixed marker so the workflow finds and updates its own comment instead of
adding one per push. Stacks are listed in name order with one icon each; per-stack details are
folded so a forty-stack fleet still reads as one table.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from clusters.errors import UserError

MARKER = "<!-- gpufleet-plan -->"
MAX_BODY_CHARS = 60_000
"""GitHub refuses comments over 65,536 characters; past this, details are dropped, the table stays."""

ICONS = {"no_changes": "✅", "changes": "🔄", "blocked": "⛔", "error": "❌"}
LABELS = {"no_changes": "no changes", "changes": "changes", "blocked": "destroy blocked", "error": "error"}
ACTIONS = ("create", "update", "replace", "delete", "forget", "import")


def _error(stack: str, message: str) -> dict[str, Any]:
    return {"stack": stack, "status": "error", "error": message}


def load_expected(path: Path | None) -> tuple[str, ...]:
    """Stack names from `gpufleet stacks --json` output (objects with "stack") or a plain JSON list of names."""
    if path is None:
        return ()
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"--expected {path}: unreadable ({exc.__class__.__name__}); pass the output of `gpufleet stacks --json`") from None
    names = [row.get("stack") if isinstance(row, dict) else row for row in rows] if isinstance(rows, list) else None
    if names is None or not all(isinstance(n, str) for n in names):
        raise UserError(f"--expected {path}: expected a JSON list of stack names or `gpufleet stacks --json` rows")
    return tuple(names)


def load_summaries(directory: Path, expected: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Every ``*.json`` summary below ``directory`` (artifact downloads nest one dir per artifact).

    An unreadable summary, or an expected stack without one (its job died before the gate
    ran), becomes an error row: a stack must never silently drop out of the comment.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise UserError(f"{directory}: summaries directory not found; pass the directory the plan artifacts were downloaded to")
    by_stack: dict[str, dict[str, Any]] = {}
    for path in sorted(directory.rglob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            by_stack[path.stem] = _error(path.stem, f"unreadable summary {path.name}")
            continue
        if not isinstance(data, dict) or data.get("status") not in ICONS or not isinstance(data.get("stack"), str):
            by_stack[path.stem] = _error(path.stem, f"{path.name} is not a gpufleet plan summary")
            continue
        by_stack[data["stack"]] = data
    for stack in expected:
        by_stack.setdefault(stack, _error(stack, "no summary: the job failed before the plan gate ran; see the job log"))
    return [by_stack[s] for s in sorted(by_stack)]


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _totals(summary: dict[str, Any]) -> dict[str, int]:
    totals = dict.fromkeys(ACTIONS, 0)
    for row in summary.get("counts", {}).values():
        for action in ACTIONS:
            totals[action] += int(row.get(action, 0))
    return totals


def _details(summary: dict[str, Any]) -> str:
    stack, status = summary["stack"], summary["status"]
    if status == "error":
        return f"<details><summary>{stack}: error</summary>\n\n```\n{summary.get('error', 'unknown error')}\n```\n\n</details>"
    changes = summary.get("changes", [])
    if not changes:
        return ""
    lines = [f"<details><summary>{stack}: {len(changes)} resource change(s)</summary>", "", "| action | address | |", "|---|---|---|"]
    for change in changes:
        action = change["action"] + (" + import" if change.get("importing") else "")
        flag = "⛔ blocked" if change.get("blocked") else ("allowed (--allow-destroy)" if change.get("allowed") else "")
        lines.append(f"| {action} | `{_cell(change['address'])}` | {flag} |")
    if summary.get("outputs_changed"):
        lines.append(f"\n{summary['outputs_changed']} output(s) change.")
    if summary.get("note"):
        lines.append(f"\n_{_cell(summary['note'])}_")
    return "\n".join([*lines, "", "</details>"])


def _result(summary: dict[str, Any]) -> str:
    status = summary["status"]
    if status == "blocked":
        return "destroy blocked: " + ", ".join(f"`{_cell(a)}`" for a in summary.get("blocked", []))
    if status == "error":
        return "error: " + _cell(summary.get("error", "unknown error"))[:200]
    return LABELS[status]


def load_preview(path: Path) -> str:
    """The markdown section of a ``gpufleet preview --json-out`` report; a missing or bad file says so in the comment."""
    from preview.report import FORMAT_VERSION, markdown

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return "### gpufleet preview\n\n❌ no preview report: the preview job failed before writing it; see its log\n"
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return f"### gpufleet preview\n\n❌ unreadable preview report {Path(path).name}\n"
    if not isinstance(data, dict) or data.get("format_version") != FORMAT_VERSION:
        return f"### gpufleet preview\n\n❌ {Path(path).name} is not a gpufleet preview report (format {FORMAT_VERSION})\n"
    return markdown(data)


def build_comment(summaries: list[dict[str, Any]], *, title: str = "gpufleet plan", preview: str | None = None) -> str:
    """The whole comment body, marker first; deterministic for the same summaries.

    ``preview`` (markdown from ``load_preview``) goes first, above the plan table: the
    reviewer reads what the PR destroys before the per-stack details.
    """
    counts = {status: sum(1 for s in summaries if s["status"] == status) for status in ICONS}
    headline = ", ".join(f"{ICONS[s]} {n} {LABELS[s]}" for s, n in counts.items() if n) or "no stacks"
    table = [f"| | stack | result | {' | '.join(ACTIONS)} |", "|---|---|---|" + "---:|" * len(ACTIONS)]
    for summary in summaries:
        totals = _totals(summary)
        numbers = " | ".join(str(totals[a]) if summary["status"] != "error" else "-" for a in ACTIONS)
        table.append(f"| {ICONS[summary['status']]} | `{_cell(summary['stack'])}` | {_result(summary)} | {numbers} |")
    footer = []
    if counts["blocked"]:
        footer.append(
            "A blocked stack deletes or replaces a protected resource (GPU pool, cluster, static IP, reviewed import). "
            "If that is intended, plan it again with `gpufleet plan <stack> --allow-destroy <stack>/<address>` and say why in the PR."
        )
    footer.append("This workflow only plans; it never applies.")
    head = [MARKER, f"## {title}", "", *([preview.rstrip("\n"), ""] if preview else []),
            f"**{len(summaries)} stack(s):** {headline}", "", *table, ""]
    details = [d for d in (_details(s) for s in summaries) if d]
    body = "\n".join([*head, *details, "", *footer]) + "\n"
    if len(body) > MAX_BODY_CHARS:
        note = "_Details are too long for one comment; read them in the workflow's plan artifacts._"
        body = "\n".join([*head, note, "", *footer]) + "\n"
    return body
