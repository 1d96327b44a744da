"""The benchmark's generated 50-cluster fleet stays valid as the cluster schema evolves."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import clusters
from clusters.derive.pools import derive_gpu_pools

BENCH = Path(__file__).resolve().parents[2] / "bench" / "fleetgen.py"


def test_generated_fleet_is_50_valid_clusters_of_6_gpu_pools(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_fleetgen", BENCH)
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # its dataclasses look their module up there
    spec.loader.exec_module(bench)
    configs = clusters.load_all(bench.generated_fleet(tmp_path / "fleet"))
    assert len(configs) == 50
    assert {len(derive_gpu_pools(c)) for c in configs} == {6}
