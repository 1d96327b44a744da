"""A run's output through the control plane: live while the scheduler has it, kept (masked)
after it forgot the run, tenant-scoped. The local runner runs the real tiny fine-tune through the
real Vault flow against the session's OpenBao; its files are the run's own."""

from __future__ import annotations

import random
import time

from experiments.runner_local import LocalRunner
from tests.experiments.test_secrets_and_migrations import _database_text
from tests.safety.test_secret_matrix import NEW_FORMATS

META = {"dataset_uri": "hf://datasets/acme/chat@v3", "run_id": "logs-1"}


def _until_ended(svc, experiment_id: str, headers: dict[str, str]) -> dict:
    for _ in range(300):
        svc.step()
        shown = svc.client.get(f"/api/v1/experiments/{experiment_id}", headers=headers).json()
        if shown["status"] in ("succeeded", "failed", "cancelled", "expired"):
            return shown
        time.sleep(0.1)
    raise AssertionError(f"still {shown['status']}")


def test_logs_live_then_kept_masked_after_the_scheduler_forgot_the_run(make_service, sqlite_url, vault, capsys):
    env = {"VAULT_ADDR": vault.addr, "VAULT_TOKEN": vault.orchestrator.token}
    runner = LocalRunner(env)
    svc = make_service(sqlite_url, runner)
    mine, other = svc.token("finetune"), svc.token("eval")
    exp = svc.submit(mine, meta=META).json()
    svc.step()  # dispatched: the run is a process on this machine
    (run,) = runner._runs.values()
    planted = NEW_FORMATS(random.Random(3))["groq"]
    with (run.root / "alloc" / "logs" / "train.stdout.0").open("a") as out:  # the task printing a key by mistake
        out.write(f"debug: GROQ_API_KEY={planted}\n")
    shown = _until_ended(svc, exp["id"], mine)
    assert shown["status"] == "succeeded", shown
    live = svc.client.get(f"/api/v1/experiments/{exp['id'][:8]}/logs", headers=mine).json()
    assert live["source"] == "scheduler" and any(line.startswith("step") for line in live["lines"])
    assert "[masked: groq-key]" in live["lines"] and planted not in str(live)
    assert svc.client.get(f"/api/v1/experiments/{exp['id']}/logs", headers=other).status_code == 404
    tail = svc.client.get(f"/api/v1/experiments/{exp['id']}/logs", params={"tail": 2}, headers=mine).json()
    assert tail["lines"] == live["lines"][-2:]
    svc.close()
    # A restarted service: the scheduler (this process) no longer knows the run; the kept tail answers.
    again = make_service(sqlite_url, LocalRunner(env), clock=svc.clock)
    kept = again.client.get(f"/api/v1/experiments/{exp['id']}/logs", headers=mine).json()
    assert kept["source"] == "stored" and kept["lines"] == live["lines"]
    assert planted not in _database_text(again) and planted[-12:] not in capsys.readouterr().out
