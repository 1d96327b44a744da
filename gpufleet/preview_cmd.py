"""``gpufleet preview``: an offline report of what a change destroys, replaces or renames.

Exit codes (the plan gate's): 0 no changes, 3 changes none of them blocked, 4 a protected
resource is destroyed, replaced or renamed (unless ``--allow-destroy`` names it), 2 user error.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from gpufleet.console import make_console

from clusters.errors import UserError

console = make_console()

EXIT_CODES_HELP = "Exit codes: 0 no changes, 2 user error, 3 changes (nothing protected destroyed or replaced), 4 blocked."


def cmd_preview(
    base: str | None = typer.Option(None, "--base", help="Git ref to compare with (default: the merge base with $GPUFLEET_BASE_REF, else origin/main, else main; none of them existing is an error). A base that resolves to HEAD is refused unless HEAD is already in origin/main; --base HEAD, spelled so, compares the uncommitted edits only."),
    allow_destroy: list[str] = typer.Option([], "--allow-destroy", help="<stack>/<address> whose destroy/replace/rename is "
                                            "intended (repeatable; a bare address is refused)."),
    as_json: bool = typer.Option(False, "--json", help="Print the machine-readable report instead of text."),
    json_out: Path | None = typer.Option(None, "--json-out", help="Also write the JSON report here (`gpufleet ci comment --preview`)."),
    cache_dir: Path | None = typer.Option(None, "--cache-dir", help="Base synthesis cache (default: ~/.cache/gpufleet/preview)."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Synthesize the base again even if cached."),
) -> None:
    """Synthesize the base ref and the working tree offline; report protected resources destroyed, replaced or renamed."""
    import clusters.repo
    from preview import report
    from preview.diff import AllowError
    from preview.service import run_preview

    try:
        result, info = run_preview(clusters.repo.root(), base, allow_destroy=allow_destroy, cache_dir=None if no_cache else cache_dir, use_cache=not no_cache)
    except AllowError as exc:
        raise UserError(str(exc)) from None
    data = report.to_json(result, info)
    if json_out is not None:
        from clusters import outputs

        outputs.write_file(json_out, json.dumps(data, indent=2, sort_keys=True) + "\n", option="--json-out",
                           owned=outputs.json_with_keys("format_version", "base", "stacks"))
    if as_json:
        typer.echo(json.dumps(data, indent=2, sort_keys=True))
    else:
        for line in report.text_lines(result, info):
            console.print(line, markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(int(result.exit_code))


def register(app: typer.Typer) -> None:
    app.command("preview", epilog=EXIT_CODES_HELP)(cmd_preview)
