"""``gpufleet check``: every gate a pull request must pass, in one run and one summary.

Input errors (cluster, job, Vault files) are ConfigErrors: every problem of every file is
collected and reported together, exit 2, and nothing is synthesized. Only valid input is
synthesized; the secret scan and checkov then run on what was written.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

import clusters
from clusters import repo
from clusters.errors import ConfigError, Problem
from clusters.schema import ClusterConfig

if TYPE_CHECKING:
    from datetime import date

    from jobs.spec import FinetuneSpec
    from safety import checkov_scan


@dataclass
class CheckReport:
    rows: list[tuple[str, bool, str]] = field(default_factory=list)
    details: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(passed for _, passed, _ in self.rows)

    def add(self, step: str, passed: bool, summary: str, details: list[str] | None = None) -> None:
        self.rows.append((step, passed, summary))
        self.details.extend(details or ())

    def print(self, console: Console) -> None:
        for line in self.details:
            console.print(line, markup=False, highlight=False)
        table = Table(title="gpufleet check")
        table.add_column("step")
        table.add_column("result")
        table.add_column("summary", overflow="fold")
        for step, passed, summary in self.rows:
            table.add_row(step, "[green]ok[/green]" if passed else "[red]FAILED[/red]", summary)
        console.print(table)


# (accelerator, price kind, region) -> USD per GPU-hour; the CLI passes the control plane's price table
# (experiments/prices.yaml), which this layer cannot import.
GpuPrice = Callable[[str, str, str | None], float]


def validate_inputs(configs: tuple[ClusterConfig, ...] | None = None) -> tuple[tuple[ClusterConfig, ...], tuple[FinetuneSpec, ...]]:
    """Clusters, Vault definitions and job files, cross-checked; raises one ConfigError with all problems."""
    import jobs.loader
    from vault_policies import validate as vault_validate

    problems: list[Problem] = []
    try:
        configs = configs if configs is not None else clusters.load_all()
    except ConfigError as exc:
        problems.extend(exc.problems)
    problems.extend(vault_validate.check(repo.root()))
    specs: tuple[FinetuneSpec, ...] = ()
    if configs is not None and not problems:
        try:
            specs = jobs.loader.load_all(cluster_configs=configs)
        except ConfigError as exc:
            problems.extend(exc.problems)
    if problems:
        # Job files and the operator policies' comparison read the cluster files; run on a broken one
        # they would only repeat its error in other words.
        skipped = ("job files; Vault operator policies vs clusters/",) if configs is None else ()
        raise ConfigError(problems, skipped)
    return configs, specs


def _destroys(report: CheckReport, configs: tuple[ClusterConfig, ...], out: Path | None = None) -> None:
    """What the working tree destroys against the git base.

    With the synthesized ``out``, the full offline preview (``gpufleet preview``: replaced
    immutable attributes too) runs when it is cheap (base cached, or base code = this code);
    otherwise the simple form (removed cluster files, renamed protected pools, safety.destroys).
    """
    from clusters.errors import UserError
    from safety import destroys

    if out is not None:
        from preview import report as preview_report
        from preview.service import cheap_preview

        try:
            found_preview = cheap_preview(repo.root(), out)
        except (UserError, ConfigError):
            found_preview = None  # a base that does not synthesize with this code: the simple form below still runs
        if found_preview is not None:
            result, info = found_preview
            blocking = result.blocking
            lines = [line for line in preview_report.text_lines(result, info)[1:-1] if not line.startswith("to go ahead")]
            vs = f"{info['commit'][:12]} (gpufleet preview)" + (f" ({info['note']})" if info.get("note") else "")
            report.add("destroys", not blocking, f"{len(blocking)} protected resource(s) destroyed, replaced or renamed vs {vs}"
                       if blocking else f"none vs {vs}",
                       [f"preview: {line.strip()}" for line in lines if line.startswith(("BLOCKED", "allowed", "note", "protected"))])
            return
    try:
        base, found = destroys.announce(repo.root(), configs)
    except UserError as exc:
        report.add("destroys", False, "no base to compare with", [f"destroy: {exc}"])
        return
    if base is None:
        report.add("destroys", True, "skipped: not a git checkout")
        return
    blocking = [d for d in found if d.blocking]
    vs = base.short + (f" ({base.note})" if base.note else "")
    summary = f"{len(blocking)} protected resource(s) destroyed vs {vs}" if blocking else f"none vs {vs}"
    report.add("destroys", not blocking, summary + (f", {len(found) - len(blocking)} note(s)" if len(found) > len(blocking) else ""),
               [f"{'destroy' if d.blocking else 'note'}: {d.line}" for d in found])


def expiry_warnings(configs: tuple[ClusterConfig, ...], directory: Path | None = None) -> list[str]:
    """One line per dated maintenance exclusion that ends within 30 days (or has ended): file, line, field, fix."""
    from clusters import clock
    from clusters.derive.gke import EXPIRY_WARNING_DAYS, exclusion_expiry
    from clusters.source import read_yaml

    today = clock.today()
    lines = []
    for config in configs:
        found = exclusion_expiry(config, today)
        if found is None:
            continue
        end, left = found
        path = (directory or repo.clusters_dir()) / f"{config.name}.yaml"
        field = ("gke", "upgrade_exclusion", "end_time")
        when = f"ended {-left} day(s) ago" if left < 0 else f"ends in {left} day(s)"
        message = (f"the maintenance exclusion {when} ({end}; warned {EXPIRY_WARNING_DAYS} days ahead): node and minor upgrades resume"
                   " after it; remove start_time and end_time so gpufleet renews it every quarter, or move end_time")
        try:
            problem = read_yaml(path).problem(field, message)
            lines.append(f"warning: {Path(problem.file).relative_to(repo.root()) if Path(problem.file).is_relative_to(repo.root()) else problem.file}"
                         f":{problem.line}: {problem.field}: {message}")
        except (OSError, ConfigError):
            lines.append(f"warning: clusters/{config.name}.yaml: gke.upgrade_exclusion.end_time: {message}")
    lines += _nomad_certificate_warnings(configs, directory, today)
    return lines


def _nomad_certificate_warnings(configs: tuple[ClusterConfig, ...], directory: Path | None, today: date) -> list[str]:
    """Nomad TLS material that does not renew: its expiry 30 days ahead, or that the file does not record it."""
    from clusters.derive.gke import EXPIRY_WARNING_DAYS
    from clusters.derive.nomad import static_certificate_expiry
    from clusters.source import read_yaml

    lines = []
    for config in configs:
        found = static_certificate_expiry(config, today, EXPIRY_WARNING_DAYS)
        if found is None:
            continue
        what, end, left = found
        if end is None or left is None:
            message = (f"{what} do not renew and the file does not say when they expire (365 days after the bootstrap);"
                       " set nomad.tls.static_expires to the date the bootstrap script printed")
            at: tuple[str | int, ...] = ("nomad", "tls") if config.nomad is not None and "tls" in config.nomad.model_fields_set else ("nomad",)
        else:
            when = f"expired {-left} day(s) ago" if left < 0 else f"expire in {left} day(s)"
            message = (f"{what} {when} ({end}; warned {EXPIRY_WARNING_DAYS} days ahead): a Nomad agent or caller with an expired certificate"
                       " is refused; re-run `gpufleet nomad bootstrap-script` for new ones and move static_expires, or set certificates: vault-pki")
            at = ("nomad", "tls", "static_expires")
        path = (directory or repo.clusters_dir()) / f"{config.name}.yaml"
        try:
            problem = read_yaml(path).problem(at, message)
            shown = Path(problem.file).relative_to(repo.root()) if Path(problem.file).is_relative_to(repo.root()) else problem.file
            lines.append(f"warning: {shown}:{problem.line}: {problem.field}: {message}")
        except (OSError, ConfigError):
            lines.append(f"warning: clusters/{config.name}.yaml: {'.'.join(map(str, at))}: {message}")
    return lines


def _checkov_lines(result: checkov_scan.CheckovSummary, configs: tuple[ClusterConfig, ...], clusters_dir: Path | None) -> list[str]:
    """Findings traced to a cluster file field read as gpufleet errors (file:line: field: fix, with the rule ids);
    the rest keep checkov's own words."""
    from review.checkov_fixes import explain

    explained, rest = explain((f for s in result.stacks for f in s.failures), configs, clusters_dir or repo.clusters_dir())
    return [f"checkov: {line}" for line in explained] + [str(f) for f in rest] + [f"checkov: {s.stack}: error: {s.error}" for s in result.stacks if s.error]


def checkov_warmed(checkov: bool, *, defer_errors: bool = False) -> AbstractContextManager[checkov_scan._Worker | None]:
    """checkov's worker started now, when the check will scan and has a second core (``run_checks``), else None;
    it never outlives the block. The CLI starts it before it loads the cluster files, so its imports (seconds)
    run meanwhile; in a one-cluster edit they were the check's critical path. ``defer_errors``: a worker that
    cannot start gives None, and ``run_checks`` reports why when it starts one, after the cluster files."""
    import stacks.synth  # noqa: F401 - its jsii variables are part of the environment the stream compares the worker's with
    from safety import checkov_scan
    from stacks.parallel import available_cores

    # checkov's worker imports on a second core while the fleet synthesizes, then scans each stack as synthesis
    # writes it (checkov_scan.Stream); what is left is scanned after synthesis by every worker. With one core it
    # would only take time from synthesis. available_cores: the affinity mask where the OS has one
    # (os.sched_getaffinity is Linux-only), else the core count.
    return checkov_scan.warmed(checkov and available_cores() > 1, defer_errors=defer_errors)


def run_checks(configs: tuple[ClusterConfig, ...] | None, *, out: Path, state_files: tuple[Path, ...] = (),
               checkov: bool = True, on_stage: Callable[[str], None] = lambda _stage: None, clusters_dir: Path | None = None,
               price: GpuPrice | None = None, warm: checkov_scan._Worker | None = None) -> CheckReport:
    """``on_stage`` hears each step's name as it starts (the CLI shows it as progress); ``clusters_dir`` is where
    ``configs`` were read (default clusters/), for the file and line of a checkov finding; ``price`` (the CLI's
    price table) prices the reserved nodes a file leaves cold; ``warm``: a worker ``checkov_warmed`` started, which
    the caller ends (else one starts here when it would there)."""
    from safety import checkov_scan, scan_cache, secret_scan
    from jobs.outputs import write_rendered
    from stacks.synth import synthesize

    report = CheckReport()
    from_repo = configs is None
    on_stage("inputs: cluster, job and Vault files")
    configs, specs = validate_inputs(configs)
    report.add("inputs", True, f"{len(configs)} cluster file(s), {len(specs)} job file(s), Vault policies and roles")
    warnings = expiry_warnings(configs)
    report.add("expiry", True, f"{len(warnings)} warning(s)" if warnings else "nothing dated ends within 30 days", warnings)
    on_stage("synth")
    with nullcontext(warm) if warm is not None else checkov_warmed(checkov) as warm, \
            checkov_scan.streamed(checkov and warm is not None, warm) as stream:
        stacks = synthesize(configs, out, written=stream.add if stream is not None else None)
        report.add("synth", True, f"{len(stacks)} stack(s) into {out}")
        if price is not None:
            cold = cold_reservation_warnings(configs, price)
            report.add("reservations", True, f"{len(cold)} warning(s)" if cold else "every reserved pool stays warm", cold)
        if from_repo:
            _destroys(report, configs, out)
        on_stage("secrets scan")
        with tempfile.TemporaryDirectory(prefix="gpufleet-check-jobs-") as rendered:
            # Scan the jobs as they render now; jobs/out may be stale or absent (it is not committed).
            for spec in specs:
                write_rendered(spec, Path(rendered))
            findings = secret_scan.scan_paths([out, Path(rendered), *state_files], cache=scan_cache.cache_dir())
        report.add("secrets", not findings, f"{len(findings)} finding(s)" if findings else "no secret values found",
                   [f"secret: {f}" for f in findings])
        if checkov:
            on_stage(f"checkov on {len(stacks)} stack(s)")
            final = [out / "stacks" / s for s in stacks]
            result = stream.finish(final) if stream is not None else checkov_scan.run(final, warm=warm)
            report.add("checkov", result.ok, result.summary_line, _checkov_lines(result, configs, clusters_dir))
    return report


def cold_reservation_warnings(configs: tuple[ClusterConfig, ...], price: GpuPrice, directory: Path | None = None) -> list[str]:
    """One line per reserved pool whose file sets ``min_nodes`` below its reserved nodes (file, line, field,
    fix): what the reservation bills for the nodes left cold, an hour and a month (730 h, Infracost's month)."""
    from clusters.derive.pools import cold_reservations
    from clusters.source import format_path, read_yaml

    lines = []
    for config in configs:
        path = (directory or repo.clusters_dir()) / f"{config.name}.yaml"
        for cold in cold_reservations(config):
            hourly = cold.cold_gpus * price(cold.accelerator, "reservation", config.gcp.region)
            what = "scale-to-zero" if cold.min_nodes == 0 else f"min_nodes {cold.min_nodes}"
            message = (f"{what} on reserved pool {cold.pool}: the reservation bills its {cold.reserved_nodes} node(s) whether or not they run, so"
                       f" {cold.reserved_nodes - cold.min_nodes} cold node(s) x {cold.gpus_per_node} GPUs cost ${hourly:,.2f}/h"
                       f" (${hourly * 730:,.0f}/month) and every run waits for a node to start; remove min_nodes (default: the"
                       f" {cold.reserved_nodes} reserved nodes stay warm) or set min_nodes: {cold.reserved_nodes}")
            field = ("gpu_pools", cold.index, "min_nodes")
            try:
                problem = read_yaml(path).problem(field, message)
                shown = Path(problem.file).relative_to(repo.root()) if Path(problem.file).is_relative_to(repo.root()) else problem.file
                lines.append(f"warning: {shown}:{problem.line}: {problem.field}: {message}")
            except (OSError, ConfigError):
                lines.append(f"warning: clusters/{config.name}.yaml: {format_path(field)}: {message}")
    return lines
