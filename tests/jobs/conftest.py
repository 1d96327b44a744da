"""Fixtures for the jobs layer: the example clusters and Vault files (loaded once), job files
written from the shipped example with one change, and a running Nomad API double."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

import clusters
from clusters.schema import ClusterConfig
from jobs.nomad.client import NomadClient, NomadSettings
from jobs.loader import JOBS_DIR
from jobs.vault_refs import VaultView, load_vault_view
from tests.jobs.nomad_double import FakeNode, NomadDouble
from tests.conftest import load_fleet

EXAMPLE = JOBS_DIR / "finetune-llama.yaml"


@pytest.fixture(scope="session")
def cluster_configs() -> tuple[ClusterConfig, ...]:
    return load_fleet()


@pytest.fixture(scope="session")
def vault_view() -> VaultView:
    return load_vault_view()


@pytest.fixture
def job_file(tmp_path: Path) -> Callable[..., Path]:
    """Write the example job with ``change(data)`` applied, as <name>.yaml (or ``file_name``)."""

    def write(change: Callable[[Any], None] | None = None, *, file_name: str | None = None, text: str | None = None) -> Path:
        yaml = YAML(typ="rt")
        data = yaml.load(EXAMPLE.read_text())
        data = copy.deepcopy(data)
        if change is not None:
            change(data)
        path = tmp_path / f"{file_name or data['name']}.yaml"
        if text is not None:
            path.write_text(text)
        else:
            with path.open("w") as handle:
                yaml.dump(data, handle)
        return path

    return write


def a100_nodes(*, count: int = 2, used: int = 0) -> list[FakeNode]:
    return [FakeNode(f"a100-{i}", "a100", "a100", "NVIDIA A100-SXM4-40GB", 40960, 2, gpus_used=used) for i in range(count)]


@pytest.fixture
def nomad() -> Iterator[NomadDouble]:
    double = NomadDouble(a100_nodes(), acl_token="nomad-acl-test-token").start()
    yield double
    double.stop()


@pytest.fixture
def client_for() -> Iterator[Callable[..., NomadClient]]:
    made: list[NomadClient] = []

    def make(double: NomadDouble, **overrides: Any) -> NomadClient:
        # A 5 s timeout: tests that count requests must not see a spurious retry on a loaded host.
        settings = {"address": double.address, "token": double.acl_token, "timeout_seconds": 5.0, "retries": 2, "backoff_seconds": 0.01, **overrides}
        client = NomadClient(NomadSettings(**settings))
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


@pytest.fixture
def k8s(cluster_configs: tuple[ClusterConfig, ...], tmp_path: Path) -> Iterator[Any]:
    """The Kubernetes API double with prod-gke's tenant namespaces and one LocalQueue per pool."""
    from clusters.derive.pools import derive_gpu_pools, kueue_local_queue_name
    from tests.jobs.k8s_double import K8sDouble

    gke = next(c for c in cluster_configs if c.name == "prod-gke")
    queues = {kueue_local_queue_name(p.name) for p in derive_gpu_pools(gke)}
    double = K8sDouble(namespaces={t.name: set(queues) for t in gke.tenants}).start()
    double.kubeconfig_path = double.kubeconfig(tmp_path / "kubeconfig")
    yield double
    double.stop()


@pytest.fixture
def k8s_client_for() -> Iterator[Callable[..., Any]]:
    from jobs.k8s.client import K8sClient, K8sSettings

    made: list[Any] = []

    def make(double: Any, **overrides: Any) -> Any:
        settings = {"kubeconfig": str(double.kubeconfig_path), "timeout_seconds": 5.0, "retries": 2, "backoff_seconds": 0.01, **overrides}
        client = K8sClient(K8sSettings(**settings))
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()
