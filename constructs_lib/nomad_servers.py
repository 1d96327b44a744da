"""A small fixed Nomad server group (no GPUs) behind an internal TCP load balancer."""

from __future__ import annotations

from constructs import Construct

from clusters.schema import ClusterConfig, Environment, NomadConfig
from constructs_lib.naming import pin
from constructs_lib.nomad_agent_config import HTTP_PORT, AgentJoin, render_server_config, render_startup_script
from constructs_lib.nomad_instance_template import SERVER_IMAGE, Machine, nomad_instance_template
from constructs_lib.providers import google

SERVER_DISK_GB = 50
# Cloud auto-join lists instances by tag; that needs compute read access on the agents' SA.
AUTOJOIN_ROLE = "roles/compute.viewer"


def server_tag(cluster: str) -> str:
    return f"{cluster}-nomad-server"


class NomadServers(Construct):
    """Created only when the cluster file names no existing servers.

    The servers keep Raft state on their boot disks, so the group updates OPPORTUNISTICALLY
    (never several at once, which would lose quorum) and is protected outside dev. The
    internal load balancer gives the scheduler stack one stable address inside the VPC.
    """

    def __init__(self, scope: Construct, id_: str, *, config: ClusterConfig, nomad: NomadConfig, vpc_id: str, subnetwork: str,
                 service_account: str, join: AgentJoin) -> None:
        super().__init__(scope, id_)
        gcp, name = config.gcp, f"{config.name}-nomad"
        protected = config.environment != Environment.DEV
        self.server_config = render_server_config(count=nomad.servers.count, datacenter=nomad.datacenter, region=nomad.region,
                                                  vault_addr=nomad.vault_addr, join=join)
        self.template = nomad_instance_template(
            self, "nomad_server_template", name_prefix=f"{name}-server-",
            machine=Machine(machine_type=nomad.servers.machine_type, image=SERVER_IMAGE, disk_gb=SERVER_DISK_GB, disk_type="pd-balanced"),
            project=gcp.project, region=gcp.region, subnetwork=subnetwork, service_account=service_account,
            startup_script=render_startup_script(agent_config=self.server_config, gpu=False),
            tags=[server_tag(config.name)], labels={"gpufleet-cluster": config.name, "nomad-role": "server"},
        )
        mig = google.compute_region_instance_group_manager
        self.group = pin(mig.ComputeRegionInstanceGroupManager(
            self, "group", name=f"{name}-servers", base_instance_name=f"{name}-server", project=gcp.project, region=gcp.region,
            distribution_policy_zones=list(gcp.zones), target_size=nomad.servers.count,
            version=[mig.ComputeRegionInstanceGroupManagerVersion(name="primary", instance_template=self.template.self_link_unique)],
            update_policy={"type": "OPPORTUNISTIC", "minimal_action": "REPLACE", "instance_redistribution_type": "NONE",
                           "max_surge_fixed": 0, "max_unavailable_fixed": len(gcp.zones)},
            wait_for_instances=False, lifecycle={"prevent_destroy": protected},
        ), "nomad_servers")
        self.autojoin_grant = pin(google.project_iam_member.ProjectIamMember(
            self, "autojoin", project=gcp.project, role=AUTOJOIN_ROLE, member=f"serviceAccount:{service_account}"), "nomad_autojoin_compute_viewer")
        self.health_check = pin(google.compute_region_health_check.ComputeRegionHealthCheck(
            self, "health", name=f"{name}-api", project=gcp.project, region=gcp.region,
            http_health_check={"port": HTTP_PORT, "request_path": "/v1/agent/health?type=server"},
            log_config={"enable": True}), "nomad_api_health")
        self.backend = pin(google.compute_region_backend_service.ComputeRegionBackendService(
            self, "backend", name=f"{name}-api", project=gcp.project, region=gcp.region, protocol="TCP",
            load_balancing_scheme="INTERNAL", health_checks=[self.health_check.id],
            backend=[google.compute_region_backend_service.ComputeRegionBackendServiceBackend(
                group=self.group.instance_group, balancing_mode="CONNECTION")],
            log_config={"enable": True}), "nomad_api_backend")
        self.forwarding_rule = pin(google.compute_forwarding_rule.ComputeForwardingRule(
            self, "api", name=f"{name}-api", project=gcp.project, region=gcp.region, load_balancing_scheme="INTERNAL",
            backend_service=self.backend.id, ip_protocol="TCP", ports=[str(HTTP_PORT)], network=vpc_id, subnetwork=subnetwork,
            allow_global_access=False), "nomad_api")
        self.address = f"http://{self.forwarding_rule.ip_address}:{HTTP_PORT}"
