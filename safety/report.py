"""Rich rendering of a gate result: the per-type summary table and the blocked addresses."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from safety.plan_gate import COUNTED, STOPPED_NOTE, GateResult, Status

_STATUS_LINE = {
    Status.NO_CHANGES: "[green]no changes[/green]",
    Status.CHANGES: "[yellow]changes (allowed by the gate)[/yellow]",
    Status.BLOCKED: "[bold red]BLOCKED: the plan deletes or replaces protected resources[/bold red]",
}


def render(console: Console, title: str, result: GateResult, stack: str = "") -> None:
    counts = result.counts()
    if counts:
        table = Table(title=title)
        table.add_column("type", overflow="fold")
        for action in COUNTED:
            table.add_column(action.value, justify="right")
        table.add_column("import", justify="right")
        table.add_column("blocked", justify="right")
        for kind, row in counts.items():
            style = "bold red" if row["blocked"] else None
            table.add_row(kind, *(str(row[a.value]) for a in COUNTED), str(row["import"]), str(row["blocked"]), style=style)
        console.print(table)
    if result.outputs_changed:
        console.print(f"{result.outputs_changed} output(s) change")
    for change in result.blocked:
        console.print(
            f"[bold red]blocked[/bold red] {change.action.value} of protected {change.address}"
            f"{f' ({change.reason})' if change.reason else ''}; to allow it pass "
            f"{f'--allow-destroy {stack}/{change.address}' if stack else f'--stack <stack> --allow-destroy <stack>/{change.address}'}",
            soft_wrap=True,
        )
    if result.stopped_by_terraform:
        console.print(f"[bold red]{STOPPED_NOTE}[/bold red]", soft_wrap=True)
    for change in result.changes:
        if change.allowed:
            console.print(f"[yellow]allowed[/yellow] {change.action.value} of protected {change.address} (--allow-destroy)", soft_wrap=True)
    console.print(f"{title}: {_STATUS_LINE[result.status]}", soft_wrap=True)
