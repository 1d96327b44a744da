"""The untainted CPU node pool every GKE cluster gets beside its GPU pools."""

from __future__ import annotations

from constructs import Construct

from clusters.derive.gke import NODE_POOL_TIMEOUTS, SYSTEM_POOL_NAME, SystemPoolSpec
from constructs_lib.naming import pin
from constructs_lib.providers import google


class SystemNodePool(Construct):
    """Without an untainted node, pods that tolerate no GPU taint never schedule: Kueue's
    controller (its webhooks are ``failurePolicy: Fail``, so every Kueue object and Job create
    fails), kube-dns, konnectivity. The toolkit's gke-cluster module keeps such a pool
    (``system_node_pools``, e2-standard-4, total min 2). Hardened like the GPU pools: shielded,
    ``GKE_METADATA``, no legacy metadata endpoints. ``self.pool`` is the escape hatch.
    """

    def __init__(self, scope: Construct, id_: str, *, spec: SystemPoolSpec, cluster_id: str, location: str,
                 node_service_account: str, resource_labels: dict[str, str]) -> None:
        super().__init__(scope, id_)
        self.pool = pin(google.container_node_pool.ContainerNodePool(
            self, "pool",
            name=SYSTEM_POOL_NAME,
            cluster=cluster_id,
            location=location,
            node_locations=list(spec.zones),
            initial_node_count=-(-spec.min_nodes // len(spec.zones)),
            autoscaling={"total_min_node_count": spec.min_nodes, "total_max_node_count": spec.max_nodes,
                         "location_policy": "BALANCED"},
            management={"auto_repair": True, "auto_upgrade": True},
            upgrade_settings={"max_surge": 1, "max_unavailable": 0},
            node_config={
                "machine_type": spec.machine_type,
                "disk_size_gb": spec.boot_disk_gb,
                "disk_type": "pd-balanced",
                "image_type": "COS_CONTAINERD",
                "service_account": node_service_account,
                "oauth_scopes": ["https://www.googleapis.com/auth/cloud-platform"],
                "labels": dict(spec.labels),
                "resource_labels": resource_labels,
                "shielded_instance_config": {"enable_secure_boot": True, "enable_integrity_monitoring": True},
                "workload_metadata_config": {"mode": "GKE_METADATA"},
                "gvnic": {"enabled": True},
                "metadata": {"disable-legacy-endpoints": "true"},
            },
            lifecycle={"prevent_destroy": spec.protected, "ignore_changes": ["initial_node_count"]},
            timeouts=NODE_POOL_TIMEOUTS,
        ), "system_pool")
