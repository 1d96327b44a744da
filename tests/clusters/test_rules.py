"""Silent acceptances caught at check time: GCP facts, API naming rules, guard rails, collisions, .yml files."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

import clusters
from clusters import gcp_zones, names
from clusters.errors import ConfigError
from tests.clusters.conftest import assert_rejected


def _pool(index: int, **changes: object) -> Callable[[dict], None]:
    def change(data: dict) -> None:
        data["gpu_pools"][index].update(changes)

    return change


CASES = [
    ("region-typo", "prod-gke", lambda d: d["gcp"].update(region="us-centra1"), "gcp.region", "did you mean 'us-central1'"),
    ("zone-nonexistent", "prod-gke", lambda d: d["gcp"].update(zones=["us-central1-a", "us-central1-e"]), "gcp.zones[1]",
     "does not exist in us-central1; allowed: us-central1-a, us-central1-b, us-central1-c, us-central1-f"),
    ("machine-not-in-zone", "prod-gke", _pool(0, machine_type="a4-highgpu-8g"), "gpu_pools[0].zones[0]",
     "zones of us-central1 offering A4: us-central1-b"),
    ("machine-not-in-cluster-zone", "prod-nomad", _pool(1, machine_type="g2-standard-8"), None, None),
    ("label-value", "prod-gke", _pool(0, labels={"workload": "Pre Train!"}), "gpu_pools[0].labels.workload", "write e.g. 'pretrain'"),
    ("label-reserved", "prod-gke", _pool(0, labels={"gpufleet.dev/gpu-pool": "x"}), "gpu_pools[0].labels.gpufleet.dev/gpu-pool", "remove it"),
    ("taint-value", "prod-gke", _pool(0, taints=[{"key": "team", "value": "ML Research"}]), "gpu_pools[0].taints[0].value", "write e.g."),
    ("bucket-name", "prod-gke", lambda d: d["state"].update(bucket="Gpufleet_State"), "state.bucket", "write e.g."),
    ("bucket-google", "prod-gke", lambda d: d["state"].update(bucket="google-tfstate"), "state.bucket", "cannot start with 'goog'"),
    ("prod-local-state", "prod-gke", lambda d: d.pop("state"), "state", "allowed: gcs or tfc"),
    ("vault-http", "prod-nomad", lambda d: d["nomad"].update(vault_addr="http://vault.example.com:8200"), "nomad.vault_addr", "https://"),
    ("a4-on-pd-disk", "prod-gke", _pool(0, machine_type="a4-highgpu-8g", zones=["us-central1-b"], boot_disk_type="pd-ssd"),
     "gpu_pools[0].boot_disk_type", "set boot_disk_type: hyperdisk-balanced"),
    ("a3-ultra-on-pd-balanced", "prod-gke", _pool(0, machine_type="a3-ultragpu-8g", zones=["us-central1-b"], boot_disk_type="pd-balanced"),
     "gpu_pools[0].boot_disk_type", "hyperdisk-balanced"),
    # A3/A4 run on Nomad (gVNIC, Fabric Manager, local SSD: constructs_lib.nomad_gpu_node); only what Nomad clients cannot do is refused.
    ("a3-on-nomad-loads", "prod-nomad", _pool(0, machine_type="a3-highgpu-8g", gpus_per_node=8, zones=["europe-west4-b"]), None, None),
    ("gpudirect-on-nomad", "prod-nomad", _pool(0, machine_type="a3-highgpu-8g", zones=["europe-west4-b"], gpudirect=True),
     "gpu_pools[0].gpudirect", "remove gpudirect or use scheduler: gke"),
    ("b200-on-r550-image", "prod-nomad", _pool(0, machine_type="a4-highgpu-8g", zones=["europe-west4-b"], boot_disk_type="hyperdisk-balanced"),
     "gpu_pools[0].machine_type", "ubuntu-accelerator-2204-amd64-with-nvidia-570"),
    ("dns-label-too-long", "prod-gke", lambda d: d["dns"]["records"][0].update(name="a" * 64 + ".prod"), "dns.records[0].name",
     "DNS allows 63 per label"),
]


@pytest.mark.parametrize(("case", "base", "change", "field", "fix"), CASES, ids=[c[0] for c in CASES])
def test_fails_when_a_cluster_file_asks_for_what_gcp_refuses(write_cluster, case, base, change, field, fix) -> None:
    path = write_cluster(base, change)
    if field is None:  # europe-west4-a and -b both offer G2: the check must not refuse a valid pool
        clusters.load(path)
        return
    assert_rejected(path, field, fix)


def test_fails_when_the_nomad_instance_group_name_is_too_long(write_cluster) -> None:
    name = "prod-nomad-europe-west4-finetune-cluster"

    def change(data: dict) -> None:
        data["name"] = name
        data["gpu_pools"][1]["name"] = "l4-spot-sweeps-europe"
        for tenant in data["tenants"]:
            tenant["gpu_quota"] = {"a100": tenant["gpu_quota"]["a100"]}

    path = write_cluster("prod-nomad", change, file_name=name)
    assert_rejected(path, "gpu_pools[1].name", "shorten the pool name to 12 characters")


def test_fails_when_a_tenant_service_account_id_is_too_short(write_cluster) -> None:
    def change(data: dict) -> None:
        data["name"] = "a"
        data["tenants"][0].update(name="x", service_account={"roles": []})

    assert_rejected(write_cluster("dev-gke", change, file_name="a"), "tenants[0].service_account", "too short")


def test_zone_table_carries_its_source_and_covers_the_examples() -> None:
    table = gcp_zones.load()
    assert "docs.cloud.google.com/compute/docs/regions-zones" in table.source and table.retrieved
    assert "us-central1-e" not in table.zones and "us-central1-f" in table.zones
    assert table.offering("us-central1", "A4") == ("us-central1-b",)
    assert len(table.regions) > 40


@pytest.mark.parametrize(("rule", "value", "ok"), [
    (names.gce_name, "a" * 63, True), (names.gce_name, "a" * 64, False), (names.gce_name, "1abc", False),
    (names.label_value, "", True), (names.label_value, "pre-train_2", True), (names.label_value, "Pre Train!", False),
    (names.label_value, "-lead", False), (names.account_id, "ab-cde", True), (names.account_id, "a-b", False),
    (names.account_id, "a" * 31, False), (names.bucket, "ml-tfstate", True), (names.bucket, "192.168.1.1", False),
    (names.bucket, "a..b", False), (names.bucket, "goog-x", False), (names.dns_name, "a" * 63 + ".example.com", True),
    (names.dns_name, ".".join(["a" * 60] * 5), False),
])
def test_name_rules(rule, value, ok) -> None:
    assert (rule(value) is None) is ok, rule(value)


def _load_dir(directory: Path) -> list[str]:
    with pytest.raises(ConfigError) as err:
        clusters.load_all(directory)
    return [str(p) for p in err.value.problems]


def test_fails_when_two_clusters_in_one_project_derive_the_same_names(write_cluster, tmp_path: Path) -> None:
    def named(name: str, tenant: str) -> Callable[[dict], None]:
        def change(data: dict) -> None:
            data["name"] = name
            data["tenants"][0]["name"] = tenant
        return change

    write_cluster("prod-gke", named("ml-a", "b-research"), file_name="ml-a")
    later = write_cluster("prod-gke", named("ml-a-b", "research"), file_name="ml-a-b")
    lines = _load_dir(tmp_path)
    assert any(str(later) in line and "tenants[0].name: tenant service account id 'ml-a-b-research'" in line
               and "already claimed by cluster ml-a" in line and "rename one" in line for line in lines), lines
    assert any("dns.records[0].name: DNS record 'tensorboard.prod' in DNS zone example.com is already claimed" in line for line in lines), lines


def test_fails_when_two_cluster_names_share_the_node_account_prefix(write_cluster, tmp_path: Path) -> None:
    def named(name: str) -> Callable[[dict], None]:
        def change(data: dict) -> None:
            data["name"] = name
            data["dns"]["records"] = []
            data["tenants"][0].pop("service_account")
        return change

    write_cluster("prod-gke", named("gpu-training-cluster-a1"), file_name="gpu-training-cluster-a1")
    write_cluster("prod-gke", named("gpu-training-cluster-a2"), file_name="gpu-training-cluster-a2")
    lines = _load_dir(tmp_path)
    assert any("name: node service account id 'gpu-training-cluster-a-nodes'" in line for line in lines), lines


def test_yml_files_are_loaded_not_ignored(write_cluster, tmp_path: Path) -> None:
    path = write_cluster("dev-gke", lambda d: d["gcp"].update(zones=["us-central1-e"]))
    path.rename(path.with_suffix(".yml"))
    lines = _load_dir(tmp_path)
    assert any("dev-gke.yml:" in line and "gcp.zones[0]" in line for line in lines), lines


def test_fails_when_a_cluster_is_defined_in_a_yaml_and_a_yml_file(write_cluster, tmp_path: Path) -> None:
    path = write_cluster("dev-gke")
    shutil.copy(path, path.with_suffix(".yml"))
    lines = _load_dir(tmp_path)
    assert any("dev-gke.yml:" in line and "also defined in" in line and "delete or rename one" in line for line in lines), lines
