"""How a pool upgrades: surge or short-lived blue/green, from reservation and queued provisioning.

Pure derivations from a validated ClusterConfig; tests call them directly, constructs only read the
specs. Nothing here knows cdktf.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class UpgradeSpec:
    """How GKE replaces a pool's nodes. A reserved pool has no VM beyond its reservation for a surge
    node, so it upgrades one node down at a time (toolkit default: max_surge 0, max_unavailable 1);
    DWS nodes come only through ProvisioningRequests, so GKE must not upgrade or repair them."""

    max_surge: int
    max_unavailable: int
    auto_upgrade: bool
    auto_repair: bool


def derive_upgrade(reserved: bool, queued_provisioning: bool) -> UpgradeSpec:
    if queued_provisioning:
        # toolkit examples/gke-consumption-options/dws-flex-start-queued-provisioning/gke-a3-ultragpu.yaml:164-167
        return UpgradeSpec(max_surge=1, max_unavailable=0, auto_upgrade=False, auto_repair=False)
    if reserved:
        return UpgradeSpec(max_surge=0, max_unavailable=1, auto_upgrade=True, auto_repair=True)
    return UpgradeSpec(max_surge=1, max_unavailable=0, auto_upgrade=True, auto_repair=True)
