"""Bad GKE job files: the cross-checks that keep a Job from waiting forever in a Kueue queue or
on a node it can never fit (quota, pool size, node shape, Vault address, platform variables)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from clusters.errors import ConfigError
from clusters.machines import gke_allocatable
from jobs.loader import find, load

GKE_EXAMPLE = find("finetune-llama-gke")


@pytest.fixture
def gke_job_file(tmp_path: Path) -> Callable[[Callable[[Any], None]], Path]:
    def write(change: Callable[[Any], None]) -> Path:
        yaml = YAML(typ="rt")
        data = yaml.load(GKE_EXAMPLE.read_text())
        change(data)
        path = tmp_path / f"{data['name']}.yaml"
        with path.open("w") as handle:
            yaml.dump(data, handle)
        return path

    return write


def _set(*pairs: tuple[tuple[str, ...], Any]) -> Callable[[Any], None]:
    def change(data: Any) -> None:
        for path, value in pairs:
            node = data
            for part in path[:-1]:
                node = node[part]
            node[path[-1]] = value

    return change


BAD = [
    ("nodes-over-pool-max", _set((("nodes",), 5)), "nodes", r"^5 nodes exceed pool h100's maximum of 4 in clusters/prod-gke.yaml; Kueue admits all ranks or none"),
    ("quota-over-tenant", _set((("nodes",), 4)), "gpu.count", r"^4 nodes x 8 GPUs = 32 exceed tenant research's quota of 24 on pool h100 .*could never be admitted"),
    ("no-quota-on-pool", _set((("tenant",), "applied"), (("gpu", "pool"), "l4-spot"), (("gpu", "count"), 2), (("gpu", "min_memory_gib"), 24),
                              (("gpu", "model"), "L4"), (("nodes",), 5), (("cpu_cores",), 8), (("memory_mb",), 65536), (("disk_mb",), 51200)),
     "gpu.count", r"^5 nodes x 2 GPUs = 10 exceed tenant applied's quota of 8 on pool l4-spot"),
    ("cpu-over-node", _set((("cpu_cores",), 208)), "cpu_cores", r"^208 cores do not fit one a3-highgpu-8g node \(about 206\.\d+ allocatable after GKE's reservation and beside the GPUDirect sidecar's default request\); set cpu_cores to at most 206"),
    ("memory-over-node", _set((("memory_mb",), 1872 * 1024)), "memory_mb", r"^1916928 MiB does not fit one a3-highgpu-8g node \(about \d+ MiB allocatable"),
    ("disk-over-boot-disk", _set((("disk_mb",), 500 * 1024)), "disk_mb", r"of ephemeral storage does not fit pool h100's 500 GB boot disk"),
    ("env-shadows-rendezvous", _set((("env", "MASTER_ADDR"), "10.0.0.1")), "env.MASTER_ADDR", r"MASTER_ADDR is set by the platform on GKE"),
]


@pytest.mark.parametrize(("change", "field", "message"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_fails_when_gke_job_file_is_wrong(gke_job_file: Callable[..., Path], cluster_configs: Any, vault_view: Any,
                                          change: Callable[[Any], None], field: str, message: str) -> None:
    path = gke_job_file(change)
    with pytest.raises(ConfigError) as caught:
        load(path, cluster_configs=cluster_configs, vault=vault_view)
    matching = [p for p in caught.value.problems if p.field == field]
    assert matching, [str(p) for p in caught.value.problems]
    assert str(matching[0]).startswith(f"{path}:{matching[0].line}: {field}: ")
    assert re.search(message, matching[0].message), matching[0].message


def test_fails_when_gke_cluster_has_no_vault_addr(cluster_configs: Any, vault_view: Any) -> None:
    configs = tuple(c.model_copy(update={"gke": c.gke.model_copy(update={"vault_addr": None})}) if c.name == "prod-gke" else c for c in cluster_configs)
    with pytest.raises(ConfigError, match=r"cluster: cluster prod-gke has no gke.vault_addr, so its pods cannot reach Vault"):
        load(GKE_EXAMPLE, cluster_configs=configs, vault=vault_view)


def test_gke_allocatable_follows_gke_reservations() -> None:
    """Plan GKE node sizes: g2-standard-24 (24 vCPU, 96 GiB) keeps about 23.9 cores and ~90 GiB."""
    millicores, mib = gke_allocatable("g2-standard-24")
    reserved_cpu = 0.06 + 0.01 + 2 * 0.005 + 20 * 0.0025
    reserved_gib = 4 * 0.25 + 4 * 0.20 + 8 * 0.10 + 80 * 0.06
    assert millicores == int((24 - reserved_cpu) * 1000)
    assert mib == int((96 - reserved_gib) * 1024) - 100
    assert gke_allocatable("no-such-machine") is None
