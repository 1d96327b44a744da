"""The cluster file schema: what a reviewer may write in ``clusters/<name>.yaml``.

Field-level rules live here (types, names, ranges). Rules that relate fields to each other
(spot vs reservation, machine type vs GPU count, quotas vs capacity, ...) live in
``clusters.checks`` so each failure can point at the exact field and YAML line.
"""

from __future__ import annotations

import ipaddress
import re
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator

DNS_NAME = re.compile(r"^[a-z]([a-z0-9-]{0,38}[a-z0-9])?$")
LABEL_KEY = re.compile(r"^[a-z][a-z0-9_./-]{0,62}$")
PROJECT_ID = re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$")
REGION = re.compile(r"^[a-z]+-[a-z]+[0-9]$")
ZONE_ID = re.compile(r"^[0-9a-f]{32}$")
RBAC_SECURITY_GROUP = re.compile(r"^gke-security-groups@([a-z0-9]([a-z0-9-]*[a-z0-9])?\.)+[a-z]{2,63}$")
MEMBER_KINDS = ("group:", "serviceAccount:", "user:")
MEMBER = re.compile(r"^(group|serviceAccount|user):[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,63}$")
# Charsets of free-text values that reach Terraform JSON (each is evaluated there as a template,
# so a value outside its real charset is refused, not escaped). Sources: GCE resource names
# (RFC 1035, cloud.google.com/compute/docs/naming-resources), Kubernetes label values
# (k8s.io/apimachinery/pkg/util/validation IsValidLabelValue) intersected with GCE label values
# (lowercase, digits, '_' and '-'; cloud.google.com/compute/docs/labeling-resources) because pool
# labels land on GKE nodes and on Nomad instances, Kubernetes taint values (= label values).
GCE_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
RESERVATION = re.compile(r"^(projects/[a-z][a-z0-9-]{4,28}[a-z0-9]/reservations/)?[a-z]([-a-z0-9]{0,61}[a-z0-9])?"
                         r"(/reservationBlocks/[a-z]([-a-z0-9]{0,61}[a-z0-9])?)?$")
POOL_LABEL_VALUE = re.compile(r"^([a-z0-9]([a-z0-9_-]{0,61}[a-z0-9])?)?$")
K8S_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")
IMAGE = re.compile(r"^projects/[a-z][a-z0-9-]{4,28}[a-z0-9]/global/images/(family/)?[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
ZONE = re.compile(r"^[a-z]+-[a-z]+[0-9]-[a-z]$")
DOMAIN = re.compile(r"^(?=.{1,253}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63}$")
TFC_NAME = re.compile(r"^[A-Za-z0-9_-]{1,90}$")
TFC_PROJECT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 _-]{0,39}$")
BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$")
DESCRIPTION = re.compile(r"^[A-Za-z0-9 .,:;()'/&_+-]{0,256}$")
DISPLAY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._-]{0,62}$")
URL = re.compile(r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~/-]*)?$")
TEMPLATE_MARKERS = ("${", "%{")


def _dns_name(value: str) -> str:
    if not DNS_NAME.match(value):
        raise ValueError(
            f"{value!r} is not DNS-safe; use 1-40 lowercase letters, digits or '-', starting with a letter"
            f" and not ending with '-', e.g. {re.sub(r'[^a-z0-9-]+', '-', value.lower())[:40].strip('-') or 'gpu-a'!r}"
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
    if not MEMBER.match(value):
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
                         " 'gke-security-groups@<your Workspace domain>'; set it to that group, e.g. 'gke-security-groups@example.com'")
    return value


GKE_VERSION = re.compile(r"^\d+\.\d+\.\d+-gke\.\d+$")


def _charset(pattern: re.Pattern[str], what: str, example: str) -> AfterValidator:
    def check(value: str) -> str:
        if not pattern.match(value):
            raise ValueError(f"{value!r} is not {what}; write e.g. {example!r}")
        return value
    return AfterValidator(check)


def _templates(value: Any) -> str | None:
    """The first string (or map key) under ``value`` that holds ``${`` or ``%{``."""
    if isinstance(value, str):
        return value if any(m in value for m in TEMPLATE_MARKERS) else None
    if isinstance(value, dict):
        return next((hit for k, v in value.items() for hit in (_templates(k), _templates(v)) if hit), None)
    if isinstance(value, (list, tuple)):
        return next((hit for v in value if (hit := _templates(v))), None)
    return None


def _holds_model(annotation: Any) -> bool:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return True
    return any(_holds_model(arg) for arg in getattr(annotation, "__args__", ()) or ())


DnsName = Annotated[str, AfterValidator(_dns_name)]
Cidr = Annotated[str, AfterValidator(_cidr)]
Member = Annotated[str, AfterValidator(_member)]
LabelKey = Annotated[str, AfterValidator(_label_key)]
Zone = Annotated[str, _charset(ZONE, "a GCP zone", "us-central1-a")]


class Environment(StrEnum):
    DEV = "dev"
    STAGING = "staging"
    PROD = "prod"


class SchedulerKind(StrEnum):
    GKE = "gke"
    NOMAD = "nomad"


class Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_enum_values=False)

    @field_validator("*", mode="after")
    @classmethod
    def _no_terraform_template(cls, value: Any, info: ValidationInfo) -> Any:
        """Every string of a cluster file may reach Terraform JSON, where ``${``/``%{`` is evaluated
        (``${file("/proc/self/environ")}`` reads the plan runner's credentials). Runs after each field's
        own charset (a field with a charset already refuses '$'), for every field of every model, so a
        plain ``str`` field added later is covered too; fields holding a sub-model are left to that
        model's own fields, so the error points at the exact key. ``after``: pydantic forbids
        ``before`` validators on the discriminator (``state.backend``)."""
        if info.field_name is None or _holds_model(cls.model_fields[info.field_name].annotation):
            return value
        hit = _templates(value)
        if hit is not None:
            shown = hit if len(hit) <= 60 else hit[:57] + "..."
            raise ValueError(f"{shown!r} contains '${{' or '%{{', which Terraform would evaluate as an interpolation"
                             " (it can read files and environment variables of the plan runner); allowed: plain text; remove it")
        return value


class LocalState(Model):
    backend: Literal["local"]


class GcsState(Model):
    backend: Literal["gcs"]
    bucket: Annotated[str, _charset(BUCKET, "a GCS bucket name (3-63 lowercase letters, digits, '.', '_', '-')", "gpufleet-tfstate-prod")]


class TfcState(Model):
    backend: Literal["tfc"]
    organization: Annotated[str, _charset(TFC_NAME, "a Terraform Cloud organization name (letters, digits, '_', '-')", "gpufleet")]
    workspace: Annotated[str, _charset(TFC_NAME, "a Terraform Cloud workspace name (letters, digits, '_', '-')", "prod-nomad")] | None = None
    project: Annotated[str, _charset(TFC_PROJECT, "a Terraform Cloud project name (1-40 letters, digits, ' ', '_', '-')", "gpufleet")] | None = None


State = Annotated[LocalState | GcsState | TfcState, Field(discriminator="backend")]


class AuthorizedNetwork(Model):
    name: Annotated[str, _charset(DISPLAY_NAME, "a network display name (1-63 letters, digits, ' ', '.', '_', '-')", "corp-vpn")]
    cidr: Cidr


class StaticIpUse(StrEnum):
    """What attaches the address, which decides its kind (review C11). GKE Ingress builds a global
    external Application Load Balancer, whose ``kubernetes.io/ingress.global-static-ip-name`` takes a
    global address; an L4 ``LoadBalancer`` Service and a regional Gateway take a regional one."""

    INGRESS = "ingress"
    LOAD_BALANCER = "load_balancer"
    REGIONAL_GATEWAY = "regional_gateway"

    @property
    def is_global(self) -> bool:
        return self is StaticIpUse.INGRESS


class StaticIp(Model):
    name: DnsName
    # Required on GKE (checks): an address of the wrong kind is reserved, billed and never attachable.
    use: StaticIpUse | None = None
    description: Annotated[str, _charset(DESCRIPTION, "a plain description (up to 256 letters, digits, spaces and .,:;()'/&_+-)", "Nomad UI behind the corp proxy")] = ""


class GcpConfig(Model):
    project: Annotated[str, AfterValidator(_project)]
    region: Annotated[str, AfterValidator(_region)]
    zones: Annotated[tuple[Zone, ...], Field(min_length=1)]
    subnet_cidr: Cidr
    pods_cidr: Cidr
    services_cidr: Cidr
    master_cidr: Cidr | None = None
    master_authorized_networks: tuple[AuthorizedNetwork, ...] = ()
    # Carved into the /20 subnets of the GPUDirect VPCs (GKE pools on A3/A4 machines); must not overlap the other ranges.
    gpudirect_cidr: Cidr = "192.168.0.0/16"
    static_ips: tuple[StaticIp, ...] = ()
    # Share of the node subnet's flows logged (review D7): flow logs are billed per GB, and a training
    # VPC carries checkpoint and data traffic; 0.1 keeps enough to investigate, raise it while you do.
    flow_log_sampling: Annotated[float, Field(gt=0, le=1)] = 0.1
    # Aggregation interval and metadata of those flow logs (google_compute_subnetwork.log_config at
    # provider 6.50.0; values: its "Possible values"). The cheapest by default: one record per
    # connection per 15 minutes, no VM/GKE metadata. CUSTOM_METADATA is left out: it needs a
    # metadata_fields list gpufleet does not model. Raise both while investigating.
    flow_log_interval: Literal["INTERVAL_5_SEC", "INTERVAL_30_SEC", "INTERVAL_1_MIN", "INTERVAL_5_MIN", "INTERVAL_10_MIN", "INTERVAL_15_MIN"] = "INTERVAL_15_MIN"
    flow_log_metadata: Literal["EXCLUDE_ALL_METADATA", "INCLUDE_ALL_METADATA"] = "EXCLUDE_ALL_METADATA"


class TaintEffect(StrEnum):
    NO_SCHEDULE = "NO_SCHEDULE"
    PREFER_NO_SCHEDULE = "PREFER_NO_SCHEDULE"
    NO_EXECUTE = "NO_EXECUTE"


# The GPU health checker's taint (constructs_lib/gpu_health_check.TAINT_KEY): a pool taint of that key
# would make every run on the pool tolerate it (runs tolerate their pool's taints), letting them onto bad nodes.
HEALTH_TAINT_KEY = "gpufleet.dev/gpu-unhealthy"


class Taint(Model):
    key: LabelKey
    value: Annotated[str, _charset(K8S_LABEL_VALUE, "a Kubernetes taint value (up to 63 letters, digits, '-', '_', '.', starting and ending alphanumeric)", "present")]
    effect: TaintEffect = TaintEffect.NO_SCHEDULE

    @field_validator("key")
    @classmethod
    def _not_the_health_taint(cls, value: str) -> str:
        if value == HEALTH_TAINT_KEY:
            raise ValueError(f"{value!r} is the GPU health checker's taint; a pool taint of that key lets every run onto failing nodes;"
                             " pick another key, e.g. 'workload'")
        return value


class DiskType(StrEnum):
    PD_SSD = "pd-ssd"
    PD_BALANCED = "pd-balanced"
    HYPERDISK_BALANCED = "hyperdisk-balanced"


class GpuPool(Model):
    # What job files name in `gpu.pool` and tenants in `gpu_quota`; part of the pool's addresses, so
    # renaming it destroys the pool (docs/howto/change-a-pool.md).
    name: DnsName
    # Decides the GPU model and count (a2/a3/a4/g2 machine types); an n1 machine takes T4s through
    # accelerator and gpus_per_node.
    machine_type: Annotated[str, _charset(GCE_NAME, "a GCE machine type name", "a2-highgpu-8g")]
    # Derived from machine_type; set it for an n1 machine (nvidia-tesla-t4), otherwise it must match.
    accelerator: Annotated[str, _charset(GCE_NAME, "a GCE accelerator type name", "nvidia-tesla-t4")] | None = None
    # Derived from machine_type; set it for an n1 machine, otherwise it must match.
    gpus_per_node: Annotated[int, Field(ge=1, le=16)] | None = None
    # A fixed size, no autoscaling: excludes min_nodes and max_nodes.
    node_count: Annotated[int, Field(ge=0, le=1000)] | None = None
    # The autoscaler's floor; 0 scales to zero (a run then waits for its first node).
    min_nodes: Annotated[int, Field(ge=0, le=1000)] | None = None
    # The autoscaler's ceiling; required unless node_count is set.
    max_nodes: Annotated[int, Field(ge=1, le=1000)] | None = None
    # Spot VMs: cheaper, and preempted whenever GCE needs the capacity back.
    spot: bool = False
    reservation: Annotated[str, _charset(RESERVATION, "a GCE reservation name (optionally projects/<project>/reservations/<name>, optionally ending /reservationBlocks/<block>)", "h100-reservation-2026")] | None = None
    queued_provisioning: bool = False
    placement: Literal["COMPACT"] | None = None
    # An existing compact resource policy (same project and region as the pool) that GKE places the
    # pool's nodes with instead of creating one; the only COMPACT form allowed on a reserved pool.
    placement_policy_name: Annotated[str, _charset(GCE_NAME, "a GCE resource policy name", "a3-compact-policy")] | None = None
    zones: tuple[Zone, ...] | None = None
    boot_disk_gb: Annotated[int, Field(ge=50, le=65536)] = 200
    # None: the machine family's default (clusters.families): pd-ssd, or hyperdisk-balanced where PD is not offered.
    boot_disk_type: DiskType | None = None
    # Immutable on a GKE pool: DEFAULT follows the node version (toolkit default); LATEST is a deliberate choice.
    gpu_driver_version: Literal["DEFAULT", "LATEST"] = "DEFAULT"
    # None: on for machine types built for GPUDirect (a3-highgpu/megagpu/ultragpu-8g, a4-highgpu-8g); false opts out.
    gpudirect: bool | None = None
    # GCE host maintenance cadence for the pool's VMs (ForceNew; unset = GCE's default, as in the toolkit).
    host_maintenance_interval: Literal["PERIODIC", "AS_NEEDED"] | None = None
    labels: dict[LabelKey, Annotated[str, _charset(POOL_LABEL_VALUE, "a label value GKE and GCE both accept (up to 63 lowercase letters, digits, '_', '-')", "pretrain")]] = {}
    taints: tuple[Taint, ...] = ()
    # true lets the tenants' gpu_quota on this pool add up to more than it can hold (max_nodes x gpus_per_node).
    overcommit: bool = False
    # The plan gate and preview refuse destroying or replacing the pool unless named with --allow-destroy.
    # Unset: protected unless environment is dev.
    protected: bool | None = None


class Grant(Model):
    role: Annotated[str, Field(pattern=r"^(roles|projects/[a-z0-9-]+/roles)/[A-Za-z0-9_.]+$",
                               description="an IAM role: 'roles/<name>' (e.g. 'roles/container.developer') or 'projects/<project>/roles/<custom role>'")]
    members: Annotated[tuple[Member, ...], Field(min_length=1)]
    reason: Annotated[str, Field(min_length=10), _charset(DESCRIPTION, "a plain sentence (letters, digits, spaces and .,:;()'/&_+-)", "platform team operates the training namespaces")]


class IamConfig(Model):
    node_roles: Annotated[tuple[Annotated[str, Field(pattern=r"^roles/[A-Za-z0-9_.]+$")], ...],
                          Field(description="a predefined IAM role such as 'roles/storage.objectViewer'")] = ()
    grants: tuple[Grant, ...] = ()


class TenantServiceAccount(Model):
    roles: Annotated[tuple[Annotated[str, Field(pattern=r"^roles/[A-Za-z0-9_.]+$")], ...],
                     Field(description="a predefined IAM role such as 'roles/storage.objectViewer'")] = ()


class IdlePolicy(Model):
    """When the control plane stops a run as idle (experiments.background.idle): every GPU of the
    run below ``gpu_util_below_pct`` for ``low_util_minutes``, or no new log output on any rank for
    ``no_logs_minutes``. 0 minutes turns that signal off. Set by the platform team in the cluster
    file (per cluster, and per tenant under ``tenants[].idle``); a job file cannot change it."""

    gpu_util_below_pct: Annotated[float, Field(ge=0, le=100, description="a percentage, 0-100, such as 5")] = 5.0
    low_util_minutes: Annotated[int, Field(ge=0, le=10080, description="minutes, 0 (signal off) to 10080 (a week), such as 30")] = 30
    no_logs_minutes: Annotated[int, Field(ge=0, le=10080, description="minutes, 0 (signal off) to 10080 (a week), such as 60")] = 60


class Tenant(Model):
    # A team: also its namespace on the cluster, and what job files name in `tenant:` and API tokens in --tenant.
    name: DnsName
    # GKE: members bound to Kubernetes' edit role in the tenant's namespace, e.g. group:ml-vision@example.com.
    groups: tuple[Member, ...] = ()
    # GPUs per pool (`pool: count`) the tenant's runs may hold at once; a pool missing here is refused at admission.
    gpu_quota: dict[DnsName, Annotated[int, Field(ge=0)]] = {}
    budget_usd_month: Annotated[float, Field(gt=0, le=100_000_000, description="US dollars per calendar month (UTC), more than 0, such as 20000;"
                                                                              " omit the field for no budget")] | None = None
    budget_policy: Annotated[Literal["stop", "warn"], Field(description="what the reaper does once the month's spend crosses the budget:"
                                                                       " 'stop' its runs (default) or 'warn' (an event on each)")] = "stop"
    idle: IdlePolicy | None = None
    service_account: TenantServiceAccount | None = None
    adhoc_jobs: Annotated[bool, Field(description="true lets this tenant submit a job file with its request (gpufleet exp submit -f job.yaml):"
                                                  " checked like the files in jobs/ but not reviewed in this repository; default false")] = False


class DnsRecord(Model):
    name: Annotated[str, Field(pattern=r"^([a-z0-9*]([a-z0-9-]*[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$|^@$",
                               description="a record name relative to the zone: dot-separated labels of lowercase letters, digits"
                                           " and '-' (a first label may be '*'), or '@' for the zone apex, e.g. 'tensorboard.prod'")]
    static_ip: DnsName | None = None
    hostname: str | None = None
    # The Nomad servers' internal load balancer by name: a Cloud DNS private zone of just this name,
    # visible inside the cluster's VPC (VPN users through its DNS forwarding), never the public zone.
    nomad_api: bool = False
    proxied: bool = False
    ttl: Annotated[int, Field(ge=1, le=86400)] = 1


class DnsConfig(Model):
    zone_id: Annotated[str, AfterValidator(_zone_id)]
    zone_name: Annotated[str, _charset(DOMAIN, "a DNS zone name", "example.com")]
    records: tuple[DnsRecord, ...] = ()


class NomadServers(Model):
    count: Literal[3, 5] = 3
    machine_type: Annotated[str, _charset(GCE_NAME, "a GCE machine type name", "e2-standard-4")] = "e2-standard-4"
    # Zones of the server groups (default: gcp.zones). Fewer than 3 needs a written reason:
    # a zone holding a majority of the servers takes the quorum with it.
    zones: tuple[Zone, ...] | None = None
    fewer_zones_reason: Annotated[str, Field(min_length=10), _charset(DESCRIPTION, "a plain sentence (letters, digits, spaces and .,:;()'/_+-)", "staging: one zone down is acceptable")] | None = None
    data_disk_gb: Annotated[int, Field(ge=10, le=1000)] = 50


class NomadApiAccess(Model):
    """Who may reach the Nomad HTTP API (4646) from outside the node subnet: operators' VPN and the
    CI runners or TFC agents that plan the scheduler stack. Every caller also needs the CLI
    certificate (mTLS) and an ACL token; the firewall is the first gate, not the only one."""

    cidrs: tuple[AuthorizedNetwork, ...] = ()


# A GitHub Actions runner label: letters, digits, '.', '_', '-' (GitHub's own labels such as
# 'ubuntu-latest', 'self-hosted', 'linux', 'x64' all fit).
RUNNER_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


class NomadPlannedFrom(Model):
    """Where the ``<cluster>-scheduler`` stack is planned from: a machine that can reach the Nomad
    API. Exactly one of: ``github_runner_labels`` (self-hosted GitHub Actions runners inside the VPC
    or on its VPN; the CI plan job for this stack ``runs-on`` them and writes the mTLS files from CI
    secrets) or ``tfc_agent_pool`` (a Terraform Cloud agent pool in the VPC, by name: the stack's
    workspace runs in ``agent`` execution mode). Unset: GitHub-hosted ``ubuntu-latest`` (docs/nomad.md,
    "Where CI plans from")."""

    github_runner_labels: Annotated[tuple[Annotated[str, _charset(RUNNER_LABEL, "a runner label (letters, digits, '.', '_', '-')", "gpufleet-vpc")], ...],
                                    Field(min_length=1)] | None = None
    tfc_agent_pool: Annotated[str, _charset(TFC_NAME, "a Terraform Cloud agent pool name (letters, digits, '_', '-')", "gpufleet-vpc")] | None = None


class NomadAutoscaler(Model):
    """The Nomad Autoscaler's metrics source: a Prometheus that scrapes every server's
    ``/v1/metrics?format=prometheus`` (with a client certificate from the cluster CA) from
    ``scrape_cidrs``, which the firewall admits to the servers' HTTP port (docs/nomad.md)."""

    prometheus_address: Annotated[str, _charset(URL, "a Prometheus address (http(s)://host[:port][/path])", "https://prometheus.internal.example.com:9090")]
    scrape_cidrs: Annotated[tuple[AuthorizedNetwork, ...], Field(min_length=1)]


class NomadTls(Model):
    """Where the agents' TLS certificates come from.

    ``static`` (the default, what a fleet bootstrapped before this field got): the bootstrap
    script's 365-day certificates in Secret Manager, read at boot and never renewed;
    ``static_expires`` records the date the bootstrap printed, and ``gpufleet check`` warns 30
    days before it. ``vault-pki``: every agent gets a short-lived certificate from the cluster's
    OpenBao/Vault PKI mount at boot and renews it from a systemd timer (docs/nomad.md)."""

    certificates: Literal["static", "vault-pki"] = "static"
    static_expires: Annotated[Annotated[str, Field(pattern=r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$")] | None,
                              Field(description="a date such as '2027-12-04'")] = None
    agent_cert_ttl_hours: Annotated[int, Field(ge=1, le=720)] = 72


class NomadConfig(Model):
    datacenter: DnsName
    region: DnsName = "global"
    vault_addr: Annotated[str, _charset(URL, "a Vault address (http(s)://host[:port][/path], no credentials or query)", "https://vault.example.com:8200")]
    existing_servers: tuple[str, ...] = ()
    servers: NomadServers = NomadServers()
    api_access: NomadApiAccess = NomadApiAccess()
    autoscaler: NomadAutoscaler | None = None
    tls: NomadTls = NomadTls()
    planned_from: NomadPlannedFrom | None = None
    client_machine_image: Annotated[str, _charset(IMAGE, "a GCE image (projects/<project>/global/images/[family/]<name>)", "projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accelerator-2204-amd64-with-nvidia-550")] = "projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accelerator-2204-amd64-with-nvidia-550"


class SystemPool(Model):
    """The untainted CPU pool Kueue, kube-dns and other system pods run on (toolkit: e2-standard-4, total min 2)."""

    machine_type: Annotated[str, _charset(GCE_NAME, "a GCE machine type name", "e2-standard-4")] = "e2-standard-4"
    min_nodes: Annotated[int, Field(ge=1, le=100)] = 2
    max_nodes: Annotated[int, Field(ge=1, le=100)] = 4
    boot_disk_gb: Annotated[int, Field(ge=50, le=65536)] = 100


HH_MM = r"^([01][0-9]|2[0-3]):[0-5][0-9]$"
RFC3339 = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z$"


class UpgradeExclusion(Model):
    """A maintenance exclusion: no minor (and, by default, no node) upgrade evicts a run inside it.

    Without dates (the default form) gpufleet derives the window from the clock: from the first
    day of the current calendar quarter to 45 days into the next one, so every apply in a new
    quarter renews it and nothing in the file expires (clusters.derive.gke.derive_exclusion).
    ``start_time``/``end_time`` pin a one-off window instead; ``gpufleet check`` warns 30 days
    before it ends. Scopes: the GKE API's MaintenanceExclusionOptions.Scope values that keep
    control-plane patches (NO_UPGRADES also stops security patches and is not offered).
    """

    name: DnsName = "no-minor-or-node-upgrades"
    scope: Literal["NO_MINOR_OR_NODE_UPGRADES", "NO_MINOR_UPGRADES"] = "NO_MINOR_OR_NODE_UPGRADES"
    start_time: Annotated[Annotated[str, Field(pattern=RFC3339)] | None, Field(description="an RFC 3339 time such as '2026-06-01T00:00:00Z'")] = None
    end_time: Annotated[Annotated[str, Field(pattern=RFC3339)] | None, Field(description="an RFC 3339 time such as '2026-06-30T00:00:00Z'")] = None


class GkeConfig(Model):
    system_pool: SystemPool = SystemPool()
    # The IAM-authorized DNS endpoint is how CI, Terraform Cloud and operators reach the API
    # server without an IP allow-list; false leaves only master_authorized_networks.
    dns_endpoint: bool = True
    # Closes the control plane's public IP endpoint (enable_private_endpoint; nodes and in-VPC
    # clients keep the private one). Unset: closed whenever the DNS endpoint is on, so a new
    # cluster exposes no IP endpoint beside it; a cluster reached over master_authorized_networks
    # today sets false until its users moved to the DNS endpoint (docs/maintenance.md).
    private_endpoint: bool | None = None
    maintenance_start_time: Annotated[str, Field(pattern=HH_MM, description="a UTC time of day as HH:MM, such as '09:00'")] = "09:00"
    upgrade_exclusion: UpgradeExclusion | None = None
    release_channel: Literal["RAPID", "REGULAR", "STABLE"] = "REGULAR"
    # The control plane's lowest version (google_container_cluster.min_master_version); GKE upgrades
    # within the release channel from there. Unset: the channel's default version.
    min_master_version: Annotated[str, _charset(GKE_VERSION, "a GKE version (1.X.Y-gke.Z)", "1.33.5-gke.1080000")] | None = None
    # Logs same-node pod traffic as VPC flows (review D7: volume and cost; TGKE safer default off).
    intranode_visibility: bool = False
    # None: zonal (one control-plane zone, GKE free-tier credit) for dev clusters in one zone,
    # regional (control plane replicated across the region's zones) everywhere else. ForceNew.
    zonal: bool | None = None
    # Google Groups for RBAC: without it GKE never puts group membership in the request, so
    # RoleBindings to Group subjects (tenant groups) match nobody.
    rbac_security_group: Annotated[str, AfterValidator(_rbac_security_group)] | None = None
    # Where GKE training pods reach Vault (gpufleet-exec's VAULT_ADDR); jobs on this cluster need it.
    vault_addr: Annotated[str, _charset(URL, "a Vault address (http(s)://host[:port][/path], no credentials or query)", "https://vault.example.com:8200")] | None = None


class Checkpoints(Model):
    """The cluster's checkpoint bucket (docs/checkpoints.md): one per cluster, a prefix per tenant."""

    # Objects older than this are deleted by the bucket's lifecycle rule: a run resumes from its
    # newest checkpoint, so old ones only cost storage. 1..3650 days.
    retention_days: Annotated[int, Field(ge=1, le=3650, description="days a checkpoint object is kept, e.g. 30")] = 30
    # Unset: '<project>-<cluster>-ckpt' (clusters.derive.checkpoints.bucket_name). Bucket names are
    # global: set one when the derived name is taken or too long.
    bucket: Annotated[str, _charset(BUCKET, "a GCS bucket name (3-63 lowercase letters, digits, '.', '_', '-')", "ml-train-prod-ckpt")] | None = None


class ClusterConfig(Model):
    # Must equal the file name (`clusters/<name>.yaml`); the stacks are `<name>` and `<name>-scheduler`.
    name: DnsName
    # dev: GPU pools unprotected by default; a Vault role serves dev clusters or the others, never both.
    environment: Environment
    # gke: a GKE cluster with Kueue (its jobs need gke.vault_addr); nomad: Nomad servers and GPU
    # clients on GCE (needs a nomad: section).
    scheduler: SchedulerKind
    # Where Terraform state lives: local (files in .gpufleet/state/, kept by `make clean`), gcs (a bucket
    # that must already exist) or tfc (Terraform Cloud workspaces, created by the tfc-workspaces stack).
    state: State = LocalState(backend="local")
    gcp: GcpConfig
    # Only with scheduler: gke.
    gke: GkeConfig | None = None
    # Only with scheduler: nomad.
    nomad: NomadConfig | None = None
    gpu_pools: Annotated[tuple[GpuPool, ...], Field(min_length=1)]
    iam: IamConfig = IamConfig()
    tenants: tuple[Tenant, ...] = ()
    idle: IdlePolicy = IdlePolicy()
    dns: DnsConfig | None = None
    checkpoints: Checkpoints = Checkpoints()
    # GPU-holding Nomad allocations or Kubernetes pods gpufleet made that no live experiment owns
    # (docs/release.md): 'report' (an event and the gpufleet_orphans metric) or 'stop' (report, then stop them).
    orphans: Literal["report", "stop"] = "report"
