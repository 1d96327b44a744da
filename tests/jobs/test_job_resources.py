"""A job cannot ask one node for more than the pool's machine and boot disk have (it would never be placed)."""

from __future__ import annotations

import pytest

from clusters.errors import ConfigError
from clusters.machines import machine_shape
from jobs.loader import load


@pytest.mark.parametrize(("field", "value", "message"), [
    ("memory_mb", 400_000, "400000 MB is more than a a2-highgpu-2g node of pool a100 has (170 GiB = 174080 MB); allowed: <= 174080"),
    ("cpu_mhz", 200_000, "200000 MHz is more than a a2-highgpu-2g node of pool a100 can offer (24 vCPUs x at most 4000 MHz = 96000)"),
    ("disk_mb", 400_000, "400000 MB is more than pool a100's boot disk (300 GB = 307200 MB); allowed: <= 307200; lower disk_mb or raise boot_disk_gb"),
])
def test_fails_when_a_job_asks_for_more_than_the_machine(job_file, cluster_configs, vault_view, field, value, message) -> None:
    path = job_file(lambda data: data.__setitem__(field, value))
    with pytest.raises(ConfigError) as err:
        load(path, cluster_configs=cluster_configs, vault=vault_view)
    lines = [str(p) for p in err.value.problems]
    assert any(f": {field}: {message}" in line for line in lines), lines


def test_machine_shapes_come_from_the_catalog() -> None:
    assert machine_shape("a2-highgpu-2g").memory_gib == 170 and machine_shape("a3-ultragpu-8g").vcpus == 224
    assert machine_shape("n1-standard-8").memory_gib == 30 and machine_shape("g2-standard-24").memory_gib == 96
    assert machine_shape("e2-standard-4") is None
