"""Nomad clusters: server groups, agent secrets and their paths, task group names.

Pure derivations from a validated ClusterConfig; tests call them directly, constructs only read the
specs. Nothing here knows cdktf.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from enum import StrEnum

from clusters.schema import ClusterConfig, Environment

class NomadRole(StrEnum):
    SERVER = "server"
    CLIENT = "client"


@dataclass(frozen=True)
class NomadSecretSpec:
    """One Secret Manager secret an agent reads at boot. Terraform creates the empty secret and
    its IAM; the bootstrap adds the value as a version, so no key is ever in a file, the
    synthesized JSON or Terraform state."""

    name: str
    secret_id: str
    path: str
    readers: tuple[NomadRole, ...]
    purpose: str


NOMAD_TLS_DIR = "/etc/nomad.d/tls"


# Created after `nomad acl bootstrap` (README), so the TLS bootstrap script does not make it.
AUTOSCALER_TOKEN = "autoscaler-token"
# Also made after the ACL bootstrap; read by the GPU health checker on each run, never at boot
# (constructs_lib.nomad_gpu_health_check), so a client boots and reports metrics before it exists.
GPU_HEALTH_TOKEN = "gpu-health-token"


def management_token_path(cluster: str) -> str:
    """KV v2 path (under the ``secret`` mount) where ``gpufleet nomad acl-bootstrap`` keeps the cluster's
    Nomad management token (key ``secret_id``); never in a secret Terraform creates, so never in state."""
    return f"gpufleet/nomad/{cluster}/management-token"


NOMAD_GOSSIP_FILE = "/etc/nomad.d/gossip.hcl"


# The Nomad Autoscaler's own identity: a client certificate of the cluster CA made for it alone by the
# bootstrap script (the servers' key stays the servers'), and the CA that signed an https Prometheus
# (the prometheus APM's ``ca_cert``, a file path: nomad-autoscaler v0.4.9
# plugins/builtin/apm/prometheus/plugin/plugin.go:45-47 and :173-187, read with os.ReadFile).
AUTOSCALER_CERT_FILE = f"{NOMAD_TLS_DIR}/autoscaler.pem"
AUTOSCALER_KEY_FILE = f"{NOMAD_TLS_DIR}/autoscaler-key.pem"
PROMETHEUS_CA_FILE = f"{NOMAD_TLS_DIR}/prometheus-ca.pem"
AUTOSCALER_SECRETS = frozenset({AUTOSCALER_TOKEN, "autoscaler-cert", "autoscaler-key", "prometheus-ca"})


# (name, file on the agent, who reads it, what it is). The CA key is never among them: it
# stays with the operator who ran the bootstrap (offline or in a separate, operator-only secret).
_NOMAD_SECRETS = (
    ("ca-cert", f"{NOMAD_TLS_DIR}/ca.pem", (NomadRole.SERVER, NomadRole.CLIENT), "CA certificate every agent verifies peers against"),
    ("server-cert", f"{NOMAD_TLS_DIR}/agent.pem", (NomadRole.SERVER,), "server certificate, SAN server.<region>.nomad"),
    ("server-key", f"{NOMAD_TLS_DIR}/agent-key.pem", (NomadRole.SERVER,), "server private key"),
    ("client-cert", f"{NOMAD_TLS_DIR}/agent.pem", (NomadRole.CLIENT,), "client certificate, SAN client.<region>.nomad"),
    ("client-key", f"{NOMAD_TLS_DIR}/agent-key.pem", (NomadRole.CLIENT,), "client private key"),
    ("gossip-key", NOMAD_GOSSIP_FILE, (NomadRole.SERVER,), "gossip (Serf) encryption key, 32 random bytes base64"),
    ("autoscaler-token", "", (NomadRole.SERVER,), "ACL token (policy gpufleet-autoscaler) of the Nomad Autoscaler on the servers"),
    ("gpu-health-token", "", (NomadRole.CLIENT,), "ACL token (policy gpufleet-gpu-health, node:write) the clients' GPU health checker"
     " reads on each run to drain its own failing node"),
    ("autoscaler-cert", AUTOSCALER_CERT_FILE, (NomadRole.SERVER,), "the Nomad Autoscaler's own client certificate (not the server's)"),
    ("autoscaler-key", AUTOSCALER_KEY_FILE, (NomadRole.SERVER,), "the Nomad Autoscaler's client key"),
    ("prometheus-ca", PROMETHEUS_CA_FILE, (NomadRole.SERVER,), "CA certificate of the https Prometheus the autoscaler queries (public material)"),
)


# With ``vault-pki`` agents get these from the cluster's PKI mount at boot and on renewal instead.
# The secrets stay (their resources are protected, and a fleet moving to PKI keeps them until
# every agent has renewed once); only the boot scripts stop reading them (agent_secrets).
PKI_ISSUED = frozenset({"ca-cert", "server-cert", "server-key", "client-cert", "client-key"})


def derive_nomad_secrets(config: ClusterConfig) -> tuple[NomadSecretSpec, ...]:
    """The secrets of a Nomad cluster; with ``existing_servers`` only what its clients read."""
    has_servers = config.nomad is not None and not config.nomad.existing_servers
    autoscaler = config.nomad.autoscaler if has_servers and config.nomad is not None else None
    wanted = {AUTOSCALER_TOKEN, "autoscaler-cert", "autoscaler-key"} if autoscaler is not None else set()
    if autoscaler is not None and autoscaler.prometheus_address.startswith("https://"):
        wanted.add("prometheus-ca")
    return tuple(
        NomadSecretSpec(name, f"{config.name}-nomad-{name}", path, readers, purpose)
        for name, path, readers, purpose in _NOMAD_SECRETS
        if (has_servers or NomadRole.CLIENT in readers) and (name not in AUTOSCALER_SECRETS or name in wanted)
    )


def nomad_secrets_for(secrets: tuple[NomadSecretSpec, ...], role: NomadRole, *, pki: bool = False) -> tuple[NomadSecretSpec, ...]:
    """What an agent of ``role`` reads from Secret Manager at boot; with ``pki`` not the TLS material."""
    return tuple(s for s in secrets if role in s.readers and not (pki and s.name in PKI_ISSUED))


@dataclass(frozen=True)
class NomadServerGroupSpec:
    """One zonal server group. Zonal groups of one or two servers, not one regional group: a
    regional group's fixed max_unavailable is at least its zone count, so a rolling replace
    could take a majority; here a group never has more than one server down."""

    zone: str
    size: int

    @property
    def suffix(self) -> str:
        return self.zone.rsplit("-", 1)[-1]


@dataclass(frozen=True)
class NomadServersSpec:
    count: int
    machine_type: str
    groups: tuple[NomadServerGroupSpec, ...]
    data_disk_gb: int
    protected: bool


def derive_nomad_servers(config: ClusterConfig) -> NomadServersSpec | None:
    """Servers spread round-robin over their zones (5 over 3 zones: 2, 2, 1), so losing any one
    zone leaves a majority. None when the file names existing servers."""
    nomad = config.nomad
    if nomad is None or nomad.existing_servers:
        return None
    servers = nomad.servers
    zones = tuple(dict.fromkeys(servers.zones or config.gcp.zones))
    sizes = [servers.count // len(zones) + (1 if i < servers.count % len(zones) else 0) for i in range(len(zones))]
    return NomadServersSpec(
        count=servers.count,
        machine_type=servers.machine_type,
        groups=tuple(NomadServerGroupSpec(z, n) for z, n in zip(zones, sizes, strict=True) if n > 0),
        data_disk_gb=servers.data_disk_gb,
        protected=config.environment != Environment.DEV,
    )


def nomad_task_group_name(pool: str, gpus: int) -> str:
    """``gpu-<pool>-x<gpus>``: Nomad's job-summary metrics carry the task group, not the node pool,
    so a pool's autoscaling policy finds the GPUs its runs want by this name
    (``constructs_lib.nomad_autoscaler.demand_query``); jobs name their group with it."""
    return f"gpu-{pool}-x{gpus}"


def server_tag(cluster: str) -> str:
    """The servers' network tag: cloud auto-join, the API and metrics firewall rules and the
    Prometheus scrape job all find the servers by it."""
    return f"{cluster}-nomad-server"


@dataclass(frozen=True)
class PkiRoleSpec:
    """One PKI role: the only names a certificate of this agent role may carry. Nomad checks
    ``<role>.<region>.nomad`` (verify_server_hostname); localhost and IP SANs let local callers
    and the load balancer's address verify too. Both key usages: servers dial each other, and a
    client's HTTP API serves TLS."""

    name: str
    common_name: str
    policy: str
    auth_role: str
    service_account: str


@dataclass(frozen=True)
class NomadPkiSpec:
    cluster: str
    mount: str
    ttl_hours: int
    roles: tuple[PkiRoleSpec, ...]

    @property
    def renew_before_seconds(self) -> int:
        """Renew with a third of the lifetime left: a timer that runs hourly has many tries,
        and an OpenBao outage shorter than that costs nothing."""
        return self.ttl_hours * 3600 // 3


def derive_nomad_pki(config: ClusterConfig) -> NomadPkiSpec | None:
    """The cluster's PKI mount and its server/client roles, when the file asks for ``vault-pki``.
    Clusters on existing servers get only the client role (their servers are not ours)."""
    nomad = config.nomad
    if nomad is None or nomad.tls.certificates != "vault-pki":
        return None
    roles = (NomadRole.SERVER, NomadRole.CLIENT) if not nomad.existing_servers else (NomadRole.CLIENT,)
    accounts = {NomadRole.SERVER: nomad_server_account_id(config.name), NomadRole.CLIENT: node_account_id(config.name)}
    return NomadPkiSpec(
        cluster=config.name, mount=f"pki-nomad-{config.name}", ttl_hours=nomad.tls.agent_cert_ttl_hours,
        roles=tuple(PkiRoleSpec(name=role.value, common_name=f"{role.value}.{nomad.region}.nomad", policy=f"nomad-pki-{config.name}-{role.value}",
                                auth_role=f"nomad-{config.name}-{role.value}",
                                service_account=f"{accounts[role]}@{config.gcp.project}.iam.gserviceaccount.com") for role in roles))


def nomad_server_account_id(cluster: str) -> str:
    """The servers' service account id (30 characters at most: the cluster name is cut)."""
    return f"{cluster[:19]}-nomad-srv"


def node_account_id(cluster: str) -> str:
    """The GPU nodes' service account id, which Nomad clients run as."""
    return f"{cluster[:22]}-nodes"


def static_certificate_expiry(config: ClusterConfig, today: date, warn_days: int) -> tuple[str, str | None, int | None] | None:
    """What of a Nomad cluster's TLS does not renew, and when it ends: (what, date or None when
    the file does not say, days left), or None while that is more than ``warn_days`` away.

    ``static`` clusters: every agent certificate and the operator/Prometheus ones (the bootstrap
    script's ``-days 365``); ``vault-pki`` clusters: only the operator and Prometheus certificates,
    since agents renew their own."""
    nomad = config.nomad
    if nomad is None:
        return None
    what = ("the agents', operators' and Prometheus' Nomad certificates" if nomad.tls.certificates == "static"
            else "the operators' and Prometheus' Nomad certificates (agents renew theirs)")
    if nomad.tls.static_expires is None:
        return what, None, None
    left = (date.fromisoformat(nomad.tls.static_expires) - today).days
    return (what, nomad.tls.static_expires, left) if left <= warn_days else None
