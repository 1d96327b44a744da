"""The GKE Network objects that name each GPUDirect node network for pods (scheduler stack)."""

from __future__ import annotations

from constructs import Construct

from clusters.derive.gpudirect import NodeNetworkSpec
from constructs_lib.naming import pin, tf_id
from constructs_lib.providers import kubernetes

API_VERSION = "networking.gke.io/v1"


def network_param_set(n: NodeNetworkSpec) -> dict:
    """Which VPC and subnet a pod NIC named ``n.k8s_name`` comes from (toolkit gke-network-paramset.yaml.tftpl)."""
    return {"apiVersion": API_VERSION, "kind": "GKENetworkParamSet", "metadata": {"name": n.k8s_name},
            "spec": {"vpc": n.network, "vpcSubnet": n.subnetwork, "deviceMode": n.device_mode}}


def network(n: NodeNetworkSpec) -> dict:
    """The name workloads put in their ``networking.gke.io/interfaces`` annotation (toolkit network-object.yaml.tftpl)."""
    return {"apiVersion": API_VERSION, "kind": "Network", "metadata": {"name": n.k8s_name},
            "spec": {"parametersRef": {"group": "networking.gke.io", "kind": "GKENetworkParamSet", "name": n.k8s_name}, "type": "Device"}}


class GkeNodeNetworks(Construct):
    """One GKENetworkParamSet and one Network per GPUDirect node network; these types exist once multi-networking is on."""

    def __init__(self, scope: Construct, id_: str, *, networks: tuple[NodeNetworkSpec, ...]) -> None:
        super().__init__(scope, id_)
        manifest = kubernetes.manifest.Manifest
        self.objects: dict[str, tuple[object, object]] = {}
        for n in networks:
            key = tf_id(n.k8s_name)
            params = pin(manifest(self, f"params_{key}", manifest=network_param_set(n)), f"gke_network_params_{key}")
            obj = pin(manifest(self, f"network_{key}", manifest=network(n), depends_on=[params]), f"gke_network_{key}")
            self.objects[n.k8s_name] = (params, obj)
