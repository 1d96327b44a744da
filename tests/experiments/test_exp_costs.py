"""``gpufleet exp costs [--json]`` (issue 27): the API's ``GET /costs`` from a shell, per tenant and job."""

from __future__ import annotations

import json

from experiments.background.worker import run_once
from gpufleet.cli import main


def test_exp_costs_prints_the_apis_totals(live, nomad, monkeypatch, capsys):
    monkeypatch.setenv("GPUFLEET_API", live["base"])
    monkeypatch.setenv("GPUFLEET_API_TOKEN", live["tokens"]["finetune"])
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["exp", "submit", "finetune-llama", "--meta", "dataset_uri=hf://datasets/acme/chat@v3", "--meta", "run_id=c1", "--json"]) == 0
    capsys.readouterr()
    assert main(["exp", "costs", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["by_tenant"] == {}, "nothing placed yet: nothing billed"
    run_once(live["ctx"])  # dispatched to the Nomad double
    (run,) = nomad.dispatched("finetune-llama")
    nomad.finish(run, client_status="running")
    run_once(live["ctx"])  # running: GPU-hours count from here
    live["clock"].advance(hours=2)
    assert main(["exp", "costs", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["currency"] == "USD"
    assert answer["by_tenant"]["finetune"]["gpu_hours"] == answer["by_job"]["finetune/finetune-llama"]["gpu_hours"] == 2.0  # one A100
    assert answer["by_tenant"]["finetune"]["estimated_cost_usd"] > 0
    assert main(["exp", "costs"]) == 0
    table = capsys.readouterr().out
    assert "cost by tenant (USD" in table and "finetune/finetune-llama" in table and "2.0000" in table
