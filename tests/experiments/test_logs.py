"""A run's output through the control plane: live while the scheduler has it, kept (masked)
after it forgot the run, tenant-scoped. The local runner runs the real tiny fine-tune through the
real Vault flow against the session's OpenBao; its files are the run's own."""

from __future__ import annotations

import random
import time

from experiments.runner_local import LocalRunner
from tests.experiments.test_secrets_and_migrations import _database_text
from tests.jobs.test_log_masking import BODY as PEM_BODY
from tests.jobs.test_log_masking import PEM
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
        out.write(f"loading {PEM}\n")  # and a private key over several lines: each of them is masked, not only BEGIN
    shown = _until_ended(svc, exp["id"], mine)
    assert shown["status"] == "succeeded", shown
    live = svc.client.get(f"/api/v1/experiments/{exp['id'][:8]}/logs", headers=mine).json()
    assert live["source"] == "scheduler" and any(line.startswith("step") for line in live["lines"])
    assert "[masked: groq-key]" in live["lines"] and planted not in str(live)
    assert svc.client.get(f"/api/v1/experiments/{exp['id']}/logs", headers=other).status_code == 404
    tail = svc.client.get(f"/api/v1/experiments/{exp['id']}/logs", params={"tail": 2}, headers=mine).json()
    assert tail["lines"] == live["lines"][-2:]
    followed = svc.client.get(f"/api/v1/experiments/{exp['id']}/logs", params={"follow": "true"}, headers=mine)
    assert followed.text.splitlines() == live["lines"]  # the process has ended: the follow ends with it
    svc.close()
    # A restarted service: the scheduler (this process) no longer knows the run; the kept tail answers.
    again = make_service(sqlite_url, LocalRunner(env), clock=svc.clock)
    kept = again.client.get(f"/api/v1/experiments/{exp['id']}/logs", headers=mine).json()
    assert kept["source"] == "stored" and kept["lines"] == live["lines"]
    assert planted not in _database_text(again) and planted[-12:] not in capsys.readouterr().out
    for body_line in PEM_BODY:
        assert all(body_line not in str(answer) for answer in (live, followed.text, kept)) and body_line not in _database_text(again)


# ---- Nomad and GKE through the doubles ---------------------------------------------------------
DONE = [{"Type": "Terminated", "Time": 2, "ExitCode": 0, "Details": {"exit_code": "0"}}]
GKE_META = {"dataset_uri": "gs://acme-data/chat/v3/", "run_id": "logs-gke-1"}


def _nomad_running(svc, nomad, headers) -> tuple[str, str, str]:
    """A finetune-llama experiment dispatched to the Nomad double, its task started: (id, job id, alloc id)."""
    exp = svc.submit(headers).json()
    svc.step()
    job_id = svc.client.get(f"/api/v1/experiments/{exp['id']}", headers=headers).json()["run_id"].split("/", 1)[1]
    alloc = nomad.start_task(job_id)
    svc.step()
    return exp["id"], job_id, alloc


def _gke_running(svc, k8s, headers) -> tuple[str, str]:
    """A two-rank finetune-llama-gke experiment, admitted, both pods running: (id, Job name)."""
    exp = svc.client.post("/api/v1/experiments", json={"job": "finetune-llama-gke", "meta": GKE_META}, headers=headers).json()
    svc.step()
    run = svc.client.get(f"/api/v1/experiments/{exp['id']}", headers=headers).json()["run_id"].rsplit("/", 1)[1]
    k8s.admit("research", run, cluster_queue="research", flavor="h100")
    k8s.pods_ready("research", run, 2)
    svc.step()
    return exp["id"], run


def test_nomad_logs_are_kept_masked_and_shown_after_nomad_garbage_collected_the_run(make_service, db_url, nomad, fleet_runner):
    svc = make_service(db_url, fleet_runner)
    mine, other = svc.token("finetune"), svc.token("eval")
    exp_id, job_id, alloc = _nomad_running(svc, nomad, mine)
    planted = NEW_FORMATS(random.Random(5))["groq"]
    nomad.write_log(alloc, f"step 1\nexport GROQ_API_KEY={planted}\nstep 2\n")
    nomad.write_log(alloc, "warning: slow disk\n", stderr=True)
    live = svc.client.get(f"/api/v1/experiments/{exp_id}/logs", headers=mine).json()
    assert live["source"] == "scheduler" and live["lines"] == ["step 1", "[masked: groq-key]", "step 2"]
    assert svc.client.get(f"/api/v1/experiments/{exp_id}/logs", params={"stderr": "true"}, headers=mine).json()["lines"] == ["warning: slow disk"]
    assert svc.client.get(f"/api/v1/experiments/{exp_id}/logs", headers=other).status_code == 404
    refused = svc.client.get(f"/api/v1/experiments/{exp_id}/logs", params={"since": "10m"}, headers=mine)
    assert refused.status_code == 422 and "no time filter" in refused.json()["error"]
    nomad.finish(job_id, client_status="complete", events=DONE)
    svc.step()  # the run ended: its tails go into the database
    nomad.gc(job_id)  # ... and Nomad forgets it
    kept = svc.client.get(f"/api/v1/experiments/{exp_id}/logs", headers=mine).json()
    assert kept["source"] == "stored" and kept["lines"] == live["lines"] and "no longer knows" in kept["note"]
    assert svc.client.get(f"/api/v1/experiments/{exp_id}/logs", params={"stderr": "true"}, headers=mine).json()["lines"] == ["warning: slow disk"]
    assert svc.client.get(f"/api/v1/experiments/{exp_id}/logs", headers=other).status_code == 404
    assert planted not in _database_text(svc) and "[masked: groq-key]" in _database_text(svc)


def test_running_runs_tails_are_kept_a_few_per_pass_never_one_read_per_run_at_the_configured_size(make_service, sqlite_url, nomad, fleet_runner):
    from experiments.background.context import Timing
    from experiments.models import RunLog

    svc = make_service(sqlite_url, fleet_runner, timing=Timing(log_captures_per_pass=2, log_capture_every_seconds=600, log_tail_bytes=16))
    headers = svc.token("finetune")
    ids = []
    for n in range(3):
        exp = svc.submit(headers, meta={"dataset_uri": "hf://datasets/acme/chat@v3", "run_id": f"r{n}"}).json()
        ids.append(exp["id"])
    svc.step()
    for job_id in nomad.dispatched("finetune-llama"):
        nomad.write_log(nomad.start_task(job_id), "x" * 100 + "\nsays hi\n")

    def kept() -> dict[str, str]:
        with svc.ctx.sessions() as session:
            return {row.experiment_id: row.text for row in session.query(RunLog).filter(RunLog.stream == "stdout")}

    before = len(nomad.calls("GET", "fs-logs"))
    svc.step()  # all three are running now: two of them get their tails kept this pass
    assert len(kept()) == 2 and len(nomad.calls("GET", "fs-logs")) - before == 2 * 2  # stdout and stderr of two runs
    svc.step()  # the third, never kept, goes first; the other two were kept within 600 s
    assert sorted(kept()) == sorted(ids) and set(kept().values()) == {"says hi\n"}  # the last 16 bytes, from a line start
    assert {r.query["offset"][0] for r in nomad.calls("GET", "fs-logs")} == {"17"}  # one byte more shows the window began mid-line
    before = len(nomad.calls("GET", "fs-logs"))
    svc.step()
    assert len(nomad.calls("GET", "fs-logs")) == before  # nothing is due: no reads at all
    svc.clock.advance(seconds=601)
    svc.step()
    assert len(nomad.calls("GET", "fs-logs")) - before == 2 * 2


def test_gke_rank_picks_the_pod_all_ranks_shows_each_and_the_tail_outlives_the_job(make_service, sqlite_url, k8s, fleet_runner):
    svc = make_service(sqlite_url, fleet_runner)
    mine, other = svc.token("research"), svc.token("finetune")
    exp_id, run = _gke_running(svc, k8s, mine)
    planted = NEW_FORMATS(random.Random(7))["groq"]
    k8s.write_pod_log("research", run, 0, "rank0 loss 1.0\n")
    k8s.write_pod_log("research", run, 1, f"rank1 loss 1.1\nGROQ_API_KEY={planted}\n")
    url = f"/api/v1/experiments/{exp_id}/logs"
    assert svc.client.get(url, headers=mine).json()["lines"] == ["rank0 loss 1.0"]
    assert svc.client.get(url, params={"rank": 1}, headers=mine).json()["lines"] == ["rank1 loss 1.1", "[masked: groq-key]"]
    both = svc.client.get(url, params={"all_ranks": "true"}, headers=mine).json()
    assert both["lines"] == ["[rank 0] rank0 loss 1.0", "[rank 1] rank1 loss 1.1", "[rank 1] [masked: groq-key]"]
    assert svc.client.get(url, params={"rank": 1, "since": "1h"}, headers=mine).json()["lines"] == ["rank1 loss 1.1", "[masked: groq-key]"]
    assert svc.client.get(url, params={"since": "yesterday"}, headers=mine).status_code == 422
    assert [r.query.get("sinceSeconds") for r in k8s.requests if r.path.endswith("/log")][-1] == ["3600"]
    assert svc.client.get(url, params={"rank": 2}, headers=mine).status_code == 422
    assert svc.client.get(url, params={"stderr": "true"}, headers=mine).status_code == 422
    assert svc.client.get(url, params={"rank": 1}, headers=other).status_code == 404
    pods = k8s.pods("research", run)
    k8s.succeed("research", run)
    svc.step()
    k8s.remove_job("research", run)  # ttlSecondsAfterFinished: the Job and its pods are gone
    assert not any(r == "pods" for (r, _, _) in k8s.store.objects)
    kept = svc.client.get(url, params={"all_ranks": "true"}, headers=mine).json()
    assert kept["source"] == "stored" and kept["lines"] == both["lines"]
    assert svc.client.get(url, params={"rank": 1, "tail": 1}, headers=mine).json()["lines"] == ["[masked: groq-key]"]
    assert planted not in _database_text(svc)
    logged = [r.path for r in k8s.requests if r.path.endswith("/log")]
    assert f"/api/v1/namespaces/research/pods/{pods[1]}/log" in logged


def _follow(base: str, token: str, experiment_id: str, **params: str):
    import httpx

    return httpx.stream("GET", f"{base}/api/v1/experiments/{experiment_id}/logs", params={"follow": "true", **params},
                        headers={"Authorization": f"Bearer {token}"}, timeout=httpx.Timeout(20.0))


def test_nomad_follow_streams_a_running_run_masked_and_stops_when_it_ends(live, nomad):
    import httpx

    from experiments.background.worker import run_once

    nomad.heartbeat_seconds = 0.2
    base, tokens, ctx = live["base"], live["tokens"], live["ctx"]
    auth = {"Authorization": f"Bearer {tokens['finetune']}"}
    exp = httpx.post(f"{base}/api/v1/experiments", json={"job": "finetune-llama", "meta": META}, headers=auth).json()
    run_once(ctx)
    job_id = nomad.dispatched("finetune-llama")[0]
    alloc = nomad.start_task(job_id)
    run_once(ctx)
    nomad.write_log(alloc, "step 1\n")
    with _follow(base, tokens["eval"], exp["id"]) as answer:
        assert answer.status_code == 404  # another tenant's run does not exist for them, followed or not
    planted = NEW_FORMATS(random.Random(9))["groq"]
    with _follow(base, tokens["finetune"], exp["id"][:8]) as answer:
        assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain")
        lines = answer.iter_lines()
        assert next(lines) == "step 1"
        nomad.write_log(alloc, "step 2: GROQ_API_")  # a key split across two writes is still seen whole
        nomad.write_log(alloc, f"KEY={planted}\nstep 3\n")
        assert [next(lines), next(lines)] == ["[masked: groq-key]", "step 3"]
        nomad.write_log(alloc, "done\n")
        nomad.finish(job_id, client_status="complete", events=DONE)
        run_once(ctx)  # the reconciler sees the end; Nomad itself keeps the follow open
        assert list(lines) == ["done"]  # the stream ended by itself
    shown = httpx.get(f"{base}/api/v1/experiments/{exp['id']}", headers=auth).json()
    assert shown["status"] == "succeeded"


def test_gke_follow_of_all_ranks_through_the_cli_ends_when_the_pods_exit(live, k8s, monkeypatch):
    import threading

    import httpx
    from typer.testing import CliRunner

    from experiments.background.worker import run_once
    from gpufleet.cli import app

    base, tokens, ctx = live["base"], live["tokens"], live["ctx"]
    auth = {"Authorization": f"Bearer {tokens['research']}"}
    exp = httpx.post(f"{base}/api/v1/experiments", json={"job": "finetune-llama-gke", "meta": GKE_META}, headers=auth).json()
    run_once(ctx)
    run = httpx.get(f"{base}/api/v1/experiments/{exp['id']}", headers=auth).json()["run_id"].rsplit("/", 1)[1]
    k8s.admit("research", run, cluster_queue="research", flavor="h100")
    k8s.pods_ready("research", run, 2)
    run_once(ctx)
    k8s.write_pod_log("research", run, 0, "r0 a\n")
    k8s.write_pod_log("research", run, 1, "r1 a\n")

    def end_the_run() -> None:
        for _ in range(200):  # once both ranks' follows are open
            if sum(1 for r in k8s.requests if r.path.endswith("/log") and r.query.get("follow") == ["True"]) >= 2:
                break
            threading.Event().wait(0.05)
        k8s.write_pod_log("research", run, 1, "r1 b\n")
        threading.Event().wait(0.5)
        k8s.succeed("research", run)
        run_once(ctx)

    ender = threading.Thread(target=end_the_run)
    ender.start()
    monkeypatch.setenv("GPUFLEET_API", base)
    monkeypatch.setenv("GPUFLEET_API_TOKEN", tokens["research"])
    result = CliRunner().invoke(app, ["exp", "logs", exp["id"][:8], "--follow", "--all-ranks"])
    ender.join(timeout=30)
    assert result.exit_code == 0, result.output
    assert sorted(result.output.splitlines()) == ["[rank 0] r0 a", "[rank 1] r1 a", "[rank 1] r1 b"]
    one = CliRunner().invoke(app, ["exp", "logs", exp["id"][:8], "--rank", "1", "--tail", "1"])
    assert one.exit_code == 0 and one.output.splitlines() == ["r1 b"], one.output


def test_a_run_of_a_cluster_this_service_is_not_bound_to_is_never_read_from_its_scheduler(make_service, sqlite_url, k8s, fleet_runner, gke_runner):
    """Its run id names no cluster: read through another cluster's client it could show that
    cluster's same-named Job's pods. The kept tail and the reason answer instead."""
    from experiments.scheduler import ClusterRunners

    svc = make_service(sqlite_url, fleet_runner)
    headers = svc.token("research")
    exp_id, run = _gke_running(svc, k8s, headers)
    k8s.write_pod_log("research", run, 0, "prod-gke's rank 0\n")
    svc.close()
    other = make_service(sqlite_url, ClusterRunners(gke=("dev-gke", gke_runner)), clock=svc.clock)
    before = len([r for r in k8s.requests if "/pods" in r.path])
    shown = other.client.get(f"/api/v1/experiments/{exp_id}/logs", headers=headers).json()
    assert shown["source"] == "stored" and "not bound to this service" in shown["note"]
    assert shown["lines"] == []  # the tail kept when it started running, not what the pod printed since
    followed = other.client.get(f"/api/v1/experiments/{exp_id}/logs", params={"follow": "true"}, headers=headers)
    assert followed.status_code == 200 and followed.text == ""
    assert len([r for r in k8s.requests if "/pods" in r.path]) == before



def test_a_tenant_cannot_hold_more_follows_open_than_the_limit_and_a_closed_one_frees_its_place():
    """Each open follow holds a thread and a scheduler connection per rank: one token opening
    thousands would exhaust the service and its scheduler. Over the limit a follow is a 429
    before anything is asked (another tenant is not affected); two started past that check at
    once: the one over says so and ends; closing one lets the next one open."""
    import asyncio
    from types import SimpleNamespace

    import pytest

    from experiments.errors import ApiError
    from experiments.services import logs as run_logs

    opened = []

    class Runner:  # a scheduler whose run writes one line and then nothing, until the follower goes
        def logs(self, run_id, *, stop, **_):
            opened.append(run_id)
            yield b"step 1\n"
            while not stop.is_set():
                stop.wait(0.01)
                yield b""

    def start(tenant: str):
        exp = SimpleNamespace(id=f"exp-{tenant}", run_id=f"run-{tenant}-{len(opened)}", cluster="c", scheduler="nomad", tenant=tenant)
        return run_logs.follow(None, Runner(), exp, run_logs.LogQuery(rank=0), limit=2)

    async def main() -> None:
        a, b = start("finetune"), start("finetune")
        assert [await anext(a), await anext(b)] == ["step 1\n", "step 1\n"]
        with pytest.raises(ApiError) as refused:
            start("finetune")
        assert refused.value.status == 429 and "close a follow" in refused.value.fix
        c, d, e = start("eval"), start("eval"), start("eval")  # all three past the check before any ran
        assert [await anext(c), await anext(d)] == ["step 1\n", "step 1\n"]
        assert "already follows 2 logs at once" in await anext(e) and [x async for x in e] == []
        before = len(opened)
        await b.aclose()
        again = start("finetune")
        assert await anext(again) == "step 1\n" and len(opened) == before + 1
        for stream in (a, again, c, d):
            await stream.aclose()
        assert run_logs._following.count("finetune") == run_logs._following.count("eval") == 0

    asyncio.run(main())


def test_exp_logs_prints_a_note_with_brackets_as_text(capsys):
    """A note quotes the scheduler's words; read as rich markup, "[/v1/...]" was a MarkupError
    (a traceback instead of the logs' source) and "[rank 1]" vanished."""
    from gpufleet.exp_cmd import _print_source

    for note in ('Nomad answered 500 (rpc error: [/v1/client/fs/logs] failed)', "the pod of [rank 1] is gone"):
        _print_source({"source": "stored", "stream": "stdout", "note": note})
        assert note in " ".join(capsys.readouterr().out.split())
