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


# GCE requires gVNIC on these families (A3, A4); the Ubuntu accelerator images support it.
GVNIC_FAMILIES = ("a3-", "a4-")


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
