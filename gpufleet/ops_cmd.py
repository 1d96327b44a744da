"""Safety and operations commands: plan, gate, scan, ci comment, import generate/apply.

Exit codes of ``plan`` and ``gate``: 0 no changes, 1 terraform failed, 2 user error
(bad arguments, unknown stack, missing or malformed plan), 3 changes the gate allows,
4 blocked (a protected resource would be deleted or replaced). ``scan`` exits 1 on any finding.
Planning and gating live in ``safety.stack_plan``, the PR comment's inputs in ``review.ci_comment``;
these commands parse, call and print.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import typer
from gpufleet.console import make_console

from clusters.errors import ConfigError, UserError

if TYPE_CHECKING:
    from safety.plan_gate import GateResult

console = make_console()

EXIT_CODES_HELP = "Exit codes: 0 no changes, 1 terraform failed, 2 user error, 3 changes, 4 blocked."

_ALLOW = typer.Option(
    [],
    "--allow-destroy",
    help=(
        "<stack>/<address> whose delete/replace is allowed (repeatable; a bare address is refused). `plan` then plans a "
        "copy of the stack with lifecycle.prevent_destroy lifted for exactly these addresses; applying still needs a reviewed change "
        "(e.g. `protected: false` in the cluster file), because the synthesized stack keeps prevent_destroy."
    ),
)
_GATE_ALLOW = typer.Option(
    [],
    "--allow-destroy",
    help=(
        "<stack>/<address> whose delete/replace in this plan is allowed (repeatable; needs --stack, a bare address is"
        " refused): the gate reports it as allowed"
        " instead of blocked. It changes nothing in the plan; applying still needs a reviewed change that lifts"
        " prevent_destroy (e.g. `protected: false` in the cluster file)."
    ),
)
_PROTECT = typer.Option([], "--protected-type", help="Also protect this resource type (repeatable); adds to the defaults.")
_SUMMARY = typer.Option(None, "--summary-out", help="Write the per-stack summary JSON here (read by `gpufleet ci comment`).")


def _finish(result: GateResult, stack: str, title: str, summary_out: Path | None, note: str | None = None, scoped: bool = True) -> NoReturn:
    """Summary, report and exit; ``scoped`` False: the stack is only a label (``gate`` without ``--stack``)."""
    from safety import plan_gate, report

    if summary_out is not None:
        plan_gate.write_summary(summary_out, plan_gate.summary(stack, result, note=note))
    report.render(console, title, result, stack if scoped else "")
    if note:
        console.print(f"[yellow]note[/yellow]: {note}", soft_wrap=True)
    raise typer.Exit(int(result.exit_code))


def _write_error(summary_out: Path | None, stack: str, message: str) -> None:
    from safety import plan_gate

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
    """terraform init + plan + show -json in the synthesized stack, then gate the plan.

    Resources with lifecycle.prevent_destroy are protected whatever their type; when terraform
    refuses the plan on them, their addresses are reported as blocked (exit 4).
    """
    from safety import plan_gate, terraform
    from safety.stack_plan import plan_stack

    try:
        planned = plan_stack(out_dir, stack, allow_destroy=allow_destroy, extra_types=protected_type, lock=lock)
        _finish(planned.result, stack, stack, summary_out, planned.note)
    except terraform.TerraformFailed as exc:
        _write_error(summary_out, stack, str(exc))
        print(exc.stderr or exc.stdout, file=sys.stderr)
        print(f"error: {exc}", file=sys.stderr)
        raise typer.Exit(int(plan_gate.ExitCode.TERRAFORM_FAILED)) from None
    except (UserError, ConfigError) as exc:
        _write_error(summary_out, stack, str(exc))
        raise


def cmd_gate(
    plan: Path = typer.Argument(..., help="Plan JSON from `terraform show -json <planfile>`."),
    stack: str = typer.Option("", "--stack", help="Stack name: labels the summary and protects its reviewed imports."),
    allow_destroy: list[str] = _GATE_ALLOW,
    protected_type: list[str] = _PROTECT,
    summary_out: Path | None = _SUMMARY,
) -> None:
    """Gate a plan produced elsewhere (CI, Terraform Cloud)."""
    from safety.stack_plan import gate

    try:
        _finish(gate(plan, stack, allow_destroy, protected_type), stack or plan.stem, stack or str(plan), summary_out, scoped=bool(stack))
    except (UserError, ConfigError) as exc:
        _write_error(summary_out, stack or plan.stem, str(exc))
        raise


def cmd_scan(
    paths: list[Path] = typer.Argument(None, help="Files or directories (every *.json below); default: cdktf.out jobs/out."),
    state: list[Path] = typer.Option([], "--state", help="State JSON (`terraform show -json`) to scan too (repeatable)."),
) -> None:
    """Find secret values in synthesized JSON, rendered jobs and state. Exit 1 when any is found; values are never printed."""
    from rich.table import Table

    from safety import secret_scan

    targets = secret_scan.scan_targets(paths or (), state)
    findings = secret_scan.scan_paths(targets)
    if not findings:
        console.print("secret scan: no secret values found")
        return
    table = Table(title=f"secret scan: {len(findings)} finding(s)")
    for column in ("file", "JSON path", "kind", "value (masked)"):
        table.add_column(column, overflow="fold")
    for finding in findings:
        table.add_row(finding.file, finding.path, finding.kind, finding.masked)
    console.print(table)
    console.print("move the value to Vault or the environment and reference it; rotate it: it has been written to disk")
    raise typer.Exit(1)


def cmd_ci_comment(
    directory: Path = typer.Argument(..., help="Directory holding the per-stack summaries (downloaded artifacts)."),
    expected: Path | None = typer.Option(None, "--expected", help="`gpufleet stacks --json` output: stacks without a summary show as errors."),
    out: Path | None = typer.Option(None, "--out", help="Write the comment here instead of stdout."),
    title: str = typer.Option("gpufleet plan", "--title", help="Heading (the drift workflow uses 'gpufleet drift')."),
    preview: Path | None = typer.Option(None, "--preview", help="`gpufleet preview --json-out` report: its section goes on top."),
) -> None:
    """Build the one PR comment (marker line, an icon per stack, folded details) from plan summaries."""
    from review import ci_comment

    body = ci_comment.build_comment(ci_comment.load_summaries(directory, ci_comment.load_expected(expected)), title=title,
                                    preview=ci_comment.load_preview(preview) if preview is not None else None)
    if out is None:
        sys.stdout.write(body)
    else:
        from clusters import outputs
        from review.ci_comment import MARKER

        outputs.write_file(out, body, option="--out", owned=outputs.starts_with(MARKER))


_CLUSTERS = typer.Option(None, "--clusters-dir", help="Directory of cluster files (default: clusters/).")


def cmd_ci_nomad_tls(
    stack: str = typer.Argument(..., help="The Nomad scheduler stack the job plans (its cluster's entry of NOMAD_PLAN_TLS)."),
    directory: Path = typer.Option(..., "--dir", help="Where the files go (the workflow uses $RUNNER_TEMP/nomad-tls and removes it)."),
    clusters_dir: Path | None = _CLUSTERS,
) -> None:
    """Write the Nomad CA, client certificate and key from the NOMAD_PLAN_TLS secret (masked, 0600) and export their paths."""
    import os

    import clusters
    from gpufleet.ci_nomad_tls import SECRET, write_nomad_tls
    from stacks.layout import plan_stacks

    rows = {s.name: s for s in plan_stacks(clusters.load_all(clusters_dir))}
    row = rows.get(stack)
    if row is None or not row.nomad_tls:
        allowed = ", ".join(sorted(n for n, r in rows.items() if r.nomad_tls)) or "(none)"
        raise UserError(f"stack {stack!r} is not a Nomad scheduler stack planned in CI; allowed: {allowed}")
    env = os.environ.get("GITHUB_ENV")
    write_nomad_tls(cluster=row.cluster, raw=os.environ.get(SECRET, ""), directory=directory,
                    github_env=Path(env) if env else None, emit=typer.echo)


def cmd_import_generate(
    stack: str = typer.Argument(..., help="Stack the resources belong to."),
    ids: Path = typer.Option(..., "--ids", help='JSON object {"<terraform address>": "<provider id>"}.'),
    out: Path | None = typer.Option(None, "--out", help="Manifest path, outside the repository (default: in the temp dir)."),
    clusters_dir: Path | None = _CLUSTERS,
) -> None:
    """Write a reviewed-import manifest for resources that already exist; print its counts and SHA-256."""
    from rich.table import Table

    from safety import imports

    done = imports.generate_for_stack(stack, ids, out=out, clusters_dir=clusters_dir)
    table = Table(title=f"import manifest for {stack}: {len(done.imports)} resource(s)")
    table.add_column("type")
    table.add_column("count", justify="right")
    for kind, n in done.counts_by_type():
        table.add_row(kind, str(n))
    console.print(table)
    console.print(f"manifest: {done.manifest}", soft_wrap=True)
    console.print(f"sha256:   {done.digest}", soft_wrap=True)
    console.print(f"after review: gpufleet import apply {stack} --manifest {done.manifest} --digest {done.digest}", soft_wrap=True)


def cmd_import_apply(
    stack: str = typer.Argument(..., help="Stack the manifest was generated for."),
    manifest: Path = typer.Option(..., "--manifest", help="The manifest `gpufleet import generate` wrote."),
    digest: str = typer.Option(..., "--digest", help="The SHA-256 printed by generate (and reviewed)."),
    clusters_dir: Path | None = _CLUSTERS,
) -> None:
    """Re-derive and verify the manifest, then record the imports; the next synthesis emits import blocks."""
    from safety import imports

    path, ids = imports.apply_for_stack(stack, manifest, digest, clusters_dir=clusters_dir)
    console.print(f"recorded {len(ids)} import(s) for {stack} in {path}", soft_wrap=True)
    console.print(f"commit it; `gpufleet synth` then emits import blocks and `gpufleet plan {stack}` shows them (protected)", soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command("plan", epilog=EXIT_CODES_HELP)(cmd_plan)
    app.command("gate", epilog=EXIT_CODES_HELP)(cmd_gate)
    app.command("scan")(cmd_scan)
    ci = typer.Typer(help="Helpers for the CI workflows.", no_args_is_help=True)
    ci.command("comment")(cmd_ci_comment)
    ci.command("nomad-tls")(cmd_ci_nomad_tls)
    app.add_typer(ci, name="ci")
    importer = typer.Typer(help="Reviewed import of resources that already exist in the cloud.", no_args_is_help=True)
    importer.command("generate")(cmd_import_generate)
    importer.command("apply")(cmd_import_apply)
    app.add_typer(importer, name="import")
