"""Nomad servers: one zonal group per zone with Raft on stateful disks, behind an internal TCP load balancer."""

from __future__ import annotations

from constructs import Construct

from clusters.derive.nomad import AUTOSCALER_CERT_FILE, AUTOSCALER_KEY_FILE, AUTOSCALER_TOKEN, NomadPkiSpec, NomadSecretSpec, NomadServersSpec, nomad_server_account_id, server_tag
from clusters.derive.pools import GpuPoolSpec
from constructs_lib.naming import pin
from constructs_lib.nomad_agent_config import (
    CA_FILE, DATA_DIR, HTTP_PORT, AgentJoin, render_server_config, render_startup_script,
)
from constructs_lib.nomad_autoscaler import UNIT as AUTOSCALER_UNIT
from constructs_lib.nomad_autoscaler import render_agent_config, render_autoscaler_boot, render_policy
from constructs_lib.nomad_cert_renewal import RELOAD, render_env, render_renewal_boot
from constructs_lib.nomad_instance_template import SERVER_IMAGE, DataDisk, Machine, nomad_instance_template
from constructs_lib.providers import google

SERVER_DISK_GB = 50
DATA_DEVICE = "nomad-data"
# Cloud auto-join lists instances by tag; that needs compute read access on the agents' SA.
AUTOJOIN_ROLE = "roles/compute.viewer"
# The Nomad Autoscaler on the servers resizes the pools' groups and deletes drained instances.
AUTOSCALER_ROLE = "roles/compute.instanceAdmin.v1"
SERVER_ROLES = ("roles/logging.logWriter", "roles/monitoring.metricWriter", AUTOJOIN_ROLE)


class NomadServers(Construct):
    """Created only when the cluster file names no existing servers.

    Quorum survives a zone: servers spread over (normally 3) zones, one zonal group per zone,
    so no group ever has more than one server unavailable. Raft state lives on a stateful data
    disk (``delete_rule = NEVER``) that the group re-attaches when it recreates the VM under
    the same name, so a replaced server rejoins with its log instead of as a blank peer.
    Groups update OPPORTUNISTICALLY: a new template reaches a server only when an operator
    recreates it, one at a time (README: "Nomad: replace servers"). No autohealing: a blind
    recreate of several servers would lose quorum.

    Servers run as their own service account, which alone may read the server key and the
    gossip key; clients (which run tenant code) cannot.
    """

    def __init__(self, scope: Construct, id_: str, *, cluster: str, project: str, region: str, spec: NomadServersSpec,
                 datacenter: str, nomad_region: str, vpc_id: str, subnetwork: str, node_service_account: str, join: AgentJoin,
                 secrets: tuple[NomadSecretSpec, ...], global_access: bool, pools: tuple[GpuPoolSpec, ...] = (),
                 prometheus_address: str | None = None, pki: NomadPkiSpec | None = None, vault_addr: str = "") -> None:
        super().__init__(scope, id_)
        name = f"{cluster}-nomad"
        self.service_account = pin(google.service_account.ServiceAccount(
            self, "sa", account_id=nomad_server_account_id(cluster), project=project,
            display_name=f"gpufleet {cluster} Nomad servers"), "nomad_server_sa")
        member = f"serviceAccount:{self.service_account.email}"
        self.roles = {
            role: pin(google.project_iam_member.ProjectIamMember(self, f"role_{role.rsplit('/', 1)[-1]}", project=project, role=role, member=member),
                      f"nomad_server_role_{role.rsplit('/', 1)[-1].replace('.', '_')}")
            for role in SERVER_ROLES + ((AUTOSCALER_ROLE,) if prometheus_address else ())
        }
        self.autojoin_grant = pin(google.project_iam_member.ProjectIamMember(
            self, "autojoin", project=project, role=AUTOJOIN_ROLE, member=f"serviceAccount:{node_service_account}"), "nomad_autojoin_compute_viewer")
        self.server_config = render_server_config(count=spec.count, datacenter=datacenter, region=nomad_region, join=join)
        self.autoscaler_config, self.policies, autoscaler_boot = None, {}, None
        token = next((s for s in secrets if s.name == AUTOSCALER_TOKEN), None)
        if prometheus_address is not None and token is not None:
            # Its own client certificate, not the server's (the bootstrap script makes one for it alone).
            prometheus_ca = next((s.path for s in secrets if s.name == "prometheus-ca"), None)
            self.autoscaler_config = render_agent_config(nomad_region=nomad_region, prometheus_address=prometheus_address,
                                                         ca_file=CA_FILE, cert_file=AUTOSCALER_CERT_FILE, key_file=AUTOSCALER_KEY_FILE,
                                                         prometheus_ca_file=prometheus_ca)
            self.policies = {f"{cluster}-{p.name}": render_policy(spec=p, cluster=cluster, project=project, region=region)
                             for p in pools if p.autoscaling}
            autoscaler_boot = render_autoscaler_boot(config=self.autoscaler_config, policies=self.policies, token_secret=token.secret_id)
        certificates = None
        if pki is not None:
            role = next(r for r in pki.roles if r.name == "server")
            # The forwarding rule is named here, not referenced: the balancer is built on the groups this template feeds.
            # The autoscaler's Nomad client reads the CA (which a PKI issuer change may replace) only when it starts.
            reload = f"{RELOAD}; systemctl try-restart {AUTOSCALER_UNIT}" if self.autoscaler_config else RELOAD
            certificates = render_renewal_boot(env=render_env(spec=pki, role=role, vault_addr=vault_addr, owner="nomad:nomad", reload=reload,
                                                              api_forwarding_rule=f"projects/{project}/regions/{region}/forwardingRules/{name}-api"))
        self.template = nomad_instance_template(
            self, "nomad_server_template", name_prefix=f"{name}-server-",
            machine=Machine(machine_type=spec.machine_type, image=SERVER_IMAGE, disk_gb=SERVER_DISK_GB, disk_type="pd-balanced",
                            data_disk=DataDisk(device_name=DATA_DEVICE, size_gb=spec.data_disk_gb, mount_path=DATA_DIR)),
            project=project, region=region, subnetwork=subnetwork, service_account=self.service_account.email,
            startup_script=render_startup_script(agent_config=self.server_config, gpu=False, project=project, secrets=secrets,
                                                 data_device=DATA_DEVICE, extra=autoscaler_boot, run_as="nomad",
                                                 certificates=certificates),
            tags=[server_tag(cluster)], labels={"gpufleet-cluster": cluster, "nomad-role": "server"},
        )
        mig = google.compute_instance_group_manager
        self.groups = {}
        for group in spec.groups:
            self.groups[group.zone] = pin(mig.ComputeInstanceGroupManager(
                self, f"group_{group.suffix}", name=f"{name}-servers-{group.suffix}", base_instance_name=f"{name}-server-{group.suffix}",
                project=project, zone=group.zone, target_size=group.size,
                version=[mig.ComputeInstanceGroupManagerVersion(name="primary", instance_template=self.template.self_link_unique)],
                stateful_disk=[mig.ComputeInstanceGroupManagerStatefulDisk(device_name=DATA_DEVICE, delete_rule="NEVER")],
                update_policy={"type": "OPPORTUNISTIC", "minimal_action": "REPLACE", "replacement_method": "RECREATE",
                               "max_surge_fixed": 0, "max_unavailable_fixed": 1},
                wait_for_instances=False, lifecycle={"prevent_destroy": spec.protected},
            ), f"nomad_servers_{group.suffix}")
        # TCP, not HTTP: the API requires a client certificate (verify_https_client), which no
        # Google health checker presents.
        self.health_check = pin(google.compute_region_health_check.ComputeRegionHealthCheck(
            self, "health", name=f"{name}-api", project=project, region=region,
            tcp_health_check={"port": HTTP_PORT}, log_config={"enable": True}), "nomad_api_health")
        self.backend = pin(google.compute_region_backend_service.ComputeRegionBackendService(
            self, "backend", name=f"{name}-api", project=project, region=region, protocol="TCP",
            load_balancing_scheme="INTERNAL", health_checks=[self.health_check.id],
            backend=[google.compute_region_backend_service.ComputeRegionBackendServiceBackend(
                group=g.instance_group, balancing_mode="CONNECTION") for _, g in sorted(self.groups.items())],
            log_config={"enable": True}), "nomad_api_backend")
        self.forwarding_rule = pin(google.compute_forwarding_rule.ComputeForwardingRule(
            self, "api", name=f"{name}-api", project=project, region=region, load_balancing_scheme="INTERNAL",
            backend_service=self.backend.id, ip_protocol="TCP", ports=[str(HTTP_PORT)], network=vpc_id, subnetwork=subnetwork,
            # Callers in the file's api_access ranges may sit behind VPN/Interconnect in another region.
            allow_global_access=global_access), "nomad_api")
        self.address = f"https://{self.forwarding_rule.ip_address}:{HTTP_PORT}"
