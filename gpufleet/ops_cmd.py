"""Safety and operations commands: plan, gate, scan, ci comment, import generate/apply.

Exit codes of ``plan`` and ``gate``: 0 no changes, 1 terraform failed, 2 user error
(bad arguments, unknown stack, missing or malformed plan), 3 changes the gate allows,
4 blocked (a protected resource would be deleted or replaced).
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.console import Console

from clusters.errors import ConfigError, UserError

console = Console()

EXIT_CODES_HELP = "Exit codes: 0 no changes, 1 terraform failed, 2 user error, 3 changes, 4 blocked."

_ALLOW = typer.Option([], "--allow-destroy", help="Exact address whose delete/replace is allowed (repeatable).")
_PROTECT = typer.Option([], "--protected-type", help="Also protect this resource type (repeatable); adds to the defaults.")
_SUMMARY = typer.Option(None, "--summary-out", help="Write the per-stack summary JSON here (read by `gpufleet ci comment`).")


def _gate(plan_path: Path, stack: str, allow: list[str], extra_types: list[str], summary_out: Path | None) -> None:
    from gpufleet.safety import imports, plan_gate, report

    protected_addresses = frozenset(imports.load_imports(stack)) if stack else frozenset()
    result = plan_gate.classify(
        plan_gate.load_plan(plan_path),
        path=plan_path,
        protected=plan_gate.protected_types(extra_types),
        protected_addresses=protected_addresses,
        allow_destroy=allow,
    )
    if summary_out is not None:
        plan_gate.write_summary(summary_out, plan_gate.summary(stack or plan_path.stem, result))
    report.render(console, stack or str(plan_path), result)
    raise typer.Exit(int(result.exit_code))


def _write_error(summary_out: Path | None, stack: str, message: str) -> None:
    from gpufleet.safety import plan_gate

    if summary_out is not None:
        plan_gate.write_summary(summary_out, plan_gate.error_summary(stack, message))


def cmd_plan(
    stack: str = typer.Argument(..., help="Stack name (a directory under <out-dir>/stacks)."),
    allow_destroy: list[str] = _ALLOW,
    protected_type: list[str] = _PROTECT,
    summary_out: Path | None = _SUMMARY,
    out_dir: Path = typer.Option(Path("cdktf.out"), "--out-dir", help="Synthesized output directory."),
    lock: bool = typer.Option(True, "--lock/--no-lock", help="Take the state lock; CI plans with read-only credentials pass --no-lock."),
) -> None:
    """terraform init + plan + show -json in the synthesized stack, then gate the plan."""
    from gpufleet.safety import plan_gate, terraform

    try:
        directory = terraform.stack_dir(out_dir, stack)
        plan_path = terraform.plan_json(directory, lock=lock)
        _gate(plan_path, stack, allow_destroy, protected_type, summary_out)
    except terraform.TerraformFailed as exc:
        _write_error(summary_out, stack, str(exc))
        print(exc.stderr, file=sys.stderr)
        print(f"error: {exc}", file=sys.stderr)
        raise typer.Exit(int(plan_gate.ExitCode.TERRAFORM_FAILED)) from None
    except (UserError, ConfigError) as exc:
        _write_error(summary_out, stack, str(exc))
        raise


def cmd_gate(
    plan: Path = typer.Argument(..., help="Plan JSON from `terraform show -json <planfile>`."),
    stack: str = typer.Option("", "--stack", help="Stack name: labels the summary and protects its reviewed imports."),
    allow_destroy: list[str] = _ALLOW,
    protected_type: list[str] = _PROTECT,
    summary_out: Path | None = _SUMMARY,
) -> None:
    """Gate a plan produced elsewhere (CI, Terraform Cloud)."""
    try:
        _gate(plan, stack, allow_destroy, protected_type, summary_out)
    except (UserError, ConfigError) as exc:
        _write_error(summary_out, stack or plan.stem, str(exc))
        raise


def register(app: typer.Typer) -> None:
    app.command("plan", epilog=EXIT_CODES_HELP)(cmd_plan)
    app.command("gate", epilog=EXIT_CODES_HELP)(cmd_gate)
