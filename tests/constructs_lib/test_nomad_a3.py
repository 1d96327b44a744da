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
import os
import subprocess
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


# Stubs for the Fabric Manager step: nvidia-smi reports the running driver; apt-cache madison lists what the apt
# sources hold (Ubuntu's archive version format, as `apt-cache madison` prints: package | version | source).
_FM_STUBS = {
    "nvidia-smi": 'echo "570.133.20"\n',
    "dpkg": "exit 1\n",
    "apt-cache": 'printf " %s | 570.148.08-0ubuntu0.22.04.1 | http://archive.ubuntu.com jammy-updates/restricted amd64 Packages\\n'
                 ' %s | 570.133.20-0ubuntu0.22.04.1 | http://archive.ubuntu.com jammy-security/restricted amd64 Packages\\n" "$2" "$2"\n',
    "systemctl": 'echo "systemctl $*" >> "$STUB_LOG"; [ "$1" != is-active ] || exit 3\n',
    "apt-get": 'echo "apt-get $*" >> "$STUB_LOG"\n',
    "apt-mark": 'echo "apt-mark $*" >> "$STUB_LOG"\n',
}


def run_fabric_manager(tmp_path: Path, madison_versions_for_driver: bool = True,
                       stubs: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], str]:
    from constructs_lib.nomad_gpu_node import render_fabric_manager

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in {**_FM_STUBS, **(stubs or {})}.items():
        if name == "nvidia-smi" and not madison_versions_for_driver:
            body = 'echo "575.51.03"\n'
        (bin_dir / name).write_text("#!/bin/bash\n" + body)
        (bin_dir / name).chmod(0o755)
    # The step's only files are the systemd drop-in; the test points them into tmp_path.
    script = "set -euo pipefail\n" + render_fabric_manager().replace("/etc/systemd/system", str(tmp_path / "systemd"))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STUB_LOG": str(tmp_path / "log")}
    result = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, check=False)
    return result, (tmp_path / "log").read_text() if (tmp_path / "log").exists() else ""


def test_fabric_manager_step_installs_the_running_drivers_exact_version_before_nomad(tmp_path):
    result, log = run_fabric_manager(tmp_path)
    assert result.returncode == 0, result.stderr
    assert "apt-get install -yq --allow-change-held-packages nvidia-fabricmanager-570=570.133.20-0ubuntu0.22.04.1" in log, "the driver's version, not the newest"
    assert "apt-mark hold nvidia-fabricmanager-570" in log and "systemctl enable nvidia-fabricmanager.service" in log
    drop_in = (tmp_path / "systemd" / "nomad.service.d" / "gpufleet-fabricmanager.conf").read_text()
    assert drop_in == "[Unit]\nAfter=nvidia-fabricmanager.service\nRequires=nvidia-fabricmanager.service\n"


def test_fabric_manager_step_stops_the_boot_when_no_build_matches_the_driver(tmp_path):
    result, log = run_fabric_manager(tmp_path, madison_versions_for_driver=False)
    assert result.returncode == 1 and "no nvidia-fabricmanager-575 for driver 575.51.03" in result.stderr
    assert "apt-get install" not in log


def test_fabric_manager_of_an_older_driver_is_replaced_by_the_running_drivers_version(tmp_path):
    """Fabric Manager refuses to start against another driver version, and the package stays installed (and held)
    while the driver moves on: an image rebuilt with a newer driver, or unattended-upgrades updating the driver
    and the reboot loading it. The step must then install the running driver's build, not just start the
    installed one (which fails, and Nomad, which requires it, never starts)."""
    # dpkg-query -W prints "<package>\t<version>" (its default format, ${Package}\t${Version}).
    installed_old = {"dpkg": "exit 0\n", "dpkg-query": 'printf "%s\\t570.124.06-0ubuntu0.22.04.1\\n" "$2"\n'}
    result, log = run_fabric_manager(tmp_path, stubs=installed_old)
    assert result.returncode == 0, result.stderr
    assert ("apt-get install -yq --allow-change-held-packages nvidia-fabricmanager-570=570.133.20-0ubuntu0.22.04.1" in log), log
    assert "apt-mark hold nvidia-fabricmanager-570" in log


def test_fabric_manager_of_the_running_drivers_version_is_not_reinstalled(tmp_path):
    result, log = run_fabric_manager(tmp_path, stubs={"dpkg": "exit 0\n",
                                                       "dpkg-query": 'printf "%s\\t570.133.20-0ubuntu0.22.04.1\\n" "$2"\n'})
    assert result.returncode == 0, result.stderr
    assert "apt-get" not in log and "systemctl start nvidia-fabricmanager.service" in log


def test_every_a3_a4_boot_script_is_valid_bash(infra):
    for pool in POOLS:
        check = subprocess.run(["bash", "-n"], input=template(infra, pool)["metadata_startup_script"], capture_output=True, text=True)
        assert check.returncode == 0, (pool, check.stderr)


# Stubs for the local SSD step, with the disks' state as files in $MD_STATE: "md" once the disks carry the array's
# superblocks (mdadm --create), "up" while it is assembled, "fs" once it holds the labelled ext4 (mkfs.ext4).
# `mdadm --assemble --scan` assembles nothing here: the case where it did not (a VM whose udev has not run the
# incremental assembly yet, or any other reason), which the step must survive without wiping the array.
_SSD_STUBS = {
    "blkid": 'echo "blkid $*" >> "$STUB_LOG"; if [ "$1" = -p ]; then [ -f "$MD_STATE/fs" ]; '
             'else [ -f "$MD_STATE/fs" ] && [ -f "$MD_STATE/up" ]; fi\n',
    "mdadm": 'echo "mdadm $*" >> "$STUB_LOG"\ncase "$1 $2" in\n'
             '  "--create "*) touch "$MD_STATE/md" "$MD_STATE/up" ;;\n'
             '  "--assemble --scan") exit 1 ;;\n'
             '  "--assemble "*) [ -f "$MD_STATE/md" ] && touch "$MD_STATE/up" ;;\n'
             '  "--examine "*) [ -f "$MD_STATE/md" ] ;;\n'
             'esac\n',
    "mkfs.ext4": 'echo "mkfs.ext4 $*" >> "$STUB_LOG"; touch "$MD_STATE/fs"\n',
    "mountpoint": "exit 1\n",
    "mount": 'echo "mount $*" >> "$STUB_LOG"\n',
    "systemctl": 'echo "systemctl $*" >> "$STUB_LOG"\n',
    "udevadm": 'echo "udevadm $*" >> "$STUB_LOG"\n',
    "sleep": "exit 0\n",  # the step's wait for late disks: no wall-clock wait in tests
}


def run_local_ssd(tmp_path: Path, disks: int, expected: int,
                  stubs: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], str]:
    from constructs_lib.nomad_gpu_node import LOCAL_SSD_GLOB, render_local_ssd

    bin_dir, dev, state = tmp_path / "bin", tmp_path / "dev", tmp_path / "md"
    for folder in (bin_dir, dev, state):
        folder.mkdir(exist_ok=True)
    for name, body in {**_SSD_STUBS, **(stubs or {})}.items():
        (bin_dir / name).write_text("#!/bin/bash\n" + body)
        (bin_dir / name).chmod(0o755)
    for i in range(disks):
        (dev / f"google-local-nvme-ssd-{i}").touch()
    # The step's host paths, pointed into tmp_path; everything else runs as rendered.
    script = "set -euo pipefail\n" + (render_local_ssd(expected).replace(LOCAL_SSD_GLOB, f"{dev}/google-local-nvme-ssd-*")
                                      .replace("/etc/fstab", str(tmp_path / "fstab")).replace("/etc/systemd/system", str(tmp_path / "systemd"))
                                      .replace("mkdir -p /mnt/localssd", f"mkdir -p {tmp_path}/mnt"))
    (tmp_path / "fstab").touch()
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STUB_LOG": str(tmp_path / "log"), "MD_STATE": str(state)}
    result = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, check=False)
    return result, (tmp_path / "log").read_text() if (tmp_path / "log").exists() else ""


def test_local_ssd_step_makes_one_raid0_of_every_disk_once_and_mounts_it(tmp_path):
    result, log = run_local_ssd(tmp_path, 16, 16)
    assert result.returncode == 0, result.stderr
    create = next(line for line in log.splitlines() if line.startswith("mdadm --create"))
    assert create.split()[2:7] == ["/dev/md/localssd", "--run", "--force", "--level=0", "--raid-devices=16"]
    assert create.split()[7:] == sorted(str(tmp_path / "dev" / f"google-local-nvme-ssd-{i}") for i in range(16))
    assert "mkfs.ext4 -q -F -L localssd /dev/md/localssd" in log and "mount /mnt/localssd" in log
    again, log2 = run_local_ssd(tmp_path, 0, 16)  # a reboot: the filesystem exists, nothing is made again
    assert again.returncode == 0 and log2.count("mdadm --create") == 1 and log2.count("mkfs.ext4") == 1
    assert (tmp_path / "fstab").read_text() == "LABEL=localssd /mnt/localssd ext4 discard,defaults,nofail 0 2\n"


def test_local_ssd_step_stops_the_boot_when_disks_are_missing(tmp_path):
    result, log = run_local_ssd(tmp_path, 15, 16)
    assert result.returncode == 1 and "expected 16 local NVMe SSDs, found 15" in result.stderr
    assert "mdadm --create" not in log and "mkfs" not in log


def test_a_reboot_whose_array_was_not_assembled_assembles_it_and_never_wipes_it(tmp_path):
    """Local SSD data survives a reboot (docs/nomad.md). When the array's label is not found at boot because the
    array is not assembled, the disks still carry its superblocks: the step must assemble it from its members and
    mount it, never run ``mdadm --create --force`` and ``mkfs.ext4 -F`` over it, which wipes the scratch data."""
    first, _ = run_local_ssd(tmp_path, 16, 16)
    assert first.returncode == 0, first.stderr
    (tmp_path / "log").unlink()
    (tmp_path / "md" / "up").unlink()  # the reboot: superblocks and filesystem stay, nothing is assembled yet
    again, log = run_local_ssd(tmp_path, 16, 16)
    assert again.returncode == 0, again.stderr
    assert "mdadm --create" not in log and "mkfs.ext4" not in log, log
    assert any(line.startswith("mdadm --assemble /dev/md/localssd ") for line in log.splitlines()) and "mount /mnt/localssd" in log


def test_an_array_made_but_never_formatted_is_formatted_not_made_again(tmp_path):
    """A boot cut short between ``mdadm --create`` and ``mkfs.ext4``: the array holds no filesystem at all, so the
    next boot formats it (nothing to lose) instead of stopping."""
    (tmp_path / "md").mkdir()
    (tmp_path / "md" / "md").touch()
    result, log = run_local_ssd(tmp_path, 16, 16)
    assert result.returncode == 0, result.stderr
    assert "mdadm --create" not in log and "mkfs.ext4 -q -F -L localssd /dev/md/localssd" in log


def test_local_ssd_step_says_why_when_no_disk_is_there_at_all(tmp_path):
    """No disk at all: the boot stops with the step's own message (under ``set -o pipefail`` a bare
    ``ls <glob> | sort`` that matches nothing ended the script with ls's status 2 and no word why)."""
    result, log = run_local_ssd(tmp_path, 0, 16)
    assert result.returncode == 1 and "expected 16 local NVMe SSDs, found 0" in result.stderr
    assert "mdadm --create" not in log


def test_local_ssd_step_waits_for_disks_whose_links_udev_makes_late(tmp_path):
    """The guest's udev rules make the google-local-nvme-ssd-* links as the NVMe namespaces are probed; a boot
    script that counts once stops a healthy 16-disk VM when it runs before the last links exist. Here udev
    (the stub ``udevadm settle``) adds one link per call, and the step must wait for all 16 (``sleep`` is a
    no-op stub: no wall-clock wait in the test)."""
    dev = tmp_path / "dev"
    udevadm = f'echo "udevadm $*" >> "$STUB_LOG"; n=$(ls {dev} | wc -l); touch "{dev}/google-local-nvme-ssd-$n"\n'
    result, log = run_local_ssd(tmp_path, 14, 16, stubs={"udevadm": udevadm})
    assert result.returncode == 0, result.stderr
    assert "--raid-devices=16" in log and log.count("udevadm settle") >= 2
