"""Money budgets enforced like quotas (issue 25): admission refuses a run whose worst case does not fit
in what is left of the tenant's month (409 with the numbers and the fix), concurrent submissions
never overshoot (SQLite and PostgreSQL), the reaper stops (or warns about) runs once spend crosses
the budget, and /costs, ``gpufleet exp budget`` and the dashboard show budget, spent and committed.

Prices: finetune-llama is 1 A100 (nvidia-tesla-a100, list) on prod-nomad (europe-west4, which
prices.yaml lists only for Spot, so the default row: $2.93/GPU-hour) with max_run_hours 12, a worst
case of $35.16; finetune-l4 (written here) is 1 L4 for 12 h on the Spot pool l4 at europe-west4's Spot $0.2438."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from clusters import repo
from clusters.schema import ClusterConfig
from experiments.models import Event
from experiments.services.catalog import Catalog
from tests.experiments.conftest import FakeClock, UnusedRunner

META = {"dataset_uri": "hf://datasets/acme/chat@v3", "run_id": "r1"}
A100_WORST = 35.16
L4_WORST = 12 * 0.2438


def with_tenant(configs: tuple[ClusterConfig, ...], cluster: str, tenant: str, **update: object) -> tuple[ClusterConfig, ...]:
    """The fleet with one tenant's fields changed, as an admin edits its cluster file."""
    out = []
    for config in configs:
        if config.name == cluster:
            config = config.model_copy(update={"tenants": tuple(t.model_copy(update=update) if t.name == tenant else t for t in config.tenants)})
        out.append(config)
    return tuple(out)


@pytest.fixture(scope="module")
def jobs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """jobs/ plus finetune-l4: the finetune tenant on a second pool (a second quota lock on PostgreSQL)."""
    out = tmp_path_factory.mktemp("jobs")
    for path in (repo.root() / "jobs").glob("*.yaml"):
        shutil.copy(path, out / path.name)
    text = (out / "finetune-llama.yaml").read_text().replace("name: finetune-llama", "name: finetune-l4")
    text = text.replace("  pool: a100\n  count: 1\n  min_memory_gib: 40\n  model: A100\n", "  pool: l4\n  count: 1\n  min_memory_gib: 22\n")
    assert "pool: l4" in text
    (out / "finetune-l4.yaml").write_text(text)
    return out


def budget_catalog(catalog: Catalog, jobs_dir: Path, usd: float, policy: str = "stop") -> Catalog:
    return Catalog(jobs_dir, configs=with_tenant(catalog.configs, "prod-nomad", "finetune", budget_usd_month=usd, budget_policy=policy),
                   vault=catalog.vault)


def test_fails_with_409_and_the_numbers_when_a_run_would_overshoot_the_budget(make_service, db_url, catalog, jobs_dir):
    svc = make_service(db_url, UnusedRunner(), jobs=budget_catalog(catalog, jobs_dir, 100))
    headers = svc.token("finetune")
    assert svc.submit(headers, meta={**META, "run_id": "a"}).status_code == 202
    assert svc.submit(headers, meta={**META, "run_id": "b"}).status_code == 202
    refused = svc.submit(headers, meta={**META, "run_id": "c"})
    assert refused.status_code == 409, refused.text
    body = refused.json()
    assert body["error"] == ("over the monthly budget: tenant finetune on cluster prod-nomad has $100.00 for 2026-12; spent $0.00,"
                             " committed $70.32 by 2 live runs (their worst case), left $29.68;"
                             " this run's worst case is 1 GPU x 12 h x $2.93/GPU-hour = $35.16")
    assert body["field"] == "job"
    assert body["fix"].startswith("submit with deadline_hours at most 10.13 (fits what is left)")
    assert "tenants[finetune].budget_usd_month in the cluster file of prod-nomad" in body["fix"]
    shorter = svc.submit(headers, meta={**META, "run_id": "d"}, deadline_hours=10)
    assert shorter.status_code == 202, shorter.text  # 29.30 fits in 29.68
    costs = svc.client.get("/api/v1/costs", headers=headers).json()
    assert costs["budgets"] == [{"cluster": "prod-nomad", "tenant": "finetune", "month": "2026-12", "budget_usd_month": 100.0, "policy": "stop",
                                 "spent_usd": 0.0, "committed_usd": 99.62, "left_usd": 0.38, "live_runs": 3}]
    assert [b["tenant"] for b in svc.client.get("/api/v1/costs", headers=svc.token("eval")).json()["budgets"]] == ["eval"]  # not finetune's


def test_concurrent_submissions_on_two_pools_never_overshoot_the_budget(make_service, db_url, catalog, jobs_dir):
    """Clients race on two pools (two quota locks on PostgreSQL) with runs of about the same worst case
    ($2.93: an A100 for 1 h, a Spot L4 for 12 h), so at the last dollars a run of each pool is in flight
    at once: only the per-tenant budget lock keeps the second from being admitted too."""
    budget = 10.0
    svc = make_service(db_url, UnusedRunner(), jobs=budget_catalog(catalog, jobs_dir, budget))
    headers = svc.token("finetune")
    runs = [("finetune-llama", 1.0), ("finetune-l4", None)] * 12
    worst = {"finetune-llama": 2.93, "finetune-l4": L4_WORST}

    def submit(i: int):
        job, hours = runs[i]
        return svc.submit(headers, job=job, meta={**META, "run_id": f"r{i}"}, **({"deadline_hours": hours} if hours else {}))

    with ThreadPoolExecutor(max_workers=12) as pool:
        answers = list(pool.map(submit, range(len(runs))))
    assert {a.status_code for a in answers} <= {202, 409}, [a.text for a in answers]
    admitted = sum(worst[runs[i][0]] for i, a in enumerate(answers) if a.status_code == 202)
    refused = [runs[i][0] for i, a in enumerate(answers) if a.status_code == 409]
    assert admitted <= budget + 1e-6, f"admitted ${admitted:.2f} of worst case against a ${budget} budget"
    assert refused, "the burst asks for more than the budget: some must be refused"
    assert all(worst[j] > budget - admitted for j in refused), "a refused run would have fitted in what was left"
    costs = svc.client.get("/api/v1/costs", headers=headers).json()["budgets"][0]
    assert costs["committed_usd"] == round(admitted, 2) and costs["left_usd"] == round(budget - admitted, 2)


def _running(svc, nomad, run: str) -> tuple[str, str]:
    headers = svc.token("finetune")
    answer = svc.submit(headers, meta={**META, "run_id": run})
    assert answer.status_code == 202, answer.text
    svc.step()
    job = svc.client.get(f"/api/v1/experiments/{answer.json()['id']}", headers=headers).json()["run_id"].split("/", 1)[1]
    alloc = nomad.start_task(job)
    nomad.write_log(alloc, "step 1\n")
    nomad.gpu_stats[alloc] = [(90, 30_000)]
    svc.step()
    return answer.json()["id"], job


def test_the_reaper_stops_running_runs_once_spend_crosses_a_lowered_budget(make_service, db_url, catalog, jobs_dir, nomad, nomad_runner):
    clock = FakeClock()
    first = make_service(db_url, nomad_runner, clock=clock, jobs=budget_catalog(catalog, jobs_dir, 100))
    exp_id, job = _running(first, nomad, "over")
    admin = first.token(None, admin=True)
    assert first.client.get(f"/api/v1/experiments/{exp_id}", headers=admin).json()["status"] == "running"
    first.close()
    # The admin lowers the budget to $10 and the service restarts; 4 h of one A100 is $11.72.
    second = make_service(db_url, nomad_runner, clock=clock, jobs=budget_catalog(catalog, jobs_dir, 10))
    clock.advance(hours=3)
    nomad.write_log(nomad.state.allocations[job][-1]["ID"], "step 2\n")
    second.step()
    assert second.client.get(f"/api/v1/experiments/{exp_id}", headers=admin).json()["status"] == "running"  # $8.79 < $10
    clock.advance(hours=1)
    second.step()
    shown = second.client.get(f"/api/v1/experiments/{exp_id}", headers=admin).json()
    assert shown["status"] == "cancelled", shown
    assert shown["reason"].startswith("over budget: tenant finetune on cluster prod-nomad spent $11.72 of its $10.00 budget for 2026-12")
    assert shown["reason"].endswith("stopped by budget_policy stop")
    assert any(job in c.path or job.replace("/", "%2F") in c.path for c in nomad.calls("DELETE", "job")), "the run must be stopped on Nomad"
    events = second.client.get(f"/api/v1/experiments/{exp_id}/events", headers=admin).json()["events"]
    assert events[-1]["actor"] == "reaper" and events[-1]["to"] == "cancelled"


def test_the_warn_policy_records_an_event_once_and_leaves_the_run_running(make_service, sqlite_url, catalog, jobs_dir, nomad, nomad_runner):
    clock = FakeClock()
    first = make_service(sqlite_url, nomad_runner, clock=clock, jobs=budget_catalog(catalog, jobs_dir, 100, policy="warn"))
    exp_id, job = _running(first, nomad, "warned")
    first.close()
    svc = make_service(sqlite_url, nomad_runner, clock=clock, jobs=budget_catalog(catalog, jobs_dir, 10, policy="warn"))
    alloc = nomad.state.allocations[job][-1]["ID"]
    for minutes in (240, 1, 1):
        clock.advance(minutes=minutes)
        nomad.write_log(alloc, f"step at +{minutes} min\n")
        svc.step()
    admin = svc.token(None, admin=True)
    assert svc.client.get(f"/api/v1/experiments/{exp_id}", headers=admin).json()["status"] == "running"
    with svc.ctx.sessions() as session:
        warnings = session.query(Event).filter(Event.experiment_id == exp_id, Event.kind == "budget").all()
    assert len(warnings) == 1, [w.message for w in warnings]
    assert warnings[0].message.startswith("over budget: tenant finetune on cluster prod-nomad spent $11.72 of its $10.00 budget")
    assert warnings[0].message.endswith("budget_policy warn: left running")
    assert not nomad.calls("DELETE", "job")


def test_standing_across_the_month_boundary_and_for_cancelled_runs(make_service, db_url, catalog, jobs_dir):
    """Spent counts only the GPU time inside this UTC month; a cancelled run counts what it held and
    commits nothing; a run never placed and cancelled counts nothing; a live placed run commits the
    hours to its deadline, an unplaced one its whole deadline (rows written as the reconciler does)."""
    import uuid
    from datetime import datetime

    from experiments.models import Experiment
    from experiments.services import budgets

    svc = make_service(db_url, UnusedRunner(), jobs=budget_catalog(catalog, jobs_dir, 1000.0))
    now = datetime(2026, 12, 1, 2, 0)

    def row(state: str, placed: datetime | None, finished: datetime | None, deadline_at: datetime | None, hours: float = 12) -> Experiment:
        at = datetime(2026, 11, 30, 20, 0)
        return Experiment(id=str(uuid.uuid4()), tenant="finetune", job="finetune-llama", cluster="prod-nomad", pool="a100", gpus=2, meta=META,
                          state=state, scheduler="nomad", run_id=f"finetune/{uuid.uuid4().hex[:8]}", submitted_by="t", request_hash="-",
                          deadline_hours=hours, price_per_gpu_hour=2.0, price_kind="list", created_at=at, updated_at=at, provisioning_at=placed,
                          running_at=placed, finished_at=finished, deadline_at=deadline_at)

    with svc.ctx.sessions() as session, session.begin():
        session.add_all([
            row("running", datetime(2026, 11, 30, 23, 0), None, datetime(2026, 12, 1, 11, 0)),      # 2 h this month, 9 h left
            row("cancelled", datetime(2026, 11, 30, 22, 0), datetime(2026, 12, 1, 0, 30), None),  # 0.5 h this month
            row("cancelled", None, datetime(2026, 12, 1, 1, 0), None),                            # never placed: nothing
            row("succeeded", datetime(2026, 11, 1, 0, 0), datetime(2026, 11, 30, 23, 59), None),  # last month: nothing
            row("pending", None, None, None, hours=3),                                            # 3 h committed
        ])
    with svc.ctx.sessions() as session:
        standing = budgets.standing(session, budgets.budgets_of(svc.ctx.catalog.configs)[("prod-nomad", "finetune")], now=now)
    assert standing.month == "2026-12" and standing.live_runs == 2
    assert round(standing.spent, 6) == round((2 + 0.5) * 2 * 2.0, 6), standing
    assert round(standing.committed, 6) == round((9 + 3) * 2 * 2.0, 6), standing
