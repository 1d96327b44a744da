"""No oracles (issue 22): what the API tells a caller does not depend on files it may not see.

- /metrics (every tenant's runs per state and cluster) needs an admin token; the OpenAPI
  document needs any API token; the Swagger page is not served.
- A job name is looked up among jobs/' file names, never joined into a path: names with ``/``
  or ``..`` and names of files that exist outside jobs/ get the same answer as any unknown name.
- A job file that fails its checks is named relative to the repository, never by the server's path.

All through the app over HTTP (Starlette's TestClient), with the tokens the service issues.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from experiments.app import ServiceSettings, create_app
from experiments.auth import create_token
from experiments.services.catalog import Catalog
from tests.conftest import REPO_ROOT
from tests.experiments.conftest import UnusedRunner

META = {"dataset_uri": "hf://datasets/acme/chat@v3", "run_id": "r1"}


@pytest.fixture
def svc(make_service, sqlite_url):
    return make_service(sqlite_url, UnusedRunner())


def test_fails_when_metrics_are_read_without_an_admin_token(svc):
    assert svc.client.get("/metrics").status_code == 401
    tenant = svc.client.get("/metrics", headers=svc.token("finetune"))
    assert tenant.status_code == 403 and tenant.json()["field"] == "Authorization" and "admin token" in tenant.json()["error"]
    admin = svc.client.get("/metrics", headers=svc.token(None, admin=True))
    assert admin.status_code == 200 and "gpufleet_experiments" in admin.text


def test_fails_when_the_api_schema_is_read_without_a_token(svc):
    anonymous = svc.client.get("/api/openapi.json")
    assert anonymous.status_code == 401 and "paths" not in anonymous.text
    schema = svc.client.get("/api/openapi.json", headers=svc.token("finetune"))
    assert schema.status_code == 200 and "/api/v1/experiments" in schema.json()["paths"]
    assert "/metrics" not in schema.json()["paths"] and "/api/openapi.json" not in schema.json()["paths"]
    assert svc.client.get("/api/docs").status_code == 404 and svc.client.get("/docs").status_code == 404


def _answer(svc, headers, name: str) -> tuple[int, str, str | None, str]:
    """The answer to a submission naming ``name``, with the echoed name and its did-you-mean (a function of the
    name and jobs/' file names, the caller's own input) left out: what remains must not depend on the disk."""
    answer = svc.client.post("/api/v1/experiments", json={"job": name, "meta": META}, headers=headers)
    body = answer.json()
    error = re.sub(r" \(did you mean '[^']*'\?\)", "", body["error"].replace(repr(name), "<name>"))
    return answer.status_code, error, body["field"], body["fix"]


def test_fails_when_a_job_name_probes_files_outside_jobs(svc, tmp_path):
    """Each pair: a name whose target exists on the server, and the same shape whose target does not.
    Before: the existing one answered "is not a job name", the other "no job ...": a file oracle."""
    outside = tmp_path / "server-side" / "private.yaml"
    outside.parent.mkdir()
    outside.write_text("name: private\n")
    headers = svc.token("finetune")
    pairs = [
        ("../clusters/prod-gke", "../clusters/prod-gkq"),
        (str(outside), str(outside.with_name("absent.yaml"))),
        (str(outside.with_suffix("")), str(outside.with_name("absent"))),
        ("finetune-llama/../finetune-llama", "finetune-lqama/../finetune-lqama"),
        ("../jobs/finetune-llama", "../jobs/finetune-lqama"),
    ]
    for existing, missing in pairs:
        seen, unseen = _answer(svc, headers, existing), _answer(svc, headers, missing)
        assert seen == unseen, (existing, seen, unseen)
        assert seen[0] == 422 and seen[1] == "no job <name>" and seen[2] == "job" and str(tmp_path) not in str(seen)


def test_job_file_errors_name_the_file_relative_to_the_repository(sqlite_url, catalog, tmp_path):
    repo = tmp_path / "srv" / "fleet"
    (repo / "jobs").mkdir(parents=True)
    shutil.copy(REPO_ROOT / "jobs" / "finetune-llama.yaml", repo / "jobs" / "broken.yaml")
    text = (repo / "jobs" / "broken.yaml").read_text().replace("name: finetune-llama", "name: broken").replace("  pool: a100\n", "  pool: a1000\n")
    (repo / "jobs" / "broken.yaml").write_text(text)
    served = Catalog(repo / "jobs", configs=catalog.configs, vault=catalog.vault)
    app = create_app(ServiceSettings(db_url=sqlite_url, worker=False), runner=UnusedRunner(), catalog=served)
    with TestClient(app) as client:
        with app.state.ctx.sessions() as session, session.begin():
            token = create_token(session, tenant="finetune", admin=False, name="t", now=app.state.ctx.clock())[1]
        answer = client.post("/api/v1/experiments", json={"job": "broken", "meta": META}, headers={"Authorization": f"Bearer {token}"})
    body = answer.json()
    assert answer.status_code == 422 and body["field"] == "job", body
    assert str(tmp_path) not in answer.text and "/srv/" not in answer.text
    assert re.match(r"job file broken\.yaml does not pass gpufleet check: jobs/broken\.yaml:\d+: gpu\.pool: ", body["error"]), body["error"]
