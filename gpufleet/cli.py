"""The operator CLI: ``gpufleet <command>``.

Command modules are imported at start-up, so they must stay cheap to import: anything that
loads cdktf, providers, hvac or python-nomad is imported inside the command function.
User errors (ConfigError, UserError) become one line per problem on stderr and exit 2.
SIGTERM unwinds a command as Ctrl-C does (``clusters.termination``) and exits 143.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import replace
from pathlib import Path
from typing import NoReturn

import click

import typer

import clusters.repo

from clusters.errors import ConfigError, Problem, UserError
from clusters.termination import EXIT_INTERRUPTED, EXIT_TERMINATED, Terminated, exit_now, sigterm_unwinds
from gpufleet import doctor_cmd, exp_cmd, fleet_cmd, jobs_cmd, nomad_cmd, ops_cmd, preview_cmd, serve_cmd, vault_cmd

app = typer.Typer(
    name="gpufleet",
    help="A GPU training fleet as code: clusters, stacks, Nomad fine-tune jobs and Vault keys.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root(
    repo: Path | None = typer.Option(
        None, "--repo", help="The gpufleet repository to act on (default: the one around the current directory)."),
) -> None:
    """Every command acts on one repository: ``--repo``, else the nearest directory above the current one
    holding cdktf.json and clusters/; never the checkout gpufleet was installed from."""
    clusters.repo.use(repo)


fleet_cmd.register(app)
ops_cmd.register(app)
preview_cmd.register(app)
vault_cmd.register(app)
jobs_cmd.register(app)
nomad_cmd.register(app)
serve_cmd.register(app)
exp_cmd.register(app)
doctor_cmd.register(app)

EXIT_USER_ERROR = 2


@functools.cache
def _command() -> click.Command:
    """The click command typer builds from ``app``, built once: ``app(...)`` rebuilds it on every call,
    which is most of an in-process call's cost (the test suites call ``main`` hundreds of times)."""
    return typer.main.get_command(app)


def _relative(problem: Problem) -> Problem:
    """The problem with its file relative to the repository root, as the docs show paths
    (``clusters/prod-gke.yaml:33``); a file outside the repository keeps its path."""
    root = clusters.repo.root_or_none()
    path = Path(problem.file)
    if root is None or not path.is_absolute() or not path.is_relative_to(root):
        return problem
    return replace(problem, file=str(path.relative_to(root)))


def main(argv: list[str] | None = None) -> int:
    try:
        with sigterm_unwinds():
            rc = _command()(args=argv, standalone_mode=False)
    except Terminated:
        print("terminated", file=sys.stderr)
        return EXIT_TERMINATED
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"error: {_relative(problem)}", file=sys.stderr)
        for step in exc.skipped:
            print(f"skipped: {step}: fix the errors above first", file=sys.stderr)
        return EXIT_USER_ERROR
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        print("aborted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except typer.TyperException as exc:  # usage errors: unknown command, bad option value
        show = getattr(exc, "show", None)
        if show is None:
            raise
        show()
        return getattr(exc, "exit_code", EXIT_USER_ERROR)
    return rc if isinstance(rc, int) else 0


def run() -> NoReturn:
    """The ``gpufleet`` command (pyproject's script): ``main``, then, in a process that ran a synthesis (its
    jsii kernel started), an exit without the interpreter's teardown (``clusters.termination.exit_now``:
    0.1-0.15 s of freeing memory at 100 clusters); any other command exits as usual."""
    code = main()
    from constructs_lib import jsii_runtime

    if jsii_runtime.kernel_running():
        exit_now(code)
    sys.exit(code)


if __name__ == "__main__":
    run()
