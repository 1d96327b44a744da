"""Ad-hoc job files (issue 27): ``POST /api/v1/experiments`` with ``job_file`` (the YAML text) instead of
a job name, ``gpufleet exp submit -f job.yaml``. Admitted through the loader's own path (schema, secret
detector, cross-checks, quota), allowed only for a tenant whose cluster file says ``adhoc_jobs: true``,
stored as the frozen spec and dispatched from it. Real SQLite and PostgreSQL, the Nomad API double.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from sqlalchemy import func, select

import clusters
from experiments.models import Experiment
from experiments.services.catalog import Catalog
from gpufleet.cli import main
from jobs.loader import JOBS_DIR
from tests.conftest import FLEET_CLUSTERS, REPO_ROOT, load_fleet

META = {"dataset_uri": "hf://datasets/acme/chat@v3", "run_id": "r1"}
PLANTED = "hf_" + "Q7x9Lm2Pz4Kd8Rt6Wv3Ny5Bc1"  # a Hugging Face token shape the detector knows (clusters/secrets.py)


@pytest.fixture(scope="module")
def catalog(tmp_path_factory) -> Catalog:
    """The suite's example fleet with ``adhoc_jobs: true`` on tenant finetune of prod-nomad (a copy; eval and
    research keep the default, false), loaded through the cluster loader so the schema field is exercised."""
    directory = tmp_path_factory.mktemp("adhoc") / "clusters"
    shutil.copytree(FLEET_CLUSTERS, directory)
    path = directory / "prod-nomad.yaml"
    text = path.read_text()
    quota = "  - name: finetune\n    groups: [group:ml-finetune@example.com]\n    gpu_quota: {a100: 8, l4: 6}\n"
    assert text.count(quota) == 1, "tests/fleet/clusters/prod-nomad.yaml changed its finetune tenant"
    path.write_text(text.replace(quota, quota + "    adhoc_jobs: true\n"))
    return Catalog(configs=clusters.load_all(directory), vault=Catalog(configs=load_fleet()).vault)


def job_text(*edits: tuple[str, str]) -> str:
    """The example finetune-llama job renamed adhoc-llama (no such file in jobs/), with ``edits`` applied."""
    text = (JOBS_DIR / "finetune-llama.yaml").read_text().replace("name: finetune-llama\n", "name: adhoc-llama\n")
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return text


# The same job for tenant eval (no adhoc_jobs flag), reading a key its Vault role may read: it passes every other check.
EVAL_JOB = job_text(("tenant: finetune\n", "tenant: eval\n"), ("role: finetune\n", "role: eval\n"),
                    ("HF_TOKEN: ml-api-keys/huggingface#token", "HF_TOKEN: ml-api-keys/openai#api_key"), ("max_run_hours: 12\n", "max_run_hours: 2\n"))


def post(svc, headers, text: str, **body):
    return svc.client.post("/api/v1/experiments", json={"job_file": text, "meta": META, **body}, headers=headers)


def stored(svc) -> int:
    with svc.ctx.sessions() as session:
        return session.scalar(select(func.count()).select_from(Experiment))


def test_an_adhoc_job_file_is_admitted_stored_and_dispatched_as_sent(make_service, db_url, nomad, nomad_runner):
    svc = make_service(db_url, nomad_runner)
    text = job_text(("  count: 1\n", "  count: 2\n"), ('"300"', '"7"'))
    answer = post(svc, svc.token("finetune"), text)
    assert answer.status_code == 202, answer.json()
    exp = answer.json()
    assert (exp["job"], exp["gpus"], exp["tenant"]) == ("adhoc-llama", 2, "finetune")
    with svc.ctx.sessions() as session:
        row = session.get(Experiment, exp["id"])
        assert row.job_spec["name"] == "adhoc-llama" and row.job_spec["gpu"]["count"] == 2 and len(row.job_spec_sha256) == 64
    svc.step()
    job = nomad.state.jobs[("finetune", "adhoc-llama")]
    args = [a for g in job["TaskGroups"] for t in g["Tasks"] for a in t["Config"]["args"]]
    at = args.index("jobs/tasks/tiny_finetune.py")
    assert args[at:at + 3] == ["jobs/tasks/tiny_finetune.py", "--steps", "7"], args
    assert sum(d["Count"] for g in job["TaskGroups"] for t in g["Tasks"] for d in t["Resources"]["Devices"]) == 2
    assert len(nomad.dispatched("adhoc-llama")) == 1
    again = post(svc, {**svc.token("finetune"), "Idempotency-Key": "k1"}, text)
    assert post(svc, {**svc.token("finetune"), "Idempotency-Key": "k1"}, text).json()["id"] == again.json()["id"]
    assert post(svc, {**svc.token("finetune"), "Idempotency-Key": "k1"}, job_text()).status_code == 409  # another file, same key


def test_a_tenant_without_the_flag_gets_403_and_nothing_is_stored(make_service, db_url, nomad_runner):
    svc = make_service(db_url, nomad_runner)
    answer = post(svc, svc.token("eval"), EVAL_JOB)
    assert answer.status_code == 403
    assert answer.json()["field"] == "job_file" and "adhoc_jobs: true" in answer.json()["fix"]
    admin = post(svc, svc.token(None, admin=True), EVAL_JOB)
    assert admin.status_code == 403, admin.json()  # the flag is the tenant's policy, an admin token included
    assert stored(svc) == 0


def test_a_planted_credential_is_422_never_echoed_nor_stored(make_service, db_url, nomad_runner):
    svc = make_service(db_url, nomad_runner)
    answer = post(svc, svc.token("finetune"), job_text(("  TOKENIZERS_PARALLELISM: \"false\"\n", f"  TOKENIZERS_PARALLELISM: \"false\"\n  HF_API: {PLANTED}\n")))
    assert answer.status_code == 422
    assert PLANTED not in answer.text and PLANTED[3:] not in answer.text
    assert answer.json()["error"].startswith("job_file:") and "credential" in answer.text.lower()
    assert stored(svc) == 0


def test_a_schema_error_names_job_file_its_line_and_field_and_no_server_path(make_service, sqlite_url, nomad_runner):
    svc = make_service(sqlite_url, nomad_runner)
    text = job_text(("priority: 60\n", "priority: lots\n"))
    line = text.splitlines().index("priority: lots") + 1
    answer = post(svc, svc.token("finetune"), text)
    assert answer.status_code == 422
    body = answer.json()
    assert body["error"].startswith(f"job_file:{line}: priority:") and body["field"] == "job_file.priority"
    assert str(REPO_ROOT) not in answer.text and "/tmp" not in answer.text
    unknown = post(svc, svc.token("finetune"), job_text(("cluster: prod-nomad\n", "cluster: prod-nomda\n")))
    assert unknown.status_code == 422 and unknown.json()["error"].startswith("job_file:") and "prod-nomad" in unknown.json()["error"]


def test_the_tenant_quota_still_holds(make_service, db_url, nomad_runner):
    """finetune's a100 quota is 8 GPUs: four two-GPU ad-hoc runs fit, the fifth is 409."""
    svc = make_service(db_url, nomad_runner)
    text = job_text(("  count: 1\n", "  count: 2\n"))
    assert [post(svc, svc.token("finetune"), text).status_code for _ in range(4)] == [202] * 4
    refused = post(svc, svc.token("finetune"), text)
    assert refused.status_code == 409 and "quota" in refused.json()["error"]
    assert stored(svc) == 4


def test_job_and_job_file_are_one_or_the_other(make_service, sqlite_url, nomad_runner):
    svc = make_service(sqlite_url, nomad_runner)
    both = svc.client.post("/api/v1/experiments", json={"job": "finetune-llama", "job_file": job_text(), "meta": META}, headers=svc.token("finetune"))
    neither = svc.client.post("/api/v1/experiments", json={"meta": META}, headers=svc.token("finetune"))
    assert (both.status_code, neither.status_code) == (422, 422) and "job_file" in both.json()["fix"]


def test_exp_submit_f_sends_the_local_file_and_errors_name_it(live, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("GPUFLEET_API", live["base"])
    monkeypatch.setenv("GPUFLEET_API_TOKEN", live["tokens"]["finetune"])
    path = tmp_path / "job.yaml"
    path.write_text(job_text())
    meta = ["--meta", f"dataset_uri={META['dataset_uri']}", "--meta", f"run_id={META['run_id']}"]
    assert main(["exp", "submit", "-f", str(path), *meta, "--json"]) == 0
    exp = json.loads(capsys.readouterr().out)
    assert (exp["job"], exp["status"]) == ("adhoc-llama", "pending")
    path.write_text(job_text(("priority: 60\n", "priority: lots\n")))
    line = path.read_text().splitlines().index("priority: lots") + 1
    code = main(["exp", "submit", "-f", str(path), *meta])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and f"{path}:{line}: priority:" in err and "Traceback" not in err
    assert main(["exp", "submit", "-f", str(tmp_path / "missing.yaml"), *meta]) == 2
    assert "cannot read the job file" in capsys.readouterr().err
    monkeypatch.setenv("GPUFLEET_API_TOKEN", live["tokens"]["eval"])
    path.write_text(EVAL_JOB)
    assert main(["exp", "submit", "-f", str(path), *meta]) == 2
    assert capsys.readouterr().err.startswith("error: 403: ")
