"""Multi-node runs on GPUDirect pools (review B6): the pod attaches the pool's extra NICs by the
names of the scheduler stack's Network objects, runs Google's RxDM sidecar paired with the
installed NCCL plugin, and NCCL is told which NICs to use. Single-node runs and other pools get none of it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from clusters.derive.gpudirect import derive_gpudirect, derive_gpudirect_daemonsets
from clusters.derive.pools import derive_gpu_pools
from clusters.families import GpuDirect
from clusters.gpudirect_upstream import first
from constructs_lib.gpudirect_runtime import daemonset
from clusters.errors import ConfigError
from jobs.k8s.gpudirect import INTERFACES_ANNOTATION, interfaces, pod_networking
from jobs.k8s.render import manifests
from jobs.k8s.schemas import errors
from jobs.loader import find, load

GKE_EXAMPLE = "finetune-llama-gke"


def _write(tmp_path: Path, name: str, change) -> Path:
    yaml = YAML(typ="rt")
    data = yaml.load(find(GKE_EXAMPLE).read_text())
    data["name"] = name
    change(data)
    path = tmp_path / f"{name}.yaml"
    with path.open("w") as handle:
        yaml.dump(data, handle)
    return path


def _on_a3mega(data: Any) -> None:
    """The example 2 x 8 GPU run, moved to train-a3mega's A3 Mega pool (TCPXO) and tenant pretrain."""
    data["cluster"], data["tenant"] = "train-a3mega", "pretrain"
    data["gpu"]["pool"] = "h100-mega"
    del data["gpu"]["min_memory_gib"]  # the pool selects the GPU; machines.py has no NVML figure for H100 Mega


@pytest.fixture(scope="module")
def mega_docs(tmp_path_factory, cluster_configs, vault_view) -> list[dict[str, Any]]:
    path = _write(tmp_path_factory.mktemp("jobs"), "pretrain-2n", _on_a3mega)
    return manifests(load(path, cluster_configs=cluster_configs, vault=vault_view), dispatch_id="d-1", meta={"run_id": "r", "dataset_uri": "gs://a/b/"})


def _pod_template(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == "Job")["spec"]["template"]


def _network_objects(stack_json, stack: str) -> list[str]:
    manifests_ = stack_json(stack)["resource"]["kubernetes_manifest"].values()
    return sorted(m["manifest"]["metadata"]["name"] for m in manifests_ if m["manifest"]["kind"] == "Network")


def test_two_node_a3_mega_run_validates_against_kubernetes_1_35(mega_docs):
    assert [d["kind"] for d in mega_docs] == ["Service", "Job"]
    assert [e for d in mega_docs for e in errors(d)] == []


def test_pod_interfaces_name_the_network_objects_the_scheduler_stack_creates(mega_docs, stack_json):
    nics = json.loads(_pod_template(mega_docs)["metadata"]["annotations"][INTERFACES_ANNOTATION])
    assert nics[0] == {"interfaceName": "eth0", "network": "default"}
    assert [n["interfaceName"] for n in nics[1:]] == [f"eth{i}" for i in range(1, 9)]
    assert sorted(n["network"] for n in nics[1:]) == _network_objects(stack_json, "train-a3mega-scheduler")


def test_prod_tcpx_example_attaches_its_four_networks(cluster_configs, vault_view, stack_json):
    spec = load(find(GKE_EXAMPLE), cluster_configs=cluster_configs, vault=vault_view)
    nics = json.loads(_pod_template(manifests(spec))["metadata"]["annotations"][INTERFACES_ANNOTATION])
    assert sorted(n["network"] for n in nics[1:]) == _network_objects(stack_json, "prod-gke-scheduler")


def test_tcpxo_sidecar_is_the_release_paired_with_the_installed_plugin(mega_docs, cluster_configs):
    pod = _pod_template(mega_docs)["spec"]
    (sidecar,) = pod["initContainers"]
    assert sidecar["name"] == "tcpxo-daemon" and sidecar["restartPolicy"] == "Always"
    # Same vendored commit: upstream's own NCCL test pairs this daemon with this installer.
    upstream_test = first("nccl-test-tcpxo", "Pod")["spec"]["containers"]
    assert sidecar["image"] == next(c["image"] for c in upstream_test if c["name"] == "tcpxo-daemon")
    plugin = next(c["image"] for c in upstream_test if c["name"] == "nccl-test")
    config = next(c for c in cluster_configs if c.name == "train-a3mega")
    installer = next(daemonset(d) for d in derive_gpudirect_daemonsets(derive_gpu_pools(config)) if d.name == "nccl-tcpxo-installer")
    assert plugin in [c["image"] for c in installer["spec"]["template"]["spec"]["initContainers"]]
    assert re.search(r":v\d+\.\d+\.\d+$", sidecar["image"])
    assert set(sidecar["securityContext"]["capabilities"]["add"]) == {"NET_ADMIN", "NET_BIND_SERVICE"}
    annotations = _pod_template(mega_docs)["metadata"]["annotations"]
    assert "/dev/dmabuf_import_helper" in annotations["devices.gke.io/container.tcpxo-daemon"]


def test_training_container_gets_nccl_nics_and_fastrak_devices_but_stays_unprivileged(mega_docs):
    pod = _pod_template(mega_docs)["spec"]
    train = pod["containers"][0]
    env = {e["name"]: e.get("value") for e in train["env"]}
    assert env["NCCL_FASTRAK_IFNAME"] == ",".join(f"eth{i}" for i in range(1, 9))
    assert env["NCCL_FASTRAK_CTRL_DEV"] == env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert env["NCCL_FASTRAK_LLCM_DEVICE_DIRECTORY"] == "/dev/aperture_devices"
    assert env["LD_LIBRARY_PATH"] == env["NCCL_LIB_DIR"] == "/usr/local/nvidia/lib64"
    assert {m["mountPath"] for m in train["volumeMounts"]} >= {"/dev/aperture_devices", "/usr/local/nvidia/lib64"}
    assert len({e["name"] for e in train["env"]}) == len(train["env"])
    assert len({v["name"] for v in pod["volumes"]}) == len(pod["volumes"])
    assert train["securityContext"]["capabilities"] == {"drop": ["ALL"]} and train["securityContext"]["runAsNonRoot"] is True


def test_the_namespace_that_runs_it_admits_the_sidecar(mega_docs, stack_json):
    namespace = next(d for d in mega_docs if d["kind"] == "Job")["metadata"]["namespace"]
    labels = stack_json("train-a3mega-scheduler")["resource"]["kubernetes_namespace_v1"][f"ns_{namespace}"]["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"


def test_single_node_runs_and_other_pools_get_no_gpudirect(tmp_path, cluster_configs, vault_view):
    def one_node(data):
        _on_a3mega(data)
        del data["nodes"]

    def l4(data):
        data["gpu"].update({"pool": "l4-spot", "count": 2, "min_memory_gib": 16, "model": "L4"})
        data["cpu_cores"], data["memory_mb"], data["disk_mb"] = 8, 32768, 20480

    for name, change in (("one-node", one_node), ("on-l4", l4)):
        template = _pod_template(manifests(load(_write(tmp_path, name, change), cluster_configs=cluster_configs, vault=vault_view)))
        assert "annotations" not in template["metadata"] and "initContainers" not in template["spec"], name


def test_rdma_pods_attach_only_the_rdma_networks_without_a_sidecar(cluster_configs):
    prod = next(c for c in cluster_configs if c.name == "prod-gke")
    config = prod.model_copy(update={"gpu_pools": (prod.gpu_pools[0].model_copy(update={"machine_type": "a3-ultragpu-8g"}),)})
    networks = tuple((n.k8s_name, n.device_mode) for n in derive_gpudirect(config).for_pool("h100"))
    wiring = pod_networking(GpuDirect.RDMA, networks)
    nics = json.loads(wiring.annotations[INTERFACES_ANNOTATION])
    assert nics[1:] == [{"interfaceName": f"eth{j + 2}", "network": f"rdma-{j}"} for j in range(8)]
    assert wiring.sidecars == [] and {m["mountPath"] for m in wiring.mounts} == {"/usr/local/nvidia", "/usr/local/gib"}


def test_interface_numbering_follows_the_node_nic_order():
    assert interfaces(GpuDirect.TCPX, (("a", "NetDevice"), ("b", "NetDevice")))[1:] == [
        {"interfaceName": "eth1", "network": "a"}, {"interfaceName": "eth2", "network": "b"}]


@pytest.mark.parametrize(("change", "field", "fix"), [
    (lambda d: d["env"].update({"NCCL_FASTRAK_IFNAME": "eth1"}), "env.NCCL_FASTRAK_IFNAME", "remove it"),
    (lambda d: d["gpu"].update({"count": 4}), "gpu.count", "set gpu.count: 8"),
])
def test_job_files_cannot_fight_the_gpudirect_wiring(tmp_path, cluster_configs, vault_view, change, field, fix):
    def mutate(data):
        _on_a3mega(data)
        change(data)

    with pytest.raises(ConfigError) as err:
        load(_write(tmp_path, "bad", mutate), cluster_configs=cluster_configs, vault=vault_view)
    lines = [str(p) for p in err.value.problems]
    assert any(f": {field}:" in line and fix in line for line in lines), lines


def test_the_sidecars_default_request_counts_in_the_node_fit(tmp_path, cluster_configs, vault_view):
    """The RxDM sidecar states no requests, so the tenant LimitRange's default applies to it on the node."""
    from clusters.derive.tenants import DEFAULT_CONTAINER_CPU_MILLICORES, DEFAULT_CONTAINER_MEMORY_MIB
    from clusters.machines import gke_allocatable
    from constructs_lib.k8s_tenancy import DEFAULT_REQUESTS

    assert DEFAULT_REQUESTS == {"cpu": f"{DEFAULT_CONTAINER_CPU_MILLICORES // 1000}", "memory": f"{DEFAULT_CONTAINER_MEMORY_MIB // 1024}Gi"}
    millicores, _ = gke_allocatable("a3-megagpu-8g")

    def whole_node_cpu(data):
        _on_a3mega(data)
        data["cpu_cores"] = millicores // 1000  # fits the node alone, not beside the sidecar

    with pytest.raises(ConfigError) as err:
        load(_write(tmp_path, "greedy", whole_node_cpu), cluster_configs=cluster_configs, vault=vault_view)
    lines = [str(p) for p in err.value.problems]
    assert any(": cpu_cores:" in line and f"at most {(millicores - DEFAULT_CONTAINER_CPU_MILLICORES) // 1000}" in line for line in lines), lines


def test_rendered_gpudirect_pods_pass_the_tenant_privilege_policy(mega_docs, cluster_configs, vault_view):
    """The scheduler stack's third admission policy (constructs_lib/k8s_queue_policy.PRIVILEGE_RULE)
    admits exactly what the renderer produces on TCPXO and TCPX pools, once the Job controller has
    set its ownerReference on the pod."""
    from tests.constructs_lib.test_queue_policy import JOB_OWNER, evaluate

    from constructs_lib.k8s_queue_policy import privilege_rule

    tcpx = manifests(load(find(GKE_EXAMPLE), cluster_configs=cluster_configs, vault=vault_view))
    for docs in (mega_docs, tcpx):
        template = _pod_template(docs)
        assert template["spec"]["initContainers"][0]["name"] in ("tcpx-daemon", "tcpxo-daemon")
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {**template["metadata"], "ownerReferences": [JOB_OWNER]}, "spec": template["spec"]}
        assert evaluate(privilege_rule(), pod) is True
        assert evaluate(privilege_rule(), {**pod, "metadata": {**pod["metadata"], "ownerReferences": []}}) is False


def test_tcpx_runs_get_upstream_nccl_tuning_bound_to_their_own_nics(cluster_configs, vault_view):
    """GKE review follow-up: TCPX pods got only NIC names. Upstream's TCPX test passes chunk and buffer
    sizes, PXN/cross-NIC off and per-NIC TX/RX CPU bindings; TCPX ships no env profile to source."""
    from jobs.nccl import tcpx_tuning

    template = _pod_template(manifests(load(find(GKE_EXAMPLE), cluster_configs=cluster_configs, vault=vault_view)))
    train = template["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in train["env"]}
    tuning = {e["name"]: e["value"] for e in tcpx_tuning()}
    assert {"NCCL_P2P_PXN_LEVEL", "NCCL_CROSS_NIC", "NCCL_BUFFSIZE", "NCCL_GPUDIRECTTCPX_TX_BINDINGS",
            "NCCL_GPUDIRECTTCPX_PROGRAM_FLOW_STEERING_WAIT_MICROS"} <= set(tuning)
    for name, value in tuning.items():
        if name not in ("NCCL_GPUDIRECTTCPX_SOCKET_IFNAME",):
            assert env[name] == value, name
    nics = [n["interfaceName"] for n in json.loads(template["metadata"]["annotations"][INTERFACES_ANNOTATION])[1:]]
    bound = {part.split(":")[0] for part in env["NCCL_GPUDIRECTTCPX_TX_BINDINGS"].split(";")}
    assert bound == set(nics) == set(env["NCCL_GPUDIRECTTCPX_SOCKET_IFNAME"].split(","))
    assert len({e["name"] for e in train["env"]}) == len(train["env"])


def test_the_names_job_files_may_not_set_are_the_names_the_pods_get():
    """jobs.checks reads the reserved NCCL names from the neutral jobs.nccl; the pods get theirs
    from this side's pod_networking. They must be the same set, or a job file could override
    the wiring (or be refused a name nothing sets)."""
    from jobs.nccl import UPSTREAM, reserved_env

    for transport, (_test, _daemon, mode) in UPSTREAM.items():
        wiring = pod_networking(transport, (("x", mode),))
        assert wiring is not None
        assert reserved_env(transport) == tuple(sorted({e["name"] for e in wiring.env})), transport
    assert reserved_env(GpuDirect.NONE) == ()
