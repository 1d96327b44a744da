"""Topology-aware placement (Kueue TAS) for multi-node GKE runs: the cluster's Topology, the
flavors that name it, the rendered podset annotations and the ``check`` refusals.

Upstream, read at Kueue v0.19.2 (8eab6877): apis/kueue/v1beta2/topology_types.go:28,:39 (the
annotation names), :117 (CEL: hostname only as the lowest level);
pkg/controller/jobframework/tas_validation.go:50-58 (at most one topology annotation per pod
template); resourceflavor_types.go:48-51 (topologyName frozen once set). The levels are the
toolkit's (cluster-toolkit examples/gke-a3-megagpu/kueue-configuration.yaml.tftpl:16-24).
The cluster is a fixture copy (tests/jobs/k8s/fixtures/tas-a3mega.yaml), not a user file.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import celpy
import pytest

from clusters.derive.pools import derive_gpu_pools
from clusters.loader import load as load_cluster
from constructs_lib.kueue import resource_flavor, topology, topology_name
from jobs.checks import cross_check
from jobs.k8s.render import PREFERRED_TOPOLOGY_ANNOTATION, REQUIRED_TOPOLOGY_ANNOTATION, manifests
from jobs.k8s.schemas import require_valid
from jobs.schema import JobFile
from jobs.spec import derive_spec
from tests.constructs_lib.test_kueue_crds import SCHEMAS, problems

FIXTURE = Path(__file__).parent / "fixtures" / "tas-a3mega.yaml"
# cluster-toolkit examples/gke-a3-megagpu/kueue-configuration.yaml.tftpl lines 20-24, verbatim.
TOOLKIT_LEVELS = ["cloud.google.com/gce-topology-block", "cloud.google.com/gce-topology-subblock",
                  "cloud.google.com/gce-topology-host", "kubernetes.io/hostname"]


@pytest.fixture(scope="module")
def config() -> Any:
    return load_cluster(FIXTURE)


def _job(**change: Any) -> JobFile:
    data = {"name": "pretrain-tas", "cluster": "tas-a3mega", "tenant": "pretrain", "nodes": 4,
            "gpu": {"pool": "h100-mega", "count": 8}, "image": "ghcr.io/acme/train:1.0", "command": "torchrun",
            "cpu_cores": 100, "memory_mb": 800000, "disk_mb": 204800,
            "secrets": {"role": "finetune", "env": {"HF_TOKEN": "ml-api-keys/huggingface#token"}}, "max_run_hours": 4}
    data.update(change)
    return JobFile.model_validate(data)


def _annotations(job: JobFile, config: Any) -> dict[str, str]:
    docs = manifests(derive_spec(job, config, source=Path("jobs/pretrain-tas.yaml")))
    require_valid(docs)
    (rendered,) = [d for d in docs if d["kind"] == "Job"]
    return rendered["spec"]["template"]["metadata"].get("annotations", {})


def _cel(rule: str, **bindings: Any) -> bool:
    env = celpy.Environment()
    return bool(env.program(env.compile(rule)).evaluate({k: celpy.json_to_cel(v) for k, v in bindings.items()}))


def test_topology_is_the_toolkits_and_valid_against_the_v0_19_2_crd(config: Any) -> None:
    manifest = topology(config.name)
    assert [level["nodeLabel"] for level in manifest["spec"]["levels"]] == TOOLKIT_LEVELS
    assert SCHEMAS["Topology"]["storage"] and manifest["apiVersion"] == "kueue.x-k8s.io/v1beta2"
    assert problems(manifest) == []
    for rule in SCHEMAS["Topology"]["schema"]["properties"]["spec"]["properties"]["levels"]["x-kubernetes-validations"]:
        if "oldSelf" not in rule["rule"]:
            assert _cel(rule["rule"], self=manifest["spec"]["levels"]), rule["message"]


def test_hostname_above_the_lowest_level_fails_kueues_cel_rule() -> None:
    """The CEL evaluation above can fail: the same rule refuses hostname anywhere but last."""
    levels = [{"nodeLabel": "kubernetes.io/hostname"}, {"nodeLabel": "cloud.google.com/gce-topology-block"}]
    rules = SCHEMAS["Topology"]["schema"]["properties"]["spec"]["properties"]["levels"]["x-kubernetes-validations"]
    (hostname_rule,) = [r for r in rules if "hostname" in r["rule"]]
    assert not _cel(hostname_rule["rule"], self=levels)


def test_multi_node_a3_mega_flavor_names_the_topology_and_updates_in_place(config: Any) -> None:
    (pool,) = derive_gpu_pools(config)
    assert pool.topology_aware
    flavor = resource_flavor(pool, config.name)
    assert flavor["spec"]["topologyName"] == topology_name(config.name) == topology(config.name)["metadata"]["name"]
    assert problems(flavor) == []
    # An already-applied flavor without topologyName gains it: every transition rule of the CRD passes.
    old = resource_flavor(dataclasses.replace(pool, topology_aware=False))
    for rule in SCHEMAS["ResourceFlavor"]["schema"]["properties"]["spec"]["x-kubernetes-validations"]:
        assert _cel(rule["rule"], self=flavor["spec"], oldSelf=old["spec"]), rule["message"]


def test_a3_high_is_topology_aware_as_in_the_toolkit(config: Any) -> None:
    """cluster-toolkit v1.95.0 examples/gke-a3-highgpu/kueue-configuration.yaml.tftpl:15-24 defines the
    gke-default Topology with these levels and :33 names it on the a3-high flavor. An applied A3 High
    flavor without topologyName gains it in place: resourceflavor_types.go:51's rule starts
    ``!has(oldSelf.topologyName) ||``, so only a flavor that already has one is frozen."""
    a3high = config.model_copy(update={"gpu_pools": (config.gpu_pools[0].model_copy(update={"machine_type": "a3-highgpu-8g"}),)})
    (pool,) = derive_gpu_pools(a3high)
    assert pool.topology_aware
    flavor = resource_flavor(pool, config.name)
    assert flavor["spec"]["topologyName"] == topology_name(config.name) and problems(flavor) == []
    old = resource_flavor(dataclasses.replace(pool, topology_aware=False))
    for rule in SCHEMAS["ResourceFlavor"]["schema"]["properties"]["spec"]["x-kubernetes-validations"]:
        assert _cel(rule["rule"], self=flavor["spec"], oldSelf=old["spec"]), rule["message"]


def test_a_flavor_with_a_topology_refuses_later_changes_of_its_labels_and_tolerations(config: Any) -> None:
    """Why docs/large-runs.md gives a blue/green path: once topologyName is set, the CRD's rules
    (resourceflavor_types.go:49-51) refuse new nodeLabels, tolerations or another topologyName."""
    (pool,) = derive_gpu_pools(config)
    old = resource_flavor(pool, config.name)["spec"]
    rules = {r["message"]: r["rule"] for r in SCHEMAS["ResourceFlavor"]["schema"]["properties"]["spec"]["x-kubernetes-validations"]}
    changed = {**old, "tolerations": [*old.get("tolerations", []), {"key": "example.com/new", "operator": "Exists", "effect": "NoSchedule"}]}
    assert not _cel(rules["tolerations are immutable when topologyName is set"], self=changed, oldSelf=old)
    relabelled = {**old, "nodeLabels": {**old["nodeLabels"], "example.com/new": "x"}}
    assert not _cel(rules["nodeLabels are immutable when topologyName is set"], self=relabelled, oldSelf=old)


@pytest.mark.parametrize("machine", ["a2-highgpu-8g", "g2-standard-24"])
def test_families_without_gce_topology_labels_get_no_topology(config: Any, machine: str) -> None:
    (pool,) = derive_gpu_pools(config)
    other = config.model_copy(update={"gpu_pools": (config.gpu_pools[0].model_copy(update={"machine_type": machine}),)})
    (derived,) = derive_gpu_pools(other)
    assert not derived.topology_aware and "topologyName" not in resource_flavor(derived, config.name)["spec"]


def test_single_node_pool_gets_no_topology(config: Any) -> None:
    one = config.model_copy(update={"gpu_pools": (config.gpu_pools[0].model_copy(update={"node_count": 1}),)})
    assert not derive_gpu_pools(one)[0].topology_aware


def test_multi_node_run_prefers_one_subblock_by_default(config: Any) -> None:
    assert _annotations(_job(), config).items() >= {PREFERRED_TOPOLOGY_ANNOTATION: "cloud.google.com/gce-topology-subblock"}.items()
    assert REQUIRED_TOPOLOGY_ANNOTATION not in _annotations(_job(), config)


def test_required_level_replaces_the_preference_never_both(config: Any) -> None:
    annotations = _annotations(_job(topology="block"), config)
    assert annotations[REQUIRED_TOPOLOGY_ANNOTATION] == "cloud.google.com/gce-topology-block"
    assert PREFERRED_TOPOLOGY_ANNOTATION not in annotations


def test_single_node_run_carries_no_topology_annotation(config: Any) -> None:
    annotations = _annotations(_job(nodes=1), config)
    assert not {REQUIRED_TOPOLOGY_ANNOTATION, PREFERRED_TOPOLOGY_ANNOTATION} & set(annotations)


def _topology_findings(job: JobFile, config: Any, vault_view: Any) -> list[str]:
    return [message for path, message in cross_check(job, {config.name: config}, vault_view, file_stem=None) if path == ("topology",)]


def test_check_refuses_a_required_host_for_several_nodes(config: Any, vault_view: Any) -> None:
    (message,) = _topology_findings(_job(topology="host"), config, vault_view)
    assert "4 nodes cannot share one host" in message and "holds 1 node" in message


def test_check_refuses_topology_on_a_pool_without_the_labels(config: Any, vault_view: Any) -> None:
    other = config.model_copy(update={"gpu_pools": (config.gpu_pools[0].model_copy(update={"machine_type": "a2-highgpu-8g"}),)})
    (message,) = _topology_findings(_job(topology="block"), other, vault_view)
    assert "has no GCE topology labels" in message and "a3-megagpu-8g" in message


def test_check_refuses_topology_on_a_single_node_run(config: Any, vault_view: Any) -> None:
    (message,) = _topology_findings(_job(topology="block", nodes=1), config, vault_view)
    assert "nodes: 1" in message


def test_check_accepts_a_required_block(config: Any, vault_view: Any) -> None:
    assert _topology_findings(_job(topology="block"), config, vault_view) == []
