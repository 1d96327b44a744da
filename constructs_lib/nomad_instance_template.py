"""The hardened GCE instance template every Nomad agent VM (GPU client or server) starts from."""

from __future__ import annotations

from dataclasses import dataclass

from constructs import Construct

from constructs_lib.naming import pin
from constructs_lib.providers import google

SERVER_IMAGE = "projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts"
SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]
# Project-wide SSH keys and the serial console bypass IAM; access goes through OS Login + IAP.
LOCKED_METADATA = {"block-project-ssh-keys": "true", "serial-port-enable": "false", "enable-oslogin": "TRUE"}


@dataclass(frozen=True)
class DataDisk:
    """A persistent disk kept across VM recreation (the group's stateful disk), mounted by the boot script."""

    device_name: str
    size_gb: int
    mount_path: str
    disk_type: str = "pd-balanced"


@dataclass(frozen=True)
class Machine:
    """What differs between a GPU client and a server VM; the security settings never do."""

    machine_type: str
    image: str
    disk_gb: int
    disk_type: str
    accelerator: str | None = None
    gpus: int = 0
    spot: bool = False
    reservation: str | None = None
    data_disk: DataDisk | None = None
    local_ssds: int = 0


# GCE requires gVNIC on these families (A3, A4). The guest must support it too: Canonical's GCE
# images (the Ubuntu accelerator images clients boot by default) declare the GVNIC guest OS feature.
# nic_type values: google provider v6.50.0 resource_compute_instance_template.go:518-523
# (StringInSlice GVNIC, VIRTIO_NET, MRDMA, IRDMA).
GVNIC_FAMILIES = ("a3-", "a4-")
# Local SSD on an instance template: a SCRATCH disk of disk_type local-ssd, 375 or 3000 GB, NVME
# for 3000 (provider v6.50.0 resource_compute_instance_template.go:1238-1254, the scratch-disk diff
# check; VALID_SCRATCH_DISK_SIZES_GB at :64).
LOCAL_SSD_GB = 375
LOCAL_SSD_INTERFACE = "NVME"


def _nic(machine_type: str) -> dict[str, str]:
    return {"nic_type": "GVNIC"} if machine_type.startswith(GVNIC_FAMILIES) else {}


def nomad_instance_template(scope: Construct, id_: str, *, name_prefix: str, machine: Machine, project: str, region: str,
                            subnetwork: str, service_account: str, startup_script: str, tags: list[str],
                            labels: dict[str, str]) -> object:
    """Shielded VM, dedicated SA, no external IP, OS Login; GPU VMs terminate on host maintenance.

    Templates are immutable, so each change creates a new one (``name_prefix`` plus
    ``create_before_destroy``) before the group switches to it.
    """
    tmpl = google.compute_instance_template
    scheduling: dict[str, object] = {"on_host_maintenance": "TERMINATE" if machine.gpus else "MIGRATE",
                                     "automatic_restart": not machine.spot}
    if machine.spot:
        scheduling |= {"provisioning_model": "SPOT", "preemptible": True, "instance_termination_action": "DELETE"}
    extras: dict[str, object] = {}
    if machine.accelerator:
        extras["guest_accelerator"] = [tmpl.ComputeInstanceTemplateGuestAccelerator(type=machine.accelerator, count=machine.gpus)]
    if machine.reservation:
        extras["reservation_affinity"] = {"type": "SPECIFIC_RESERVATION", "specific_reservation": {
            "key": "compute.googleapis.com/reservation-name", "values": [machine.reservation]}}
    elif machine.gpus:
        extras["reservation_affinity"] = {"type": "NO_RESERVATION"}
    disks = [tmpl.ComputeInstanceTemplateDisk(source_image=machine.image, boot=True, auto_delete=True,
                                              disk_size_gb=machine.disk_gb, disk_type=machine.disk_type)]
    # The bundled local SSDs of A3/A4 shapes (clusters.families local_ssd_count), NVMe: the only
    # interface these machine types attach local SSD with.
    disks += [tmpl.ComputeInstanceTemplateDisk(type="SCRATCH", disk_type="local-ssd", disk_size_gb=LOCAL_SSD_GB,
                                               interface=LOCAL_SSD_INTERFACE, auto_delete=True, boot=False)
              for _ in range(machine.local_ssds)]
    if machine.data_disk is not None:
        data = machine.data_disk
        disks.append(tmpl.ComputeInstanceTemplateDisk(device_name=data.device_name, boot=False, auto_delete=False, type="PERSISTENT",
                                                      disk_size_gb=data.size_gb, disk_type=data.disk_type))
    return pin(tmpl.ComputeInstanceTemplate(
        scope, "template",
        name_prefix=name_prefix,
        project=project,
        region=region,
        machine_type=machine.machine_type,
        disk=disks,
        network_interface=[tmpl.ComputeInstanceTemplateNetworkInterface(subnetwork=subnetwork, **_nic(machine.machine_type))],
        can_ip_forward=False,
        service_account={"email": service_account, "scopes": SCOPES},
        shielded_instance_config={"enable_secure_boot": True, "enable_vtpm": True, "enable_integrity_monitoring": True},
        scheduling=scheduling,
        metadata=dict(LOCKED_METADATA),
        metadata_startup_script=startup_script,
        tags=tags,
        labels=labels,
        lifecycle={"create_before_destroy": True},
        **extras,
    ), id_)
