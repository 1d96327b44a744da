"""checkov findings that the synthesized resource itself proves are required, exempted per
resource (never per check id, which would hide the same finding on every other resource).

checkov ignores inline skip comments for ``terraform_json``, and ``.checkov-skips.yaml`` skips
a check everywhere. These exemptions are derived from the stack JSON, so they follow the
cluster file: a DWS pool gets its own, a normal pool never does. Each has its upstream reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from clusters.derive.checkpoints import CHECKPOINT_LABEL

DWS = (
    "a DWS (queued_provisioning) node pool must have auto-repair and auto-upgrade off; GKE refuses "
    "the pool otherwise (GKE 'Deploy GPUs with flex-start / queued provisioning'; cluster-toolkit "
    "modules/compute/gke-node-pool enable_queued_provisioning)"
)
ROCE = (
    "a RoCE VPC network (network_profile *-vpc-roce) supports no VPC firewall rules, only regional "
    "network firewall policies of type RDMA_ROCE_POLICY; it carries only GPU-to-GPU RDMA "
    "(cloud.google.com/firewall/docs/firewall-for-roce)"
)

ROCE_SUBNET = (
    "a RoCE subnet carries only MRDMA NICs: Private Google Access is gated by the RDMA network "
    "profile (networkProfiles features.allowPrivateGoogleAccess) and cluster-toolkit's gpu-rdma-vpc "
    "sets neither it nor flow logs; GCP refuses a feature the profile does not support"
)

CHECKPOINTS = (
    "the checkpoint bucket (constructs_lib.checkpoint_bucket) writes no usage logs to a second bucket: Google "
    "recommends Cloud Audit Logs over usage logs for tracking Cloud Storage API operations "
    "(cloud.google.com/storage/docs/access-logs), and IAM already limits each tenant to its prefix; enable Data "
    "Access audit logs for storage.googleapis.com in the project to record object reads"
)


def _first(value: Any) -> dict[str, Any]:
    if isinstance(value, list):
        value = value[0] if value else {}
    return value if isinstance(value, dict) else {}


def exemptions(stack: dict[str, Any]) -> Iterator[tuple[str, str, str]]:
    """(check id, resource address, reason) for every finding the resource's own settings require."""
    resources = stack.get("resource", {})
    for name, pool in resources.get("google_container_node_pool", {}).items():
        if _first(pool.get("queued_provisioning")).get("enabled") is True:
            for check in ("CKV_GCP_9", "CKV_GCP_10"):
                yield check, f"google_container_node_pool.{name}", DWS
    for name, bucket in resources.get("google_storage_bucket", {}).items():
        labels = bucket.get("labels")  # a reference such as "${local.tags}" shows no label: no exemption
        if isinstance(labels, dict) and labels.get(CHECKPOINT_LABEL[0]) == CHECKPOINT_LABEL[1] and "logging" not in bucket:
            yield "CKV_GCP_62", f"google_storage_bucket.{name}", CHECKPOINTS
    roce = {name for name, network in resources.get("google_compute_network", {}).items() if str(network.get("network_profile", "")).endswith("-vpc-roce")}
    for name in sorted(roce):
        yield "CKV2_GCP_18", f"google_compute_network.{name}", ROCE
    for name, subnet in resources.get("google_compute_subnetwork", {}).items():
        if subnet.get("network") in {f"${{google_compute_network.{n}.id}}" for n in roce}:
            for check in ("CKV_GCP_26", "CKV_GCP_74"):
                yield check, f"google_compute_subnetwork.{name}", ROCE_SUBNET
