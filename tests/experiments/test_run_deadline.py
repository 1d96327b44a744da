"""The experiment's deadline is enforced by the scheduler itself (issue 25, "no tenant can overspend").

Admission prices a run at GPUs x ``deadline_hours`` x price; before this, only gpufleet's reaper stopped
a run at that deadline while the scheduler's own bound was the job's ``max_run_hours``. Proved where the
schedulers see it: the dispatch call the Nomad double received (its meta, and the child job's task env
interpolated the way a Nomad client does it, then read by gpufleet-exec's own ``run_limits``), and the Job
the Kubernetes double was asked to create (``activeDeadlineSeconds`` and the container env). A retry's
next attempt gets only what is left of the one deadline. SQLite and PostgreSQL (``db_url``).

Nomad's rules checked against hashicorp/nomad v1.10.5: a dispatch key the parent declares neither
required nor optional is refused (nomad/job_endpoint.go validateDispatchRequest :2175-2194; the double
does the same), and ``${NOMAD_META_<key>}`` of an absent key stays as written (helper/args/args.go
ReplaceEnv :9-26, the regexp and the fallback that ``_nomad_env`` below reproduces).
"""

from __future__ import annotations

import re
from typing import Any

from experiments.background.context import Timing
from jobs.loader import JOBS_DIR, load
from jobs.spec import RUN_DEADLINE_META
from vault_policies.exec import run_limits

PARENT, NOMAD_NS = "finetune-llama", "finetune"
GKE_JOB, GKE_NS = "finetune-llama-gke", "research"
GKE_META = {"dataset_uri": "gs://acme-data/chat/v3/", "run_id": "llama-chat-gke-1"}
BACKOFF = Timing().retry_backoff_seconds
_ENV_REF = re.compile(r"\$\{([a-zA-Z0-9_\-\.]+)\}")  # helper/args/args.go:9 envRe


def _state(svc, exp_id, headers):
    return svc.client.get(f"/api/v1/experiments/{exp_id}", headers=headers).json()


def _nomad_env(nomad, child: str) -> dict[str, str]:
    """The train task's env as the Nomad client hands it over: each ``${NOMAD_META_<key>}`` replaced from the
    dispatched child's Meta (exposed as given and upper-cased), an unknown name left as written."""
    job = nomad.state.jobs[(NOMAD_NS, child)]
    known = {f"NOMAD_META_{k}": v for k, v in job["Meta"].items()} | {f"NOMAD_META_{k.upper()}": v for k, v in job["Meta"].items()}
    (task,) = [t for g in job["TaskGroups"] for t in g["Tasks"]]
    return {name: _ENV_REF.sub(lambda m: known.get(m.group(1), m.group(0)), value) for name, value in task["Env"].items()}


def _dispatch_meta(nomad) -> list[dict[str, Any]]:
    return [call.body["Meta"] for call in nomad.calls("POST", "dispatch")]


def test_a_one_hour_nomad_run_is_bounded_by_gpufleet_exec_at_3600_seconds(make_service, db_url, nomad, nomad_runner):
    svc = make_service(db_url, nomad_runner)
    headers = svc.token("finetune")
    exp = svc.submit(headers, deadline_hours=1).json()
    svc.step()
    (child,) = nomad.dispatched(PARENT)
    assert _dispatch_meta(nomad)[0][RUN_DEADLINE_META] == "3600"
    env = _nomad_env(nomad, child)
    assert env["GPUFLEET_MAX_RUN_SECONDS"] == "43200"  # the job's max_run_hours: 12 h, what the scheduler enforced alone before
    assert env["GPUFLEET_RUN_DEADLINE_SECONDS"] == "3600"
    assert run_limits(env)[0] == 3600  # what gpufleet-exec enforces in that task
    assert _state(svc, exp["id"], headers)["deadline_hours"] == 1


def test_an_operator_dispatch_without_the_key_keeps_the_jobs_own_bound(nomad, nomad_runner):
    """Declared optional: a dispatch without it is accepted, and the job's max_run_hours still binds in gpufleet-exec."""
    spec = load(JOBS_DIR / f"{PARENT}.yaml")
    run_id = nomad_runner.submit(spec, {"dataset_uri": "hf://datasets/acme/chat@v3", "run_id": "r1"}, idempotency_key="operator-1")
    child = run_id.partition("/")[2]
    env = _nomad_env(nomad, child)
    assert env["GPUFLEET_RUN_DEADLINE_SECONDS"] == "${NOMAD_META_gpufleet_run_deadline_seconds}"
    assert run_limits(env)[0] == 43200


def test_a_one_hour_gke_run_gets_active_deadline_seconds_3600(make_service, db_url, k8s, fleet_runner):
    svc = make_service(db_url, fleet_runner)
    headers = svc.token(GKE_NS)
    svc.client.post("/api/v1/experiments", json={"job": GKE_JOB, "meta": GKE_META, "deadline_hours": 1}, headers=headers).raise_for_status()
    svc.step()
    (created,) = [r.body for r in k8s.created("jobs")]
    assert created["spec"]["activeDeadlineSeconds"] == 3600  # the Job controller fails the Job (DeadlineExceeded) then
    env = {e["name"]: e.get("value") for e in created["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["GPUFLEET_RUN_DEADLINE_SECONDS"] == "3600" and run_limits(env)[0] == 3600
    assert not any(name.endswith(RUN_DEADLINE_META) for name in env)  # platform meta, not a user GPUFLEET_META_ variable


def _lose_after(svc, nomad, headers, *, running_minutes: float):
    exp = svc.submit(headers, deadline_hours=1).json()
    svc.step()
    (first,) = nomad.dispatched(PARENT)
    nomad.start_task(first)
    svc.step()
    assert _state(svc, exp["id"], headers)["status"] == "running"
    svc.clock.advance(minutes=running_minutes)
    nomad.lose_node(first)
    svc.step()
    assert _state(svc, exp["id"], headers)["status"] == "retrying"
    svc.clock.advance(seconds=BACKOFF + 1)
    svc.step()
    return exp


def test_a_retry_gets_only_what_is_left_of_the_one_deadline(make_service, db_url, nomad, nomad_runner):
    svc = make_service(db_url, nomad_runner)
    headers = svc.token("finetune")
    exp = _lose_after(svc, nomad, headers, running_minutes=20)
    children = nomad.dispatched(PARENT)
    assert len(children) == 2
    first, second = (int(m[RUN_DEADLINE_META]) for m in _dispatch_meta(nomad))
    assert first == 3600
    assert second == 3600 - 20 * 60 - (BACKOFF + 1)  # the deadline counts from attempt 1's placement, not a fresh hour
    assert run_limits(_nomad_env(nomad, children[1]))[0] == second
    assert _state(svc, exp["id"], headers)["attempt"] == 2


def test_a_retry_after_the_deadline_is_spent_is_not_dispatched(make_service, db_url, nomad, nomad_runner):
    svc = make_service(db_url, nomad_runner)
    headers = svc.token("finetune")
    exp = _lose_after(svc, nomad, headers, running_minutes=59.5)
    assert len(nomad.dispatched(PARENT)) == 1
    shown = _state(svc, exp["id"], headers)
    assert shown["status"] == "expired" and "spent by earlier attempts" in shown["reason"]
