"""``gpufleet exp submit|list|show|cancel|watch|events|logs|costs|budget``: the control plane's API from a shell.

GPUFLEET_API (default http://127.0.0.1:8080) and GPUFLEET_API_TOKEN (a token from
``gpufleet api token create`` or a CI workload identity's OIDC token). ``--json`` prints
the API's JSON unchanged for scripts.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import typer
from gpufleet.console import make_console
from gpufleet.progress import Stages
from rich.table import Table

from clusters.errors import UserError
from experiments.states import TERMINAL, State

console = make_console()
JsonOption = typer.Option(False, "--json", help="Print the API's JSON.")
COLOURS = {"succeeded": "green", "failed": "red", "expired": "red", "idle": "red", "cancelled": "dim", "running": "cyan", "provisioning": "cyan",
           "retrying": "magenta"}


def _target() -> tuple[str, dict[str, str]]:
    base = os.environ.get("GPUFLEET_API", "http://127.0.0.1:8080").rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise UserError(f"GPUFLEET_API {base!r} has no scheme; set it like http://{base} (or https://...)")
    token = os.environ.get("GPUFLEET_API_TOKEN")
    if not token:
        raise UserError("GPUFLEET_API_TOKEN is not set; create one with: gpufleet api token create --tenant <tenant>")
    return base, {"Authorization": f"Bearer {token}"}


def _raise_for(answer: Any, where: str) -> None:
    """One line for an error answer: the API's error, field and fix."""
    try:
        body = answer.json()
    except ValueError:
        raise UserError(f"{where} answered {answer.status_code} without JSON; is GPUFLEET_API the gpufleet control plane?") from None
    field = f" ({body.get('field')})" if body.get("field") else ""
    raise UserError(f"{answer.status_code}: {body.get('error')}{field}; {body.get('fix')}")


def _call(method: str, path: str, **kwargs: Any) -> Any:
    import httpx

    base, auth = _target()
    headers = {**auth, **kwargs.pop("headers", {})}
    try:
        answer = httpx.request(method, f"{base}{path}", headers=headers, timeout=30, **kwargs)
    except httpx.HTTPError as exc:
        raise UserError(f"cannot reach the control plane at {base} ({type(exc).__name__}); start it with gpufleet serve or set GPUFLEET_API") from None
    if answer.status_code >= 400:
        _raise_for(answer, f"{base}{path}")
    try:
        return answer.json()
    except ValueError:
        raise UserError(f"{base}{path} answered {answer.status_code} without JSON; is GPUFLEET_API the gpufleet control plane?") from None


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True))


def _state(value: str) -> str:
    return f"[{COLOURS.get(value, 'yellow')}]{value}[/]"


def _detail(exp: dict[str, Any]) -> Table:
    table = Table(title=f"experiment {exp['id']}", show_header=False)
    table.add_column("field")
    table.add_column("value")
    attempt = f"{exp.get('attempt', 1)}" + (f" (last failure: {exp['failure_class']})" if exp.get("failure_class") else "")
    rows = [("status", _state(exp["status"])), ("attempt", attempt), ("reason", exp.get("reason") or ""), ("exit code", str(exp["exit_code"]) if exp["exit_code"] is not None else "-"),
            ("tenant / job", f"{exp['tenant']} / {exp['job']}"), ("pool", f"{exp['cluster']}/{exp['pool']} ({exp['gpus']} GPU)"),
            ("run", f"{exp['scheduler']} {exp.get('run_id') or '-'}"), ("deadline", f"{exp['deadline_hours']}h" + (f" (at {exp['deadline_at']})" if exp.get("deadline_at") else "")),
            ("GPU-hours", f"{exp['gpu_hours']:.4f}"), ("estimated cost", f"{exp['estimated_cost_usd']:.4f} USD ({exp['price_kind']} {exp['price_per_gpu_hour']}/GPU-hour)")]
    if "gpu_utilization" in exp:
        rows += _usage_rows(exp["gpu_utilization"])
    rows += [(f"  {kind}", name) for kind, name in (exp.get("scheduler_ids") or {}).items() if kind != "run"]
    rows += [(f"  {state}", at) for state, at in exp["timestamps"].items() if at]
    for past in (exp.get("attempts") or [])[:-1]:  # the ended attempts; the current one is the rows above
        cause = f", {past['cause']}" if past.get("cause") else ""
        rows.append((f"attempt {past['attempt']}", f"{past['status']} ({past.get('failure_class') or '-'}{cause}), {past.get('run_id') or '-'}, "
                                                  f"{past['gpu_hours']:.4f} GPU-hours"))
    for name, value in rows:
        table.add_row(name, value, style=None)
    return table


def _usage_rows(usage: dict[str, Any]) -> list[tuple[str, str]]:
    """Unknown (no sample, or the metrics source was down) is printed as unknown, never as 0."""
    def known(value: float | None, unit: str) -> str:
        return "unknown" if value is None else f"{value:g}{unit}"

    return [("GPU utilization", f"mean {known(usage['mean_pct'], '%')}, peak {known(usage['peak_pct'], '%')} ({usage['samples']} samples)"),
            ("peak GPU memory", known(usage["peak_memory_mib"], " MiB"))]


def _job_file_text(path: str) -> str:
    """The local job file to send as ``job_file``; a file that cannot be read is one line, no traceback."""
    from pathlib import Path

    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(f"{path}: cannot read the job file ({exc.strerror}); give the path of a job YAML file") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text (byte {exc.start}); save the job file as UTF-8") from None


def cmd_submit(
    job: str | None = typer.Argument(None, help="Job name (jobs/<job>.yaml on the server); or give -f."),
    job_file: str | None = typer.Option(None, "--file", "-f", help="An ad-hoc job file to send instead of a job name (the tenant needs adhoc_jobs: true)."),
    meta: list[str] | None = typer.Option(None, "--meta", help="key=value; repeat for each key the job declares."),
    deadline_hours: float | None = typer.Option(None, "--deadline-hours", help="Stop the run after this many hours (at most the job's max_run_hours)."),
    idempotency_key: str | None = typer.Option(None, "--idempotency-key", help="Retrying with the same key and body returns the same experiment."),
    watch: bool = typer.Option(False, "--watch", help="Follow it until it ends; exit 1 unless it succeeded."),
    as_json: bool = JsonOption,
) -> None:
    """Submit an experiment: checked like gpufleet check, then dispatched in the background."""
    from jobs.meta import parse_pairs

    if (job is None) == (job_file is None):
        raise UserError("give a job name or -f job.yaml, one of them: a name is a file of the server's jobs/, -f sends a local file")
    body: dict[str, Any] = {"meta": parse_pairs(meta or [])}
    body.update({"job": job} if job is not None else {"job_file": _job_file_text(job_file or "")})
    if deadline_hours is not None:
        body["deadline_hours"] = deadline_hours
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    try:
        exp = _call("POST", "/api/v1/experiments", json=body, headers=headers)
    except UserError as exc:
        if job_file is None:
            raise
        raise UserError(str(exc).replace(": job_file:", f": {job_file}:", 1)) from None  # the server's line numbers are the local file's
    if watch:
        cmd_watch(exp["id"], interval=1.0, as_json=as_json)
        return
    if as_json:
        _print_json(exp)
        return
    console.print(f"accepted {exp['id']} ({_state(exp['status'])}); follow it: gpufleet exp watch {exp['id']}")


def cmd_list(
    status: str | None = typer.Option(None, "--status", help="Only this state: " + ", ".join(State) + "."),
    tenant: str | None = typer.Option(None, "--tenant", help="Only this tenant's (admin tokens; a tenant sees only its own)."),
    job: str | None = typer.Option(None, "--job", help="Only experiments of this job."),
    limit: int = typer.Option(50, "--limit", min=1, max=500, help="At most this many, newest first."),
    offset: int = typer.Option(0, "--offset", min=0, help="Skip this many (the next page)."), as_json: bool = JsonOption,
) -> None:
    """Experiments you may see, newest first, with GPU-hours and cost."""
    params = {k: v for k, v in {"status": status, "tenant": tenant, "job": job, "limit": limit, "offset": offset}.items() if v is not None}
    page = _call("GET", "/api/v1/experiments", params=params)
    if as_json:
        _print_json(page)
        return
    table = Table(title=f"experiments ({len(page['items'])} of {page['total']})")
    table.add_column("id", no_wrap=True, min_width=8)
    table.add_column("status", no_wrap=True)
    for column in ("tenant", "job", "pool", "GPU-hours", "cost USD", "reason"):
        table.add_column(column)
    for e in page["items"]:
        table.add_row(e["id"][:8], _state(e["status"]), e["tenant"], e["job"], f"{e['cluster']}/{e['pool']}", f"{e['gpu_hours']:.3f}", f"{e['estimated_cost_usd']:.2f}", (e.get("reason") or "")[:60])
    console.print(table)
    console.print(f"total: {page['totals']['gpu_hours']:.3f} GPU-hours, {page['totals']['estimated_cost_usd']:.2f} USD (this page)")


def cmd_show(experiment_id: str = typer.Argument(...), as_json: bool = JsonOption) -> None:
    """One experiment: state, reason, timestamps, run id, exit code, GPU-hours and cost."""
    exp = _call("GET", f"/api/v1/experiments/{experiment_id}")
    _print_json(exp) if as_json else console.print(_detail(exp))


def cmd_cancel(experiment_id: str = typer.Argument(...), as_json: bool = JsonOption) -> None:
    """Cancel: at once if not dispatched yet, else the run is stopped on the scheduler first."""
    exp = _call("POST", f"/api/v1/experiments/{experiment_id}/cancel")
    _print_json(exp) if as_json else console.print(f"{exp['id']}: {_state(exp['status'])}{' (stop requested)' if exp['cancel_requested'] and exp['status'] != 'cancelled' else ''}")


def cmd_events(experiment_id: str = typer.Argument(...), as_json: bool = JsonOption) -> None:
    """The audit trail: every state change and request, with who made it."""
    answer = _call("GET", f"/api/v1/experiments/{experiment_id}/events")
    if as_json:
        _print_json(answer)
        return
    table = Table(title=f"events of {answer['id']}")
    for column in ("at", "attempt", "who", "what", "change", "message"):
        table.add_column(column)
    for e in answer["events"]:
        table.add_row(e["at"], str(e.get("attempt") or ""), e["actor"], e["kind"], f"{e['from'] or ''} -> {e['to']}" if e["to"] else "", e["message"])
    console.print(table)


def cmd_logs(experiment_id: str = typer.Argument(..., help="The experiment id, or a unique prefix of it (6+ characters)."),
             follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing what the run writes until it ends."),
             rank: int | None = typer.Option(None, "--rank", min=0, help="The rank (pod of a multi-node GKE run) to show; default 0."),
             all_ranks: bool = typer.Option(False, "--all-ranks", help="Every rank, each line prefixed [rank N]."),
             stderr: bool = typer.Option(False, "--stderr", help="The run's stderr instead of its stdout (Nomad and local runs)."),
             tail: int | None = typer.Option(None, "--tail", min=0, help="Only the last N lines (with --follow: to start with)."),
             since: str | None = typer.Option(None, "--since", help="Only what was written in the last DURATION (90s, 10m, 2h; GKE runs)."),
             as_json: bool = JsonOption) -> None:
    """What the run printed: live from its scheduler, else the tail kept in the database (credentials masked)."""
    if rank is not None and all_ranks:
        raise UserError("--rank and --all-ranks together; give one rank (--rank N) or --all-ranks")
    params: dict[str, Any] = {"stderr": str(stderr).lower(), "all_ranks": str(all_ranks).lower()}
    params.update({k: v for k, v in (("tail", tail), ("rank", rank), ("since", since)) if v is not None})
    if follow:
        _stream(f"/api/v1/experiments/{experiment_id}/logs", params={**params, "follow": "true"})
        return
    answer = _call("GET", f"/api/v1/experiments/{experiment_id}/logs", params=params)
    if as_json:
        _print_json(answer)
        return
    for line in answer["lines"]:
        print(line)
    _print_source(answer)


def _print_source(answer: dict[str, Any]) -> None:
    """Where the lines came from, dimmed. The note quotes schedulers' own words ("[rank 1]",
    "[/v1/client/...]"): escaped, as text, not read as rich markup (dropped, or a MarkupError)."""
    from rich.markup import escape

    if answer["source"] != "scheduler":
        where = {"stored": "kept in the database", "none": "none kept", "mixed": "partly kept in the database"}[answer["source"]]
        note = f"; {answer['note']}" if answer.get("note") else ""
        console.print(f"[dim]({answer['stream']} {escape(where + note)})[/]", highlight=False)


def cmd_costs(as_json: bool = JsonOption) -> None:
    """GPU-hours and estimated cost per tenant and per job, over every experiment you may see."""
    answer = _call("GET", "/api/v1/costs")
    if as_json:
        _print_json(answer)
        return
    for key, title in (("by_tenant", "tenant"), ("by_job", "tenant/job")):
        table = Table(title=f"cost by {title} ({answer['currency']}, prices: {answer['price_source']}, {answer['price_date']})")
        for column in (title, "GPU-hours", "estimated cost"):
            table.add_column(column)
        for name, row in answer[key].items():
            table.add_row(name, f"{row['gpu_hours']:.4f}", f"{row['estimated_cost_usd']:.4f}")
        console.print(table)


def _stream(path: str, params: dict[str, Any]) -> None:
    """Print a text/plain answer as it arrives (the API's follow=true) until the server ends it."""
    import sys

    import httpx

    base, headers = _target()
    try:
        with httpx.stream("GET", f"{base}{path}", params=params, headers=headers, timeout=httpx.Timeout(30, read=None)) as answer:
            if answer.status_code >= 400:
                answer.read()
                _raise_for(answer, f"{base}{path}")
            for text in answer.iter_text():
                sys.stdout.write(text)
                sys.stdout.flush()
    except httpx.HTTPError as exc:
        raise UserError(f"the log stream from {base} broke off ({type(exc).__name__}); run the same command again") from None


def cmd_watch(experiment_id: str = typer.Argument(..., help="The experiment id, or a unique prefix of it (6+ characters)."),
              interval: float = typer.Option(1.0, "--interval", min=0.2, help="Seconds between polls."), as_json: bool = JsonOption) -> None:
    """Print each state change until the experiment ends; exit 1 unless it succeeded."""
    seen, attempt = None, 1
    with Stages(console, terminal_only=True) as stages:
        while True:
            exp = _call("GET", f"/api/v1/experiments/{experiment_id}")
            if (exp["status"], exp.get("attempt", 1)) != (seen, attempt):
                seen, attempt = exp["status"], exp.get("attempt", 1)
                if not as_json:
                    which = f" (attempt {attempt})" if attempt > 1 else ""
                    console.print(f"{exp['id'][:8]} {_state(seen)}{which} {exp.get('reason') or ''}")
                    stages.step(f"{exp['id'][:8]} {seen}: waiting for the next state")
            if seen in TERMINAL:
                break
            time.sleep(interval)
    _print_json(exp) if as_json else console.print(_detail(exp))
    if seen != "succeeded":
        raise typer.Exit(1)


def cmd_budget(as_json: bool = JsonOption) -> None:
    """Monthly money budgets of the tenants you may see: budget, spent, committed by live runs, left."""
    costs = _call("GET", "/api/v1/costs")
    if as_json:
        _print_json(costs["budgets"])
        return
    table = Table(title=f"budgets ({costs['currency']}, this month, UTC)")
    for column in ("cluster/tenant", "month", "budget", "spent", "committed", "left", "live runs", "policy"):
        table.add_column(column)
    for b in costs["budgets"]:
        table.add_row(f"{b['cluster']}/{b['tenant']}", b["month"], f"{b['budget_usd_month']:,.2f}", f"{b['spent_usd']:,.2f}", f"{b['committed_usd']:,.2f}",
                      f"{b['left_usd']:,.2f}", str(b["live_runs"]), b["policy"])
    console.print(table if costs["budgets"] else "no budget set for your tenants (tenants[].budget_usd_month in the cluster files)")


def register(app: typer.Typer) -> None:
    exp = typer.Typer(help="Experiments on the control plane (GPUFLEET_API, GPUFLEET_API_TOKEN): submit, list, show, cancel, watch, events,"
                           " logs, costs, budget. The day-to-day way to run a job.", no_args_is_help=True)
    for name, command in (("submit", cmd_submit), ("list", cmd_list), ("show", cmd_show), ("cancel", cmd_cancel), ("watch", cmd_watch),
                          ("events", cmd_events), ("logs", cmd_logs), ("costs", cmd_costs), ("budget", cmd_budget)):
        exp.command(name)(command)
    app.add_typer(exp, name="exp")
