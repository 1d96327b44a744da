"""The cluster file schema: what a reviewer may write in ``clusters/<name>.yaml``.

Field-level rules live here (types, names, ranges). Rules that relate fields to each other
(spot vs reservation, machine type vs GPU count, quotas vs capacity, ...) live in
``clusters.checks`` so each failure can point at the exact field and YAML line.
"""

from __future__ import annotations

import ipaddress
import re
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

DNS_NAME = re.compile(r"^[a-z]([a-z0-9-]{0,38}[a-z0-9])?$")
LABEL_KEY = re.compile(r"^[a-z][a-z0-9_./-]{0,62}$")
PROJECT_ID = re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$")
REGION = re.compile(r"^[a-z]+-[a-z]+[0-9]$")
ZONE_ID = re.compile(r"^[0-9a-f]{32}$")
RBAC_SECURITY_GROUP = re.compile(r"^gke-security-groups@([a-z0-9]([a-z0-9-]*[a-z0-9])?\.)+[a-z]{2,63}$")
MEMBER_KINDS = ("group:", "serviceAccount:", "user:")


def _dns_name(value: str) -> str:
    if not DNS_NAME.match(value):
        raise ValueError(
            f"{value!r} is not DNS-safe; use 1-40 lowercase letters, digits or '-', starting with a letter"
            f" and not ending with '-', e.g. {re.sub(r'[^a-z0-9-]+', '-', value.lower()).strip('-') or 'gpu-a'!r}"
        )
    return value


def _project(value: str) -> str:
    if not PROJECT_ID.match(value):
        raise ValueError(f"{value!r} is not a GCP project id; use 6-30 lowercase letters, digits or '-', e.g. 'ml-train-prod'")
    return value


def _region(value: str) -> str:
    if not REGION.match(value):
        raise ValueError(f"{value!r} is not a GCP region; write it like 'us-central1'")
    return value


def _cidr(value: str) -> str:
    try:
        net = ipaddress.IPv4Network(value, strict=True)
    except ValueError as exc:
        raise ValueError(f"{value!r} is not a valid IPv4 CIDR ({exc}); write it like '10.10.0.0/20' with host bits zero") from None
    return str(net)


def _member(value: str) -> str:
    if not value.startswith(MEMBER_KINDS) or "@" not in value:
        raise ValueError(f"{value!r} is not an IAM member; write 'group:team@example.com' or 'serviceAccount:sa@project.iam.gserviceaccount.com'")
    return value


def _label_key(value: str) -> str:
    if not LABEL_KEY.match(value):
        raise ValueError(f"{value!r} is not a valid label or taint key; use lowercase letters, digits, '_', '-', '.', '/'")
    return value


def _zone_id(value: str) -> str:
    if not ZONE_ID.match(value):
        raise ValueError(f"{value!r} is not a Cloudflare zone id; copy the 32 hex characters from the zone's overview page")
    return value


def _rbac_security_group(value: str) -> str:
    if not RBAC_SECURITY_GROUP.match(value):
        raise ValueError(f"{value!r} is not a GKE RBAC security group; GKE only reads the group named"
                         " 'gke-security-groups@<your Workspace domain>', e.g. 'gke-security-groups@example.com'")
    return value


DnsName = Annotated[str, AfterValidator(_dns_name)]
Cidr = Annotated[str, AfterValidator(_cidr)]
Member = Annotated[str, AfterValidator(_member)]
LabelKey = Annotated[str, AfterValidator(_label_key)]


class Environment(StrEnum):
    DEV = "dev"
    STAGING = "staging"
    PROD = "prod"


class SchedulerKind(StrEnum):
    GKE = "gke"
    NOMAD = "nomad"


class Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_enum_values=False)


class LocalState(Model):
    backend: Literal["local"]


class GcsState(Model):
    backend: Literal["gcs"]
    bucket: Annotated[str, Field(min_length=3, max_length=63)]


class TfcState(Model):
    backend: Literal["tfc"]
    organization: Annotated[str, Field(min_length=1)]
    workspace: str | None = None
    project: str | None = None


State = Annotated[LocalState | GcsState | TfcState, Field(discriminator="backend")]


class AuthorizedNetwork(Model):
    name: Annotated[str, Field(min_length=1)]
    cidr: Cidr


class StaticIp(Model):
    name: DnsName
    description: str = ""


class GcpConfig(Model):
    project: Annotated[str, AfterValidator(_project)]
    region: Annotated[str, AfterValidator(_region)]
    zones: Annotated[tuple[str, ...], Field(min_length=1)]
    subnet_cidr: Cidr
    pods_cidr: Cidr
    services_cidr: Cidr
    master_cidr: Cidr | None = None
    master_authorized_networks: tuple[AuthorizedNetwork, ...] = ()
    static_ips: tuple[StaticIp, ...] = ()


class TaintEffect(StrEnum):
    NO_SCHEDULE = "NO_SCHEDULE"
    PREFER_NO_SCHEDULE = "PREFER_NO_SCHEDULE"
    NO_EXECUTE = "NO_EXECUTE"


class Taint(Model):
    key: LabelKey
    value: str
    effect: TaintEffect = TaintEffect.NO_SCHEDULE


class DiskType(StrEnum):
    PD_SSD = "pd-ssd"
    PD_BALANCED = "pd-balanced"
    HYPERDISK_BALANCED = "hyperdisk-balanced"


class GpuPool(Model):
    name: DnsName
    machine_type: Annotated[str, Field(min_length=1)]
    accelerator: str | None = None
    gpus_per_node: Annotated[int, Field(ge=1, le=16)] | None = None
    node_count: Annotated[int, Field(ge=0, le=1000)] | None = None
    min_nodes: Annotated[int, Field(ge=0, le=1000)] | None = None
    max_nodes: Annotated[int, Field(ge=1, le=1000)] | None = None
    spot: bool = False
    reservation: str | None = None
    queued_provisioning: bool = False
    placement: Literal["COMPACT"] | None = None
    zones: tuple[str, ...] | None = None
    boot_disk_gb: Annotated[int, Field(ge=50, le=65536)] = 200
    boot_disk_type: DiskType = DiskType.PD_SSD
    labels: dict[LabelKey, str] = {}
    taints: tuple[Taint, ...] = ()
    overcommit: bool = False
    protected: bool | None = None


class Grant(Model):
    role: Annotated[str, Field(pattern=r"^(roles|projects/[a-z0-9-]+/roles)/[A-Za-z0-9_.]+$")]
    members: Annotated[tuple[Member, ...], Field(min_length=1)]
    reason: Annotated[str, Field(min_length=10)]


class IamConfig(Model):
    node_roles: tuple[Annotated[str, Field(pattern=r"^roles/[A-Za-z0-9_.]+$")], ...] = ()
    grants: tuple[Grant, ...] = ()


class TenantServiceAccount(Model):
    roles: tuple[Annotated[str, Field(pattern=r"^roles/[A-Za-z0-9_.]+$")], ...] = ()


class Tenant(Model):
    name: DnsName
    groups: tuple[Member, ...] = ()
    gpu_quota: dict[str, Annotated[int, Field(ge=0)]] = {}
    service_account: TenantServiceAccount | None = None


class DnsRecord(Model):
    name: Annotated[str, Field(pattern=r"^([a-z0-9*]([a-z0-9-]*[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$|^@$")]
    static_ip: str | None = None
    hostname: str | None = None
    proxied: bool = False
    ttl: Annotated[int, Field(ge=1, le=86400)] = 1


class DnsConfig(Model):
    zone_id: Annotated[str, AfterValidator(_zone_id)]
    zone_name: Annotated[str, Field(min_length=3)]
    records: tuple[DnsRecord, ...] = ()


class NomadServers(Model):
    count: Literal[3, 5] = 3
    machine_type: str = "e2-standard-4"


class NomadConfig(Model):
    datacenter: DnsName
    region: DnsName = "global"
    vault_addr: Annotated[str, Field(pattern=r"^https?://[^\s]+$")]
    existing_servers: tuple[str, ...] = ()
    servers: NomadServers = NomadServers()
    client_machine_image: str = "projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accelerator-2204-amd64-with-nvidia-550"


class GkeConfig(Model):
    release_channel: Literal["RAPID", "REGULAR", "STABLE"] = "REGULAR"
    # Google Groups for RBAC: without it GKE never puts group membership in the request, so
    # RoleBindings to Group subjects (tenant groups) match nobody.
    rbac_security_group: Annotated[str, AfterValidator(_rbac_security_group)] | None = None


class ClusterConfig(Model):
    name: DnsName
    environment: Environment
    scheduler: SchedulerKind
    state: State = LocalState(backend="local")
    gcp: GcpConfig
    gke: GkeConfig | None = None
    nomad: NomadConfig | None = None
    gpu_pools: Annotated[tuple[GpuPool, ...], Field(min_length=1)]
    iam: IamConfig = IamConfig()
    tenants: tuple[Tenant, ...] = ()
    dns: DnsConfig | None = None
