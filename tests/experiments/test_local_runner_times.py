"""The local scheduler reports when a run started and ended, like Nomad and GKE do: a run that ends
before the reconciler's next pass (the tutorial's fine-tune takes about a second) is still charged
its GPU time, instead of 0 GPU-hours and no row in `gpufleet exp costs`."""

from __future__ import annotations

from experiments.app import utcnow
from experiments.background.dispatch import process_outbox
from experiments.background.reconcile import process_scheduled
from experiments.runner_local import LocalRunner
from tests.experiments.conftest import FakeClock
from tests.experiments.test_no_secrets_dispatch import META, _catalog


def test_a_local_run_that_ended_between_passes_keeps_its_gpu_time(make_service, sqlite_url, tmp_path):
    runner = LocalRunner({})  # a job without secrets: no Vault needed
    clock = FakeClock(utcnow())  # the service's clock and the runner's timestamps on one time line
    svc = make_service(sqlite_url, runner, jobs=_catalog(tmp_path), clock=clock)
    mine = svc.token("finetune")
    exp = svc.submit(mine, job="nokeys", meta=META).json()
    assert process_outbox(svc.ctx) == 1  # dispatched only: a process on this machine
    (run,) = runner._runs.values()
    assert run.process.wait(timeout=120) == 0  # it ends before the reconciler ever sees it running
    clock.now = utcnow()
    process_scheduled(svc.ctx)
    events = svc.client.get(f"/api/v1/experiments/{exp['id']}/events", headers=mine).json()["events"]
    assert [(e["from"], e["to"]) for e in events if e["to"]][-1] == ("queued", "succeeded"), events
    assert any("ended before gpufleet saw it placed" in (e.get("message") or "") for e in events), events
    shown = svc.client.get(f"/api/v1/experiments/{exp['id']}", headers=mine).json()
    assert shown["status"] == "succeeded" and shown["gpu_hours"] > 0, shown
