"""Red-team review of issue 28's submit path, fourth round: what the admission threads, the kept
listing of jobs/ and the single-statement token lookup must not break. On real databases
(SQLite, embedded PostgreSQL) and through uvicorn where threads matter."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import jwt

from experiments.app import ADMISSION_THREADS, ServiceSettings, create_app
from experiments.auth import OidcSettings, create_token
from experiments.jwks import JwksTiming
from tests.experiments.conftest import FakeClock, UnusedRunner
from tests.experiments.test_jwks import AUDIENCE, ISSUER, issuer  # noqa: F401 (the fixture)
from tests.experiments.test_submit_path import _without_budgets
from tests.experiments.uvicorn_server import serve

META = {"dataset_uri": "hf://datasets/acme/chat@v3"}


def _junk(i: int) -> str:
    """An unauthenticated JWT with a kid the issuer never had: it waits for the issuer's keys."""
    return jwt.encode({"sub": "x"}, "not-a-key-of-anyone-000000000000", algorithm="HS256", headers={"kid": f"junk-{i}"})


def test_garbage_jwts_on_the_submit_route_do_not_hold_back_api_token_submits(pg_url, catalog, issuer):  # noqa: F811
    """The JWKS cache lets ``max_waiters`` (4) requests wait for a stalled issuer, sized so they
    cannot take the request threads API-token callers need (security round three). On PostgreSQL
    the submit route has only 4 admission threads: if the OIDC wait ran on them, four unauthenticated
    garbage JWTs sent to POST /experiments stalled every tenant's submit for as long as the issuer
    stalls. An OIDC token's check must wait where it waited before, not on the admission threads."""
    timing = JwksTiming(fetch_timeout_seconds=60, wait_seconds=60)
    oidc = OidcSettings(issuer=ISSUER, audience=AUDIENCE, jwks_url=issuer.url, claim="repository_owner", tenants=(("acme-finetune", "finetune"),),
                        jwks_timing=timing)
    issuer.stalled.set()  # accepts and never answers
    clock = FakeClock()
    app = create_app(ServiceSettings(db_url=pg_url, worker=False, oidc=oidc), runner=UnusedRunner(), catalog=_without_budgets(catalog), clock=clock)
    assert app.state.admission_threads == ADMISSION_THREADS["postgresql"] == timing.max_waiters
    with app.state.ctx.sessions() as session, session.begin():
        token = create_token(session, tenant="finetune", admin=False, name="t", now=clock())[1]
    with serve(app) as base, ThreadPoolExecutor(timing.max_waiters) as flood:
        def garbage_submit(i: int) -> int:
            try:
                return httpx.post(f"{base}/api/v1/experiments", json={"job": "finetune-llama", "meta": {**META, "run_id": f"g{i}"}},
                                  headers={"Authorization": f"Bearer {_junk(i)}"}, timeout=90).status_code
            except httpx.HTTPError:
                return 0

        waiting = [flood.submit(garbage_submit, i) for i in range(timing.max_waiters)]
        deadline = time.monotonic() + 30
        while app.state.jwks._waiters._value:  # every waiter's place is taken (BoundedSemaphore's count)
            assert time.monotonic() < deadline, "the garbage submits never all waited for the issuer"
            time.sleep(0.05)
        try:
            answer = httpx.post(f"{base}/api/v1/experiments", json={"job": "finetune-llama", "meta": {**META, "run_id": "tenant"}},
                                headers={"Authorization": f"Bearer {token}", "Idempotency-Key": "tenant"}, timeout=20)
        except httpx.ReadTimeout:
            raise AssertionError("an API-token submit waited behind garbage JWTs for the stalled issuer's keys") from None
        finally:
            issuer.close()  # the fetch fails at once, the waiters are answered
        assert answer.status_code == 202, answer.text
        assert all(f.result(timeout=90) in (401, 503) for f in waiting)


def _jobs(tmp_path, catalog):
    import shutil

    from experiments.services.catalog import Catalog
    from jobs.loader import JOBS_DIR

    directory = tmp_path / "jobs"
    directory.mkdir()
    shutil.copy(JOBS_DIR / "finetune-llama.yaml", directory / "finetune-llama.yaml")
    return directory, Catalog(directory, configs=catalog.configs, vault=catalog.vault)


def test_an_edit_within_the_files_mtime_tick_is_seen(tmp_path, catalog):
    """An edit in place moves the file's mtime, not the directory's, so the checked spec is kept by the
    file's mtime. The kernel stamps mtimes from a coarse clock (a jiffy; a second or two on some
    filesystems): a spec read between two writes of the same tick must not be served after the second
    write. Before: the spec of the first write (here priority 60) was admitted for good."""
    import os

    directory, jobs = _jobs(tmp_path, catalog)
    path = directory / "finetune-llama.yaml"
    assert jobs.admit("finetune-llama")[0].priority == 60
    status = path.stat()
    path.write_text(path.read_text().replace("priority: 60", "priority: 61"))  # same size, same inode
    os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns))  # the second write landed in the same tick
    assert path.stat().st_mtime_ns == status.st_mtime_ns
    assert jobs.admit("finetune-llama")[0].priority == 61


def test_a_job_file_removed_under_a_kept_listing_is_an_unknown_job_not_a_500(tmp_path, catalog):
    """A listing is kept while the directory's mtime stays put; a filesystem whose mtime did not move
    (a coarse stamp restored, NFS attribute caching) leaves a removed file in it. The submit must get
    the unknown job's 422, not FileNotFoundError (a 500)."""
    import os
    import time

    from experiments.errors import ApiError

    directory, jobs = _jobs(tmp_path, catalog)
    stamp = time.time_ns() - 60 * 1_000_000_000
    os.utime(directory, ns=(stamp, stamp))
    jobs.admit("finetune-llama")
    (directory / "finetune-llama.yaml").unlink()
    os.utime(directory, ns=(stamp, stamp))
    try:
        jobs.admit("finetune-llama")
    except ApiError as refused:
        assert refused.status == 422 and "no job 'finetune-llama'" in str(refused)
    else:
        raise AssertionError("a removed job file was admitted")


def test_a_budgeted_tenants_submits_waiting_on_its_lock_do_not_hold_back_other_tenants(make_service, pg_url, catalog):
    """A tenant with a money budget always takes the transactional path, which waits for the tenant's
    budget lock (``budgets.lock``, a transaction-scoped advisory lock) while its transaction runs. On
    the 4 admission threads, 4 of its submits waiting for that lock held back every other tenant's
    submit (measured, a budgeted burst of 40 clients: another tenant's p50 325 ms on 4 threads, 18 ms
    on 40). Here the lock is held by an outside transaction (a slow budgeted submit) while 8 of the
    budgeted tenant's submits wait on it: a submit of tenant eval (no budget) is still answered."""
    import psycopg
    import zlib
    from experiments.services.catalog import Catalog

    def tenant(t):  # quotas out of the way; eval without a budget, finetune keeps its $50,000
        return t.model_copy(update={"gpu_quota": {p: 10_000 for p in t.gpu_quota}, **({"budget_usd_month": None} if t.name == "eval" else {})})

    jobs = Catalog(configs=tuple(c.model_copy(update={"tenants": [tenant(t) for t in c.tenants]}) for c in catalog.configs))
    svc = make_service(pg_url, UnusedRunner(), jobs=jobs)
    finetune, eval_ = svc.token("finetune"), svc.token("eval")
    assert svc.submit({**eval_, "Idempotency-Key": "warm"}, job="eval-judge", meta={**META, "run_id": "warm"}).status_code == 202
    waiting = ADMISSION_THREADS["postgresql"] * 2
    with psycopg.connect(pg_url.replace("postgresql+psycopg://", "postgresql://")) as holder, ThreadPoolExecutor(waiting + 1) as pool:
        holder.execute("SELECT pg_advisory_xact_lock(%s)", (zlib.crc32(b"budget:prod-nomad/finetune"),))  # held until the block ends
        blocked = [pool.submit(svc.submit, {**finetune, "Idempotency-Key": f"f{i}"}, meta={**META, "run_id": f"f{i}"}) for i in range(waiting)]
        deadline = time.monotonic() + 30
        while holder.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted").fetchone()[0] < ADMISSION_THREADS["postgresql"]:
            assert time.monotonic() < deadline, "the budgeted submits never waited for the lock"
            time.sleep(0.05)
        other = pool.submit(svc.submit, {**eval_, "Idempotency-Key": "e"}, job="eval-judge", meta={**META, "run_id": "e"})
        try:
            answer = other.result(timeout=20)
        except TimeoutError:
            raise AssertionError("tenant eval's submit waited behind tenant finetune's submits queued on its budget lock") from None
        finally:
            holder.rollback()  # the lock goes with the transaction
        assert answer.status_code == 202, answer.text
        assert [f.result(timeout=60).status_code for f in blocked] == [202] * waiting


@pytest.fixture
def broken_prices(tmp_path, monkeypatch):
    """prices.yaml as a hand edit can leave it; the service must not start (uvicorn.run refuses)."""
    import uvicorn

    from experiments.services import cost

    real = cost.load_prices

    def use(text: str):
        path = tmp_path / "prices.yaml"
        path.write_text(text)
        monkeypatch.setattr(cost, "load_prices", lambda path=path: real.__wrapped__(path))
        monkeypatch.setattr(uvicorn, "run", lambda *a, **k: (_ for _ in ()).throw(AssertionError("gpufleet serve started with a broken prices.yaml")))
        return path

    return use


@pytest.mark.parametrize("text", ["source: x\ndate: 2026-12-01\ncurrency: USD\nprices:\n\tnvidia-a100: {}\n", "source: x\ndate: 2026-12-01\ncurrency: USD\n"])
def test_fails_with_one_line_and_exit_2_when_prices_yaml_is_broken_at_start(broken_prices, sqlite_url, capsys, text):
    """The branch reads prices.yaml once when the service starts (before, the first submit read it, and
    each submit was a 500 while it was broken): a broken file now stops ``gpufleet serve`` at start, and
    that must be the one-line user error every other bad input gets, not a traceback."""
    from gpufleet.cli import main

    broken_prices(text)
    code = main(["serve", "--scheduler", "local", "--db", sqlite_url, "--no-worker"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("error: experiments/prices.yaml") and err.count("\n") == 1 and "Traceback" not in err, err
    assert "tools/refresh_gpu_prices.py" in err


def test_a_pool_timeout_is_a_503_with_retry_after(make_service, sqlite_url):
    """SQLite: 40 admission threads besides anyio's 40 default ones share one pool of 60 connections
    (20 + 40 overflow), so 80 requests can now want a connection at once where 40 could before. A
    checkout that waits out the pool's timeout raised sqlalchemy.exc.TimeoutError: a 500 with a
    traceback. It is the database being unavailable for now, answered like the others: 503 with
    Retry-After. (The pool's 30 s timeout is shortened here; every connection is held by the test.)"""
    svc = make_service(sqlite_url, UnusedRunner())
    headers = svc.token("finetune")
    engine = svc.client.app.state.engine
    engine.pool._timeout = 0.2
    held = [engine.connect() for _ in range(engine.pool.size() + engine.pool._max_overflow)]
    try:
        answer = svc.submit({**headers, "Idempotency-Key": "k"})
    finally:
        for connection in held:
            connection.close()
    assert answer.status_code == 503 and answer.headers["Retry-After"] == "2", answer.text
    assert "QueuePool" not in answer.text and "sqlite" not in answer.text.lower()
    assert svc.submit({**headers, "Idempotency-Key": "k"}).status_code == 202
