"""One Nomad GPU client pool: an instance template plus a regional managed instance group."""

from __future__ import annotations

from constructs import Construct

from clusters.derive.nomad import GPU_HEALTH_TOKEN, NomadSecretSpec
from clusters.derive.pools import GpuPoolSpec
from clusters.families import needs_fabric_manager
from constructs_lib.naming import pin
from constructs_lib.nomad_agent_config import (CA_FILE, CERT_FILE, DATA_DIR, HTTP_PORT, KEY_FILE, AgentJoin, render_client_config,
                                               render_startup_script)
from constructs_lib.nomad_gpu_node import host_volumes, render_fabric_manager, render_local_ssd, render_telemetry_and_health
from constructs_lib.nomad_instance_template import Machine, nomad_instance_template
from constructs_lib.providers import google


def client_tag(cluster: str) -> str:
    return f"{cluster}-nomad-client"


class NomadClientPool(Construct):
    """Clients register with ``node_class`` and ``node_pool`` equal to the pool name, which jobs select.

    The group updates OPPORTUNISTICALLY: a new template reaches a VM only when it is recreated,
    so a config change never kills a running fine-tune. ``prevent_destroy`` follows
    ``spec.protected`` on the group and its autoscaler. ``self.group`` is the escape hatch.

    Autoscaled pools follow the Nomad queue: the Nomad Autoscaler on the servers resizes the group
    (``gce-mig`` target; policy in ``constructs_lib.nomad_autoscaler``): out on queued GPU runs,
    so a pool at zero grows, and in only on empty, drained nodes. Terraform creates the group at
    ``min_nodes`` and then ignores its size. No GCE autoscaler: its only signal is CPU, which a
    pool at zero or a queued run does not produce, and ``ONLY_SCALE_OUT`` never gave idle GPUs back.

    ``certificates``: the boot step that issues the client certificate from the cluster's PKI role
    (``vault-pki`` clusters), instead of the bootstrap's certificate from Secret Manager.

    GPU node setup (``constructs_lib.nomad_gpu_node``): NVIDIA Fabric Manager on NVSwitch shapes, the
    family's bundled local SSDs (``spec.local_ssd_count``) as one RAID0 host volume, the DCGM exporter and
    the GPU health checker on every client.
    """

    def __init__(self, scope: Construct, id_: str, *, spec: GpuPoolSpec, cluster: str, project: str, region: str,
                 subnetwork: str, service_account: str, datacenter: str, nomad_region: str,
                 join: AgentJoin, image: str, secrets: tuple[NomadSecretSpec, ...], certificates: str | None = None) -> None:
        super().__init__(scope, id_)
        local_ssds = spec.local_ssd_count or 0
        self.client_config = render_client_config(spec=spec, cluster=cluster, datacenter=datacenter, region=nomad_region, join=join,
                                                  host_volumes=host_volumes(local_ssds))
        health_secret = next((s.secret_id for s in secrets if s.name == GPU_HEALTH_TOKEN), None)
        if health_secret is None:
            raise ValueError(f"pool {spec.name}: the clients' secrets lack {GPU_HEALTH_TOKEN}, which the GPU health checker reads")
        gpu_setup = [render_fabric_manager()] if needs_fabric_manager(spec.machine_type) else []
        if local_ssds:
            gpu_setup.append(render_local_ssd(local_ssds))
        gpu_setup.append(render_telemetry_and_health(
            project=project, token_secret_id=health_secret, nomad_addr=f"https://localhost:{HTTP_PORT}",
            node_id_file=f"{DATA_DIR}/client/client-id", ca_file=CA_FILE, cert_file=CERT_FILE, key_file=KEY_FILE,
            expected_gpus=spec.gpus_per_node))
        name = f"{cluster}-{spec.name}"
        self.template = nomad_instance_template(
            self, f"nomad_client_template_{spec.name}", name_prefix=f"{name}-",
            machine=Machine(machine_type=spec.machine_type, image=image, disk_gb=spec.boot_disk_gb, disk_type=spec.boot_disk_type,
                            accelerator=spec.accelerator, gpus=spec.gpus_per_node, spot=spec.spot, reservation=spec.reservation,
                            local_ssds=local_ssds),
            project=project, region=region, subnetwork=subnetwork, service_account=service_account,
            startup_script=render_startup_script(agent_config=self.client_config, gpu=True, project=project, secrets=secrets,
                                                 certificates=certificates, gpu_setup="\n".join(gpu_setup)),
            tags=[client_tag(cluster)],
            labels={k.replace(".", "_").replace("/", "_"): v for k, v in spec.labels},
        )
        mig = google.compute_region_instance_group_manager
        # Static pools: Terraform owns the size. Autoscaled pools: created at the minimum, then the
        # Nomad Autoscaler owns it (ignore_changes), so an apply never undoes a scale-out.
        size = spec.node_count if spec.node_count is not None else spec.min_total_nodes
        lifecycle: dict[str, object] = {"prevent_destroy": spec.protected}
        if spec.autoscaling:
            lifecycle["ignore_changes"] = ["target_size"]
        self.group = pin(mig.ComputeRegionInstanceGroupManager(
            self, "group",
            name=name,
            base_instance_name=name,
            project=project,
            region=region,
            distribution_policy_zones=list(spec.zones),
            distribution_policy_target_shape="ANY" if spec.spot or spec.reservation else "BALANCED",
            version=[mig.ComputeRegionInstanceGroupManagerVersion(name="primary", instance_template=self.template.self_link_unique)],
            update_policy={"type": "OPPORTUNISTIC", "minimal_action": "REPLACE", "instance_redistribution_type": "NONE",
                           "max_surge_fixed": 0, "max_unavailable_fixed": len(spec.zones)},
            wait_for_instances=False,
            lifecycle=lifecycle,
            target_size=size,
        ), f"nomad_pool_{spec.name}")
