"""A GKE GPU node pool declared from a derived GpuPoolSpec."""

from __future__ import annotations

from cdktf import Precondition
from constructs import Construct

from clusters.derive.gke import NODE_POOL_TIMEOUTS, NODE_SYSCTLS
from clusters.derive.pools import GpuPoolSpec
from clusters.reservation import error_message, precondition
from constructs_lib.naming import pin, tf_id
from constructs_lib.providers import google


class GpuNodePool(Construct):
    """GPU nodes carry the ``nvidia.com/gpu`` taint so only pods that ask for GPUs land there.

    A static ``node_count`` is per zone on GKE: the pool holds ``node_count`` x zones nodes,
    which is what ``spec.capacity_gpus`` counts. Upgrade settings, local SSDs, driver version and
    location policy come derived in the spec (``clusters.derive``). A reserved pool names its
    reservation in full and checks it before apply (``clusters.reservation``, as the toolkit does). ``prevent_destroy`` follows ``spec.protected``: losing a reserved pool can mean losing the
    reservation's capacity for weeks. The underlying resource is ``self.pool`` for overrides.
    """

    def __init__(self, scope: Construct, id_: str, *, spec: GpuPoolSpec, cluster_id: str, location: str,
                 node_service_account: str, resource_labels: dict[str, str],
                 node_networks: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(scope, id_)
        reservation = spec.reservation_spec
        lifecycle: dict[str, object] = {"prevent_destroy": spec.protected, "ignore_changes": ["initial_node_count"]}
        self.reservation = None
        if reservation is not None:
            # Read by name only (never the block suffix) in the pool's zone; the precondition
            # refuses the plan when it is missing there, not specific-only, or of another shape.
            self.reservation = pin(google.data_google_compute_reservation.DataGoogleComputeReservation(
                self, "reservation", name=reservation.name, zone=reservation.zone, project=reservation.project,
            ), f"reservation_{spec.name}")
            ref = f"data.google_compute_reservation.{tf_id('reservation_' + spec.name)}"
            lifecycle["precondition"] = [Precondition(
                condition="${" + precondition(ref, spec.machine_type, spec.accelerator, spec.gpus_per_node, spec.max_total_nodes) + "}",
                error_message=error_message(reservation, spec.machine_type, spec.accelerator, spec.gpus_per_node, spec.max_total_nodes),
            )]
        node_config: dict[str, object] = {
            "machine_type": spec.machine_type,
            "disk_size_gb": spec.boot_disk_gb,
            "disk_type": spec.boot_disk_type,
            "image_type": "COS_CONTAINERD",
            "spot": spec.spot,
            "service_account": node_service_account,
            "oauth_scopes": ["https://www.googleapis.com/auth/cloud-platform"],
            "labels": dict(spec.labels),
            # GCE labels on the VMs (cost attribution per pool): the provider's default_labels
            # stop at the cluster resource in 6.50, so node pools set their own.
            "resource_labels": {**resource_labels, "gpufleet-pool": spec.name},
            "taint": [google.container_node_pool.ContainerNodePoolNodeConfigTaint(key=t.key, value=t.value, effect=t.effect) for t in spec.taints],
            "guest_accelerator": [google.container_node_pool.ContainerNodePoolNodeConfigGuestAccelerator(
                type=spec.accelerator, count=spec.gpus_per_node,
                gpu_driver_installation_config={"gpu_driver_version": spec.gpu_driver_version})],
            "shielded_instance_config": {"enable_secure_boot": True, "enable_integrity_monitoring": True},
            "workload_metadata_config": {"mode": "GKE_METADATA"},
            "gvnic": {"enabled": True},
            "metadata": {"disable-legacy-endpoints": "true"},
            # Review D4: image streaming starts multi-GB training images before they are fully
            # pulled (toolkit enable_gcfs, TGKE enable_gcfs); images outside Artifact Registry pull normally.
            "gcfs_config": {"enabled": True},
            # Review D5: the toolkit's default TCP buffers (gke-node-pool/variables.tf linux_node_config).
            "linux_node_config": {"sysctls": dict(NODE_SYSCTLS)},
            "reservation_affinity": (
                {"consume_reservation_type": "SPECIFIC_RESERVATION", "key": "compute.googleapis.com/reservation-name",
                 "values": [reservation.affinity_value]}
                if reservation else {"consume_reservation_type": "NO_RESERVATION"}
            ),
        }
        if spec.queued_provisioning:
            # DWS flex-start as the toolkit's dws-flex-start-queued-provisioning example runs it
            # (gke-a3-ultragpu.yaml:163 enable_flex_start with enable_queued_provisioning; gke-node-pool/
            # main.tf:165 -> node_config.flex_start). Its preconditions (main.tf:416-429: no auto-repair,
            # no static node count, NO_RESERVATION, not spot) are what clusters.checks and derive_upgrade
            # already require of a queued pool. ForceNew (provider 6.50.0 node_config.go:1020-1024): set at creation.
            node_config["flex_start"] = True
        if spec.host_maintenance_interval:
            node_config["host_maintenance_policy"] = {"maintenance_interval": spec.host_maintenance_interval}
        if spec.local_ssd_count:
            # The NVMe SSDs bundled with A3/A4 machines back emptyDir and the image store
            # (toolkit gke-node-pool/disk_definitions.tf); ForceNew, so set at creation.
            node_config["ephemeral_storage_local_ssd_config"] = {"local_ssd_count": spec.local_ssd_count}
        sizing: dict[str, object] = (
            {"node_count": spec.node_count} if spec.node_count is not None else {
                "initial_node_count": spec.initial_nodes_per_zone,
                "autoscaling": {"total_min_node_count": spec.min_nodes, "total_max_node_count": spec.max_nodes,
                                "location_policy": spec.location_policy},
            }
        )
        extras: dict[str, object] = {}
        if spec.compact_placement:
            extras["placement_policy"] = {"type": "COMPACT", **({"policy_name": spec.placement_policy_name} if spec.placement_policy_name else {})}
        if spec.queued_provisioning:
            extras["queued_provisioning"] = {"enabled": True}
        if node_networks:
            # GPUDirect NICs: one extra VPC per NIC (ForceNew, so right before the first apply).
            extras["network_config"] = {"additional_node_network_configs": [
                google.container_node_pool.ContainerNodePoolNetworkConfigAdditionalNodeNetworkConfigs(network=n, subnetwork=sn)
                for n, sn in node_networks]}
        self.pool = pin(google.container_node_pool.ContainerNodePool(
            self, "pool",
            name=spec.name,
            cluster=cluster_id,
            location=location,
            node_locations=list(spec.zones),
            management={"auto_repair": spec.upgrade.auto_repair, "auto_upgrade": spec.upgrade.auto_upgrade},
            upgrade_settings={"max_surge": spec.upgrade.max_surge, "max_unavailable": spec.upgrade.max_unavailable},
            node_config=node_config,
            lifecycle=lifecycle,
            timeouts=NODE_POOL_TIMEOUTS,
            **sizing,
            **extras,
        ), f"pool_{spec.name}")
