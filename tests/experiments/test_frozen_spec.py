"""Admitted means frozen (issue 25): an experiment is dispatched with the job document admission
checked, whatever happens to the job file afterwards. Before, dispatch re-read the file, so eight
one-GPU runs admitted (and counted by quota and cost) as eight became eight two-GPU runs.

Proved where the scheduler sees it: the GPU count of the Job the Nomad double registered and of
the Job the Kubernetes double created, on real SQLite and PostgreSQL.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from sqlalchemy import select

from experiments.models import Experiment
from experiments.services.catalog import Catalog
from jobs.loader import JOBS_DIR

NOMAD_JOB, GKE_JOB = "finetune-llama", "finetune-llama-gke"
GKE_NS = "research"


def _jobs_copy(tmp_path: Path, catalog: Catalog) -> tuple[Path, Catalog]:
    """The repository's example jobs copied into a directory the test may edit, and a catalog of it."""
    directory = tmp_path / "jobs"
    directory.mkdir()
    for name in (NOMAD_JOB, GKE_JOB):
        shutil.copy(JOBS_DIR / f"{name}.yaml", directory / f"{name}.yaml")
    return directory, Catalog(directory, configs=catalog.configs, vault=catalog.vault)


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{path.name} no longer holds {old!r}"
    path.write_text(text.replace(old, new))


def _nomad_gpus(nomad) -> int:
    """The GPU count of the parameterized job the dispatch registered (Resources.Devices[].Count)."""
    job = nomad.state.jobs[("finetune", NOMAD_JOB)]
    return sum(d["Count"] for group in job["TaskGroups"] for task in group["Tasks"] for d in task["Resources"]["Devices"])


def _gke_gpus(k8s) -> int:
    """Ranks x the training container's nvidia.com/gpu limit of the Job created in the tenant namespace."""
    (job,) = [obj for (resource, ns, _), obj in k8s.store.objects.items() if resource == "jobs" and ns == GKE_NS]
    main = next(c for c in job["spec"]["template"]["spec"]["containers"] if c["name"] == "train")
    return int(job["spec"].get("parallelism") or 1) * int(main["resources"]["limits"]["nvidia.com/gpu"])


def test_an_edited_nomad_job_file_dispatches_the_admitted_gpu_count(make_service, db_url, nomad, nomad_runner, catalog, tmp_path):
    directory, jobs = _jobs_copy(tmp_path, catalog)
    svc = make_service(db_url, nomad_runner, jobs=jobs)
    headers = svc.token("finetune")
    answer = svc.submit(headers, job=NOMAD_JOB)
    assert answer.status_code == 202 and answer.json()["gpus"] == 1
    _edit(directory / f"{NOMAD_JOB}.yaml", "  count: 1\n", "  count: 2\n")
    assert jobs.job(NOMAD_JOB).gpu.count == 2  # the file as edited passes the checks: it is what would run
    svc.step()
    assert len(nomad.dispatched(NOMAD_JOB)) == 1
    assert _nomad_gpus(nomad) == 1


def test_a_deleted_nomad_job_file_still_dispatches_what_was_admitted(make_service, db_url, nomad, nomad_runner, catalog, tmp_path):
    directory, jobs = _jobs_copy(tmp_path, catalog)
    svc = make_service(db_url, nomad_runner, jobs=jobs)
    answer = svc.submit(svc.token("finetune"), job=NOMAD_JOB)
    assert answer.status_code == 202
    (directory / f"{NOMAD_JOB}.yaml").unlink()
    svc.step()
    shown = svc.client.get(f"/api/v1/experiments/{answer.json()['id']}", headers=svc.token("finetune")).json()
    assert shown["status"] in ("queued", "provisioning"), shown["reason"]  # dispatched, then placed by the double
    assert len(nomad.dispatched(NOMAD_JOB)) == 1 and _nomad_gpus(nomad) == 1


def test_an_edited_gke_job_file_creates_the_admitted_ranks(make_service, db_url, k8s, fleet_runner, catalog, tmp_path):
    directory, jobs = _jobs_copy(tmp_path, catalog)
    _edit(directory / f"{GKE_JOB}.yaml", "nodes: 2\n", "nodes: 1\n")
    svc = make_service(db_url, fleet_runner, jobs=jobs)
    answer = svc.submit(svc.token(GKE_NS), job=GKE_JOB, meta={"dataset_uri": "gs://acme-data/chat/v3/", "run_id": "r1"})
    assert answer.status_code == 202 and answer.json()["gpus"] == 8
    _edit(directory / f"{GKE_JOB}.yaml", "nodes: 1\n", "nodes: 2\n")  # GPUs doubled, a file that passes the checks
    assert jobs.job(GKE_JOB).total_gpus == 16
    svc.step()
    assert _gke_gpus(k8s) == 8


def test_a_deleted_gke_job_file_still_creates_the_job(make_service, db_url, k8s, fleet_runner, catalog, tmp_path):
    directory, jobs = _jobs_copy(tmp_path, catalog)
    svc = make_service(db_url, fleet_runner, jobs=jobs)
    answer = svc.submit(svc.token(GKE_NS), job=GKE_JOB, meta={"dataset_uri": "gs://acme-data/chat/v3/", "run_id": "r1"})
    assert answer.status_code == 202
    (directory / f"{GKE_JOB}.yaml").unlink()
    svc.step()
    assert _gke_gpus(k8s) == 16


def test_the_frozen_document_holds_vault_references_and_its_digest(make_service, sqlite_url, nomad_runner, catalog, tmp_path):
    """What is stored is the checked document: the secret is a Vault reference (path#key), never a value."""
    _, jobs = _jobs_copy(tmp_path, catalog)
    svc = make_service(sqlite_url, nomad_runner, jobs=jobs)
    assert svc.submit(svc.token("finetune"), job=NOMAD_JOB).status_code == 202
    with svc.ctx.sessions() as session:
        exp = session.scalars(select(Experiment)).one()
        document, digest = exp.job_spec, exp.job_spec_sha256
    assert document["gpu"]["count"] == 1 and document["secrets"]["env"] == {"HF_TOKEN": "ml-api-keys/huggingface#token"}
    assert digest is not None and len(digest) == 64


def test_a_frozen_spec_is_checked_once_per_digest_and_an_altered_row_is_still_refused(catalog, tmp_path, monkeypatch):
    """Dispatch asks for the frozen spec of every run; a burst of one job checked the same document each
    time. The checked spec is kept per name and digest, but the digest is recomputed from the row every
    time, so a document altered under its old digest is refused even once that digest's spec is kept."""
    import experiments.services.catalog as catalog_module
    from experiments.errors import ApiError
    from jobs.loader import document_sha256

    _, jobs = _jobs_copy(tmp_path, catalog)
    document = jobs.admit(NOMAD_JOB)[1]
    digest = document_sha256(document)
    checks = []
    real = catalog_module.load_frozen
    monkeypatch.setattr(catalog_module, "load_frozen", lambda *a, **k: checks.append(1) or real(*a, **k))
    first = jobs.frozen(NOMAD_JOB, document, digest)
    assert jobs.frozen(NOMAD_JOB, document, digest) is first and len(checks) == 1
    altered = {**document, "gpu": {**document["gpu"], "count": 8}}
    try:
        jobs.frozen(NOMAD_JOB, altered, digest)
    except ApiError as exc:
        assert "does not match its digest" in exc.error
    else:
        raise AssertionError("an altered document was served under the kept digest")
    assert len(checks) == 1


def test_a_frozen_document_that_fails_its_checks_is_refused_every_time(catalog, tmp_path):
    """Only specs that pass are kept: a document that no longer passes is checked, and refused, each time."""
    from experiments.errors import ApiError
    from jobs.loader import document_sha256

    _, jobs = _jobs_copy(tmp_path, catalog)
    document = jobs.admit(NOMAD_JOB)[1]
    bad = {**document, "cluster": "no-such-cluster"}
    for _ in range(2):
        try:
            jobs.frozen(NOMAD_JOB, bad, document_sha256(bad))
        except ApiError as exc:
            assert "no longer passes gpufleet check" in exc.error
        else:
            raise AssertionError("a document that fails its checks was served")


def test_kept_frozen_specs_are_capped_and_each_distinct_document_is_checked(catalog, tmp_path, monkeypatch):
    """Each distinct document (digest) is checked, secret detector included, the first time it is seen, and
    at most ``FROZEN_KEPT`` checked specs are kept, the least recently used going first."""
    import experiments.services.catalog as catalog_module
    from jobs.loader import document_sha256

    _, jobs = _jobs_copy(tmp_path, catalog)
    document = jobs.admit(NOMAD_JOB)[1]
    monkeypatch.setattr(catalog_module, "FROZEN_KEPT", 2)
    checks: list[str] = []
    real = catalog_module.load_frozen
    monkeypatch.setattr(catalog_module, "load_frozen", lambda doc, *a, **k: checks.append(document_sha256(doc)) or real(doc, *a, **k))
    docs = [{**document, "command": f"{document['command']} --seed {i}"} if "command" in document else {**document, "image": f"{document['image']}-{i}"}
            for i in range(3)]
    digests = [document_sha256(d) for d in docs]
    assert len(set(digests)) == 3
    for d, digest in zip(docs, digests):
        jobs.frozen(NOMAD_JOB, d, digest)
    assert checks == digests  # every distinct content checked once
    jobs.frozen(NOMAD_JOB, docs[2], digests[2])
    jobs.frozen(NOMAD_JOB, docs[1], digests[1])
    assert checks == digests  # the two most recent are kept
    jobs.frozen(NOMAD_JOB, docs[0], digests[0])
    assert checks == [*digests, digests[0]] and len(jobs._frozen) == 2  # the first was evicted, checked again
