"""H100 / H200 / B200 on Nomad: the train-nomad fixture (tests/constructs_lib/fixtures, the example docs/nomad.md
points to) loads, synthesizes and passes the expert checks the GKE clusters pass, and its client templates carry
what A3/A4 machines need, every value checked against the rule that decides it upstream.

Provider rules, hashicorp/terraform-provider-google v6.50.0 google/services/compute/resource_compute_instance_template.go
(fetched; the schema keys themselves are checked by tests/stacks/test_google_schema.problems):
- ``network_interface.nic_type``: StringInSlice GVNIC, VIRTIO_NET, MRDMA, IRDMA (:518-523);
- scratch disks (resourceComputeInstanceTemplateScratchDiskCustomizeDiffFunc, :1231-1258): SCRATCH <=> disk_type
  local-ssd, size 375 or 3000 (VALID_SCRATCH_DISK_SIZES_GB, :64), 3000 only on NVME;
- ``reservation_affinity.type``: ANY_RESERVATION, SPECIFIC_RESERVATION, NO_RESERVATION (:1135), the specific key
  compute.googleapis.com/reservation-name (:1152).
"""

from __future__ import annotations

import json
from pathlib import Path

import hcl
import pytest

import clusters
from clusters.families import machine_family
from clusters.machines import MACHINE_GPUS, NVML_GPUS
from safety import checkov_scan
from safety.checkov_skips import load_skips
from stacks.synth import synthesize
from tests.stacks.test_google_schema import problems

FIXTURES = Path(__file__).resolve().parent / "fixtures"
NIC_TYPES = {"GVNIC", "VIRTIO_NET", "MRDMA", "IRDMA"}
RESERVATION_TYPES = {"ANY_RESERVATION", "SPECIFIC_RESERVATION", "NO_RESERVATION"}
POOLS = {"h100": "a3-highgpu-8g", "h100_small": "a3-highgpu-2g", "h200": "a3-ultragpu-8g", "b200": "a4-highgpu-8g"}
NVSWITCH = {"h100", "h200", "b200"}


@pytest.fixture(scope="module")
def train_out(tmp_path_factory) -> Path:
    configs = clusters.load_all(FIXTURES)  # the load runs every cross-check `gpufleet check` runs on a file
    out = tmp_path_factory.mktemp("train-nomad") / "cdktf.out"
    synthesize(configs, out)
    return out


@pytest.fixture(scope="module")
def infra(train_out) -> dict:
    return json.loads((train_out / "stacks" / "train-nomad" / "cdk.tf.json").read_text())["resource"]


def template(infra: dict, pool: str) -> dict:
    return infra["google_compute_instance_template"][f"nomad_client_template_{pool}"]


def scratch_disk_errors(disks: list[dict]) -> list[str]:
    """The provider's scratch-disk diff check (resource_compute_instance_template.go:1231-1258), as written there."""
    errors = []
    for i, d in enumerate(disks):
        kind, disk_type, size, interface = d.get("type", "PERSISTENT"), d.get("disk_type"), d.get("disk_size_gb"), d.get("interface")
        if kind == "SCRATCH" and disk_type != "local-ssd":
            errors.append(f"{i}: SCRATCH disks must have a disk_type of local-ssd")
        if disk_type == "local-ssd" and kind != "SCRATCH":
            errors.append(f"{i}: local-ssd must be SCRATCH")
        if kind == "SCRATCH" and size not in (375, 3000):
            errors.append(f"{i}: SCRATCH disks must be one of [375 3000] GB")
        if kind == "SCRATCH" and size == 3000 and interface != "NVME":
            errors.append(f"{i}: 3000 GB needs NVME")
    return errors


@pytest.mark.parametrize("pool", sorted(POOLS))
def test_a3_a4_client_templates_carry_gvnic_local_ssd_gpus_and_gpu_scheduling(infra, pool):
    machine_type = POOLS[pool]
    t = template(infra, pool)
    assert t["machine_type"] == machine_type
    assert [n.get("nic_type") for n in t["network_interface"]] == ["GVNIC"] and {"GVNIC"} <= NIC_TYPES
    scratch = [d for d in t["disk"] if d.get("type") == "SCRATCH"]
    assert len(scratch) == (machine_family(machine_type).local_ssd_count or 0)
    assert all(d["interface"] == "NVME" and d["disk_size_gb"] == 375 and d["disk_type"] == "local-ssd" for d in scratch)
    assert scratch_disk_errors(t["disk"]) == []
    gpu = MACHINE_GPUS[machine_type]
    assert t["guest_accelerator"] == [{"type": gpu.accelerator, "count": gpu.gpus}]
    assert t["scheduling"]["on_host_maintenance"] == "TERMINATE", "GPU VMs cannot live-migrate"
    assert t["reservation_affinity"]["type"] in RESERVATION_TYPES
    assert problems({"resource": {"google_compute_instance_template": {pool: t}}}) == []


def test_local_ssd_counts_follow_the_family_table(infra):
    counts = {p: sum(d.get("type") == "SCRATCH" for d in template(infra, p)["disk"]) for p in POOLS}
    assert counts == {"h100": 16, "h100_small": 0, "h200": 32, "b200": 32}


def test_reserved_pool_targets_its_reservation_and_spot_pool_is_spot(infra):
    h100 = template(infra, "h100")["reservation_affinity"]
    assert h100 == {"type": "SPECIFIC_RESERVATION", "specific_reservation": {
        "key": "compute.googleapis.com/reservation-name", "values": ["h100-train-reservation"]}}
    small = template(infra, "h100_small")["scheduling"]
    assert small["provisioning_model"] == "SPOT" and small["automatic_restart"] is False
    assert template(infra, "h200")["scheduling"]["automatic_restart"] is True


def test_fabric_manager_only_on_nvswitch_shapes(infra, stack_json):
    for pool in POOLS:
        script = template(infra, pool)["metadata_startup_script"]
        has = "nvidia-fabricmanager-$branch" in script and "After=nvidia-fabricmanager.service" in script
        assert has == (pool in NVSWITCH), pool
        if has:
            assert script.index("systemctl start nvidia-fabricmanager.service") < script.index("systemctl restart nomad"), \
                "Fabric Manager runs before the Nomad client"
    for name, t in stack_json("prod-nomad")["resource"]["google_compute_instance_template"].items():
        assert "nvidia-fabricmanager" not in t["metadata_startup_script"], f"{name}: A100 / L4 hosts have no guest NVSwitch"


def client_config(script: str) -> dict:
    body = script.split("<<'GPUFLEET_NOMAD_CONFIG'\n", 1)[1].split("GPUFLEET_NOMAD_CONFIG", 1)[0]
    return hcl.loads(body)


def test_local_ssd_is_one_raid0_volume_handed_to_tasks_as_a_host_volume(infra):
    script = template(infra, "h200")["metadata_startup_script"]
    assert "--level=0 --raid-devices=32" in script and "expected 32 local NVMe SSDs" in script
    assert "RequiresMountsFor=/mnt/localssd" in script, "after a reboot Nomad must not start on the boot disk's empty directory"
    assert script.index("mount /mnt/localssd") < script.index("systemctl restart nomad")
    # nomad v1.10.5 nomad/structs/volumes.go:30-33 ClientHostVolumeConfig (hcl ",key", "path", "read_only"), read by
    # command/agent/config.go:369 ``HostVolumes ... hcl:"host_volume"``.
    assert client_config(script)["client"]["host_volume"] == {"localssd": {"path": "/mnt/localssd", "read_only": False}}
    small = template(infra, "h100_small")["metadata_startup_script"]
    assert "mdadm" not in small and "host_volume" not in client_config(small)["client"]


@pytest.mark.parametrize(("pool", "accelerator"), [("h100", "nvidia-h100-80gb"), ("h200", "nvidia-h200-141gb"), ("b200", "nvidia-b200")])
def test_clients_advertise_the_gpu_count_and_nvml_memory_of_their_family(infra, pool, accelerator):
    """What jobs' device constraints compare with: ``${device.attr.memory}`` in MiB and ``${device.model}`` (hashicorp/
    nomad-device-nvidia v1.1.0 fingerprint.go:18 MemoryAttr "memory", :194-197 from NVML MemoryMiB with unit MiB, :166 the
    group Name from the NVML device name); the pool meta carries the same numbers from clusters.machines."""
    meta = client_config(template(infra, pool)["metadata_startup_script"])["client"]["meta"]
    assert meta["gpus_per_node"] == "8" and meta["gpu_memory_mib"] == str(NVML_GPUS[accelerator].memory_mib)
    assert meta["gpu_nvml_name"] == NVML_GPUS[accelerator].nvml_name


def test_fixture_passes_checkov_with_only_the_reviewed_skips(train_out):
    stacks = sorted((train_out / "stacks").iterdir())
    summary = checkov_scan.run(stacks, skip_ids=())
    assert all(s.error is None for s in summary.stacks), [s.error for s in summary.stacks if s.error]
    assert {s.stack for s in summary.stacks} == {"train-nomad", "train-nomad-scheduler", "tfc-workspaces"}
    skipped = {s.check_id for s in load_skips()}
    uncovered = [f for s in summary.stacks for f in s.failures if f.check_id not in skipped]
    assert not uncovered, "\n".join(str(f) for f in uncovered)
    assert next(s for s in summary.stacks if s.stack == "train-nomad").passed > 50


def test_jobs_on_a_local_ssd_pool_mount_the_host_volume_and_the_dispatcher_may_register_them(train_out):
    """The job side of the host volume: api/tasks.go VolumeRequest (:453-464) and VolumeMount (:474-480) at Nomad
    v1.10.5; registering a job with a read-write host volume needs ``mount-readwrite`` on it (nomad/job_endpoint.go
    :163-176), which ``host_volume "localssd" { policy = "write" }`` grants (acl/policy.go:350-362)."""
    import dataclasses

    from clusters.derive.pools import derive_gpu_pools
    from jobs.loader import JOBS_DIR, load
    from jobs.nomad.render import render
    from tests.conftest import load_fleet

    train = clusters.load_all(FIXTURES)[0]
    pools = {p.name: p for p in derive_gpu_pools(train)}
    base = load(JOBS_DIR / "finetune-llama.yaml", cluster_configs=load_fleet())
    h100 = render(dataclasses.replace(base, pool=pools["h100"]))["Job"]["TaskGroups"][0]
    assert h100["Volumes"] == {"localssd": {"Name": "localssd", "Type": "host", "Source": "localssd", "ReadOnly": False}}
    assert h100["Tasks"][0]["VolumeMounts"] == [{"Volume": "localssd", "Destination": "/mnt/localssd", "ReadOnly": False}]
    small = render(dataclasses.replace(base, pool=pools["h100-small"]))["Job"]["TaskGroups"][0]
    assert "Volumes" not in small and "VolumeMounts" not in small["Tasks"][0], "no local SSD, no host volume to ask for"
    assert "Volumes" not in render(base)["Job"]["TaskGroups"][0]
    scheduler = json.loads((train_out / "stacks" / "train-nomad-scheduler" / "cdk.tf.json").read_text())["resource"]
    rules = hcl.loads(scheduler["nomad_acl_policy"]["nomad_acl_dispatcher"]["rules_hcl"])
    assert rules["host_volume"] == {"localssd": {"policy": "write"}}
    assert rules["namespace"] == {"pretrain": {"capabilities": ["dispatch-job", "list-jobs", "parse-job", "read-job", "submit-job"]}}
