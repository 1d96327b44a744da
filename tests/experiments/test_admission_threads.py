"""Submissions run on threads of their own (``routers.deps.admission_limiter``): on PostgreSQL at most
``ADMISSION_THREADS["postgresql"]`` admissions at once, however many clients submit, and a submit is
not held back when every thread of anyio's default pool (what the other sync routes share) is taken.
SQLite keeps anyio's default of 40. Through the real app (FastAPI, anyio) on real databases."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from experiments.app import ADMISSION_THREADS
from experiments.services import experiments as service
from tests.experiments.conftest import UnusedRunner
from tests.experiments.test_submit_path import _without_budgets

META = {"dataset_uri": "hf://datasets/acme/chat@v3"}


def test_postgresql_admits_on_at_most_its_admission_threads(make_service, pg_url, catalog, monkeypatch):
    """32 clients at once (barrier rounds of ADMISSION_THREADS["postgresql"]): never more admissions than that run together, and every one is admitted once."""
    svc = make_service(pg_url, UnusedRunner(), jobs=_without_budgets(catalog, quota=10_000))
    headers = svc.token("finetune")
    running, most, lock = 0, 0, threading.Lock()
    gate = threading.Barrier(ADMISSION_THREADS["postgresql"], timeout=20)  # every admission thread inside at once
    submit = service.submit

    def counted(*args, **kwargs):
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        try:
            try:
                gate.wait()
            except threading.BrokenBarrierError:
                pass  # a round did not fill (the limit is not in force): the count below says so
            return submit(*args, **kwargs)
        finally:
            with lock:
                running -= 1

    monkeypatch.setattr(service, "submit", counted)
    with ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(lambda i: svc.submit({**headers, "Idempotency-Key": f"k{i}"}, meta={**META, "run_id": f"r{i}"}), range(32)))
    assert [a.status_code for a in answers] == [202] * 32
    assert len({a.json()["id"] for a in answers}) == 32
    assert most == ADMISSION_THREADS["postgresql"]


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_a_submit_passes_while_every_default_thread_is_taken(kind, make_service, request, catalog, monkeypatch):
    """40 list requests hold all of anyio's default threads (as slow scheduler reads would); a submit
    still gets through, on its own threads."""
    url = request.getfixturevalue("pg_url" if kind == "postgresql" else "sqlite_url")
    svc = make_service(url, UnusedRunner(), jobs=_without_budgets(catalog))
    headers = svc.token("finetune")
    release, held = threading.Event(), threading.Semaphore(0)
    list_visible = service.list_visible

    def blocked(*args, **kwargs):
        held.release()
        release.wait(60)
        return list_visible(*args, **kwargs)

    monkeypatch.setattr(service, "list_visible", blocked)
    with ThreadPoolExecutor(40) as pool, ThreadPoolExecutor(1) as submitter:
        lists = [pool.submit(svc.client.get, "/api/v1/experiments", headers=headers) for _ in range(40)]
        try:
            for _ in range(40):
                assert held.acquire(timeout=30), "the 40 list requests did not all start"
            answer = submitter.submit(svc.submit, {**headers, "Idempotency-Key": "k"}, meta={**META, "run_id": "r"})
            assert answer.result(timeout=30).status_code == 202
        finally:
            release.set()
        assert all(f.result().status_code == 200 for f in lists)


def test_sqlite_keeps_anyios_default_of_40(make_service, sqlite_url):
    assert make_service(sqlite_url, UnusedRunner()).client.app.state.admission_threads == ADMISSION_THREADS["sqlite"] == 40
