"""GPUDirect networking derived from the machine type (review B6): extra VPCs, NICs on the pool, GKE Network objects."""

from __future__ import annotations

import ipaddress

import pytest

import clusters
from clusters.derive.gpudirect import derive_gpudirect
from clusters.derive.pools import derive_gpu_pools
from clusters.families import GpuDirect


@pytest.fixture(scope="module")
def configs(example_configs):
    return {c.name: c for c in example_configs}


def test_a3_mega_pool_gets_eight_tcpxo_nics_on_eight_jumbo_frame_vpcs(stack_json):
    infra = stack_json("train-a3mega")["resource"]
    nets = {k: v for k, v in infra["google_compute_network"].items() if k.startswith("gpunet_")}
    assert sorted(nets) == [f"gpunet_{i}" for i in range(1, 9)]
    assert {n["mtu"] for n in nets.values()} == {8244}
    assert all(n["auto_create_subnetworks"] is False for n in nets.values())
    pool = infra["google_container_node_pool"]["pool_h100_mega"]
    nics = pool["network_config"]["additional_node_network_configs"]
    assert nics == [{"network": f"${{google_compute_network.gpunet_{i}.name}}", "subnetwork": f"${{google_compute_subnetwork.gpunet_{i}_subnet.name}}"}
                    for i in range(1, 9)]
    assert pool["node_config"]["ephemeral_storage_local_ssd_config"] == {"local_ssd_count": 16}
    assert pool["upgrade_settings"] == {"max_surge": 0, "max_unavailable": 1}
    assert infra["google_container_cluster"]["gke"]["enable_multi_networking"] is True
    assert infra["google_container_cluster"]["gke"]["datapath_provider"] == "ADVANCED_DATAPATH"


def test_gpudirect_subnets_are_disjoint_20s_of_the_files_range_and_admit_only_it(stack_json, configs):
    infra = stack_json("train-a3mega")["resource"]
    base = ipaddress.IPv4Network(configs["train-a3mega"].gcp.gpudirect_cidr)
    subnets = [ipaddress.IPv4Network(s["ip_cidr_range"]) for k, s in infra["google_compute_subnetwork"].items() if k.startswith("gpunet_")]
    assert len(subnets) == 8 and all(s.prefixlen == 20 and s.subnet_of(base) for s in subnets)
    assert len({s for s in subnets}) == 8
    fw = infra["google_compute_firewall"]["fw_gpunet_1_internal"]
    assert fw["source_ranges"] == [str(base)] and fw["network"] == "${google_compute_network.gpunet_1.id}"


def test_scheduler_stack_names_each_node_network_for_pods(stack_json):
    manifests = {k: v["manifest"] for k, v in stack_json("train-a3mega-scheduler")["resource"]["kubernetes_manifest"].items()}
    params = {m["metadata"]["name"]: m["spec"] for m in manifests.values() if m["kind"] == "GKENetworkParamSet"}
    networks = {m["metadata"]["name"]: m["spec"] for m in manifests.values() if m["kind"] == "Network"}
    assert sorted(params) == sorted(networks) == sorted(f"gvnic-{i}" for i in range(1, 9))
    assert params["gvnic-3"] == {"vpc": "train-a3mega-gpunet-3", "vpcSubnet": "train-a3mega-gpunet-3-subnet", "deviceMode": "NetDevice"}
    assert networks["gvnic-3"]["parametersRef"] == {"group": "networking.gke.io", "kind": "GKENetworkParamSet", "name": "gvnic-3"}


def test_only_namespaces_that_can_run_on_gpudirect_pools_admit_the_rxdm_sidecar(stack_json):
    """The TCPX/TCPXO sidecar needs hostPath and NET_ADMIN, which Pod Security baseline forbids."""
    def labels(stack, ns):
        return stack_json(stack)["resource"]["kubernetes_namespace_v1"][f"ns_{ns}"]["metadata"]["labels"]

    assert labels("train-a3mega-scheduler", "pretrain")["pod-security.kubernetes.io/enforce"] == "privileged"
    assert labels("train-a3mega-scheduler", "pretrain")["pod-security.kubernetes.io/warn"] == "baseline"
    assert labels("dev-gke-scheduler", "sandbox")["pod-security.kubernetes.io/enforce"] == "baseline"


def test_reserved_a3_high_pool_in_prod_gets_four_tcpx_networks(stack_json):
    pool = stack_json("prod-gke")["resource"]["google_container_node_pool"]["pool_h100"]
    assert len(pool["network_config"]["additional_node_network_configs"]) == 4
    assert "network_config" not in stack_json("prod-gke")["resource"]["google_container_node_pool"]["pool_l4_spot"]


@pytest.mark.parametrize(("machine", "transport", "gvnic", "rdma"), [
    ("a3-highgpu-8g", GpuDirect.TCPX, 4, 0), ("a3-megagpu-8g", GpuDirect.TCPXO, 8, 0),
    ("a3-ultragpu-8g", GpuDirect.RDMA, 1, 8), ("a4-highgpu-8g", GpuDirect.RDMA, 1, 8),
    ("a3-highgpu-4g", GpuDirect.NONE, 0, 0), ("g2-standard-24", GpuDirect.NONE, 0, 0),
])
def test_networks_per_machine_type(configs, machine, transport, gvnic, rdma):
    prod = configs["prod-gke"]
    pool = prod.gpu_pools[0].model_copy(update={"machine_type": machine, "reservation": None})
    config = prod.model_copy(update={"gpu_pools": (pool,)})
    assert derive_gpu_pools(config)[0].gpudirect == transport
    nets = derive_gpudirect(config).for_pool("h100")
    assert [n.device_mode for n in nets] == ["NetDevice"] * gvnic + ["RDMA"] * rdma
    if rdma:
        assert derive_gpudirect(config).rdma_zone == "us-central1-a"


def test_a_pool_can_opt_out(configs):
    prod = configs["prod-gke"]
    config = prod.model_copy(update={"gpu_pools": (prod.gpu_pools[0].model_copy(update={"gpudirect": False}), prod.gpu_pools[1])})
    assert derive_gpudirect(config).networks == ()


def test_rdma_vpc_uses_the_zones_roce_profile(configs):
    """Built in-process: an A3 Ultra pool gets one gVNIC VPC plus the RDMA VPC with 8 subnets."""
    import json

    from cdktf import Testing

    from stacks.fleet import build_fleet

    prod = configs["prod-gke"]
    pool = prod.gpu_pools[0].model_copy(update={"machine_type": "a3-ultragpu-8g"})
    config = prod.model_copy(update={"gpu_pools": (pool, prod.gpu_pools[1])})
    infra = json.loads(Testing.synth(build_fleet(Testing.app(), (config,)).stacks["prod-gke"]))["resource"]
    rdma = infra["google_compute_network"]["rdma"]
    assert rdma["network_profile"].endswith("/projects/ml-train-prod/global/networkProfiles/us-central1-a-vpc-roce")
    assert rdma["mtu"] == 8896
    nics = infra["google_container_node_pool"]["pool_h100"]["network_config"]["additional_node_network_configs"]
    assert len(nics) == 9 and nics[1]["network"] == "${google_compute_network.rdma.name}"
    assert infra["google_container_node_pool"]["pool_h100"]["node_config"]["disk_type"] == "hyperdisk-balanced"
