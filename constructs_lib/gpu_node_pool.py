"""A GKE GPU node pool declared from a derived GpuPoolSpec."""

from __future__ import annotations

from constructs import Construct

from clusters.derive import GpuPoolSpec
from constructs_lib.naming import pin
from constructs_lib.providers import google


class GpuNodePool(Construct):
    """GPU nodes carry the ``nvidia.com/gpu`` taint so only pods that ask for GPUs land there.

    A static ``node_count`` is per zone on GKE: the pool holds ``node_count`` x zones nodes,
    which is what ``spec.capacity_gpus`` counts. ``prevent_destroy`` follows ``spec.protected``: losing a reserved pool can mean losing the
    reservation's capacity for weeks. The underlying resource is ``self.pool`` for overrides.
    """

    def __init__(self, scope: Construct, id_: str, *, spec: GpuPoolSpec, cluster_id: str, region: str,
                 node_service_account: str) -> None:
        super().__init__(scope, id_)
        node_config: dict[str, object] = {
            "machine_type": spec.machine_type,
            "disk_size_gb": spec.boot_disk_gb,
            "disk_type": spec.boot_disk_type,
            "image_type": "COS_CONTAINERD",
            "spot": spec.spot,
            "service_account": node_service_account,
            "oauth_scopes": ["https://www.googleapis.com/auth/cloud-platform"],
            "labels": dict(spec.labels),
            "taint": [google.container_node_pool.ContainerNodePoolNodeConfigTaint(key=t.key, value=t.value, effect=t.effect) for t in spec.taints],
            "guest_accelerator": [google.container_node_pool.ContainerNodePoolNodeConfigGuestAccelerator(
                type=spec.accelerator, count=spec.gpus_per_node,
                gpu_driver_installation_config={"gpu_driver_version": "LATEST"})],
            "shielded_instance_config": {"enable_secure_boot": True, "enable_integrity_monitoring": True},
            "workload_metadata_config": {"mode": "GKE_METADATA"},
            "gvnic": {"enabled": True},
            "metadata": {"disable-legacy-endpoints": "true"},
            "reservation_affinity": (
                {"consume_reservation_type": "SPECIFIC_RESERVATION", "key": "compute.googleapis.com/reservation-name",
                 "values": [spec.reservation]}
                if spec.reservation else {"consume_reservation_type": "NO_RESERVATION"}
            ),
        }
        sizing: dict[str, object] = (
            {"node_count": spec.node_count} if spec.node_count is not None else {
                "initial_node_count": spec.initial_nodes_per_zone,
                "autoscaling": {"total_min_node_count": spec.min_nodes, "total_max_node_count": spec.max_nodes,
                                "location_policy": "ANY" if spec.spot or spec.queued_provisioning else "BALANCED"},
            }
        )
        extras: dict[str, object] = {}
        if spec.compact_placement:
            extras["placement_policy"] = {"type": "COMPACT"}
        if spec.queued_provisioning:
            extras["queued_provisioning"] = {"enabled": True}
        self.pool = pin(google.container_node_pool.ContainerNodePool(
            self, "pool",
            name=spec.name,
            cluster=cluster_id,
            location=region,
            node_locations=list(spec.zones),
            management={"auto_repair": True, "auto_upgrade": True},
            upgrade_settings={"max_surge": 1, "max_unavailable": 0},
            node_config=node_config,
            lifecycle={"prevent_destroy": spec.protected, "ignore_changes": ["initial_node_count"]},
            **sizing,
            **extras,
        ), f"pool_{spec.name}")
