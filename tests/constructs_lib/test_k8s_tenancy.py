"""GKE scheduler stack: one namespace per tenant, namespace-only RBAC, GPU quota, limits, priorities."""

from __future__ import annotations

import json

import pytest

from constructs_lib.k8s_controller_role import CONTROLLER_RULES
from constructs_lib.k8s_tenancy import rbac_subject


@pytest.fixture(scope="module")
def sched(stack_json):
    return stack_json("prod-gke-scheduler")["resource"]


def test_one_labelled_namespace_per_tenant(sched):
    namespaces = {k: v["metadata"] for k, v in sched["kubernetes_namespace_v1"].items()}
    assert sorted(namespaces) == ["ns_applied", "ns_research"]
    assert namespaces["ns_research"]["name"] == "research"
    assert namespaces["ns_research"]["labels"]["gpufleet.dev/tenant"] == "research"
    # research and applied run on the a3-highgpu-8g pool, whose GPUDirect-TCPX sidecar baseline forbids (test_gpudirect.py)
    assert namespaces["ns_research"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    assert namespaces["ns_research"]["labels"]["pod-security.kubernetes.io/audit"] == "baseline"


def test_tenant_groups_get_edit_in_their_namespace_only(sched):
    bindings = sched["kubernetes_role_binding_v1"]
    edit = bindings["rb_research_edit"]
    assert edit["metadata"]["namespace"] == "${kubernetes_namespace_v1.ns_research.metadata[0].name}"
    assert edit["role_ref"] == {"api_group": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"}
    assert edit["subject"] == [{"api_group": "rbac.authorization.k8s.io", "kind": "Group", "name": "ml-research@example.com"}]
    assert bindings["rb_applied_edit"]["subject"][0]["name"] == "ml-applied@example.com"
    # The one cluster-wide binding is the GPU health checker's own kube-system account (nodes get/patch).
    assert "kubernetes_cluster_role_binding_v1" not in sched, "no tenant gets a cluster-wide binding"
    cluster_wide = {k: m["manifest"] for k, m in sched["kubernetes_manifest"].items() if m["manifest"]["kind"] == "ClusterRoleBinding"}
    assert list(cluster_wide) == ["crb_gpu_health"], "no tenant gets a cluster-wide binding"
    assert cluster_wide["crb_gpu_health"]["subjects"] == [{"kind": "ServiceAccount", "name": "gpufleet-gpu-health", "namespace": "kube-system"}]


def test_controller_gets_the_least_role_through_a_namespaced_binding(sched):
    (role,) = [r for r in sched["kubernetes_cluster_role_v1"].values() if r["metadata"]["name"] == "gpufleet-tenant-controller"]
    verbs = {(r["api_groups"][0], res, v) for r in role["rule"] for res in r["resources"] for v in r["verbs"]}
    assert ("batch", "jobs", "create") in verbs and ("kueue.x-k8s.io", "workloads", "watch") in verbs
    assert not any(res in ("secrets", "roles", "rolebindings", "clusterroles", "nodes") for _, res, _ in verbs)
    assert not any(v in ("*", "escalate", "bind", "impersonate") for _, _, v in verbs)
    assert len(role["rule"]) == len(CONTROLLER_RULES)
    binding = sched["kubernetes_role_binding_v1"]["rb_research_controller"]
    assert binding["role_ref"]["name"] == role["metadata"]["name"] == "gpufleet-tenant-controller"
    assert binding["subject"] == [{"kind": "ServiceAccount", "name": "gpufleet-controller", "namespace": "research"}]
    assert sched["kubernetes_service_account_v1"]["ksa_research_controller"]["metadata"]["name"] == "gpufleet-controller"


def test_gpu_quota_is_the_sum_of_the_tenants_pool_quotas(sched):
    quotas = {k: v["spec"]["hard"] for k, v in sched["kubernetes_resource_quota_v1"].items()}
    assert quotas == {"quota_research": {"requests.nvidia.com/gpu": "32"}, "quota_applied": {"requests.nvidia.com/gpu": "16"}}


@pytest.mark.parametrize(("stack", "name"), [("prod-gke-scheduler", "limits_research"), ("dev-gke-scheduler", "limits_sandbox")])
def test_limit_range_sets_default_requests_and_says_nothing_about_gpus(stack_json, stack, name):
    """A GPU ``max`` without a default becomes every container's GPU limit (SetDefaults_LimitRangeItem) and
    LimitRanger rejects containers without one: CPU pods, init containers and sidecars (review B3)."""
    (limit,) = stack_json(stack)["resource"]["kubernetes_limit_range_v1"][name]["spec"]["limit"]
    assert limit["type"] == "Container"
    assert limit["default_request"] == {"cpu": "1", "memory": "4Gi"}
    assert "nvidia.com/gpu" not in json.dumps(limit)
    assert set(limit) == {"type", "default_request"}


# The values the API server accepts for preemptionPolicy: k8s.io/api core/v1/types.go ``PreemptionPolicy``
# (PreemptLowerPriority, PreemptNever = "Never"), enforced by ValidatePreemptionPolicy in kubernetes/kubernetes
# pkg/apis/core/validation/validation.go, which ValidatePriorityClass calls (pkg/apis/scheduling/validation/validation.go:48-49).
UPSTREAM_PREEMPTION_POLICIES = {"PreemptLowerPriority", "Never"}


def test_training_priority_classes(sched):
    classes = {v["metadata"]["name"]: v for v in sched["kubernetes_priority_class_v1"].values()}
    assert sorted(classes) == ["training-high", "training-low"]
    assert classes["training-high"]["value"] > classes["training-low"]["value"]
    assert not any(c["global_default"] for c in classes.values())


def test_no_tenant_priority_class_lets_kube_scheduler_evict_another_pod(sched):
    """Issue 25: ``training-high`` with PreemptLowerPriority let kube-scheduler evict another tenant's admitted
    run (and its FailJob rule then killed it). Preemption happens only through Kueue, within a cohort."""
    policies = {v["metadata"]["name"]: v["preemption_policy"] for v in sched["kubernetes_priority_class_v1"].values()}
    assert set(policies.values()) <= UPSTREAM_PREEMPTION_POLICIES
    assert policies == {"training-high": "Never", "training-low": "Never"}


def test_tenant_training_account_is_bound_to_its_gcp_account_by_cross_stack_reference(sched, stack_json):
    research = sched["kubernetes_service_account_v1"]["ksa_research_training"]["metadata"]
    ref = research["annotations"]["iam.gke.io/gcp-service-account"]
    assert ref.startswith("${data.terraform_remote_state.cross-stack-reference-input-prod-gke.outputs.")
    output = ref.removeprefix("${data.terraform_remote_state.cross-stack-reference-input-prod-gke.outputs.").rstrip("}")
    assert stack_json("prod-gke")["output"][output]["value"] == "${google_service_account.tenant_sa_research.email}"
    assert sched["kubernetes_service_account_v1"]["ksa_applied_training"]["metadata"]["annotations"] == {}


def test_workload_identity_binding_lets_only_the_tenants_training_account_in(stack_json):
    infra = stack_json("prod-gke")["resource"]
    binding = infra["google_service_account_iam_member"]["tenant_wi_research"]
    assert binding["role"] == "roles/iam.workloadIdentityUser"
    assert binding["member"] == "serviceAccount:ml-train-prod.svc.id.goog[research/training]"
    assert binding["service_account_id"] == "${google_service_account.tenant_sa_research.name}"
    assert infra["google_service_account"]["tenant_sa_research"]["account_id"] == "prod-gke-research"
    role = infra["google_project_iam_member"]["tenant_role_research_storage_objectViewer"]
    assert (role["role"], role["member"]) == ("roles/storage.objectViewer", "serviceAccount:${google_service_account.tenant_sa_research.email}")
    assert "tenant_sa_applied" not in infra["google_service_account"]


@pytest.mark.parametrize(("member", "expected"), [
    ("group:ml@example.com", ("Group", "ml@example.com")),
    ("user:alice@example.com", ("User", "alice@example.com")),
    ("serviceAccount:ci@p.iam.gserviceaccount.com", ("User", "ci@p.iam.gserviceaccount.com")),
])
def test_iam_members_map_to_rbac_subjects(member, expected):
    assert rbac_subject(member) == expected


@pytest.mark.parametrize(("stack", "tenant"), [("prod-gke-scheduler", "research"), ("dev-gke-scheduler", "sandbox")])
def test_each_tenant_namespace_denies_ingress_from_other_namespaces(stack_json, stack, tenant):
    """Review C6: Dataplane V2 enforces NetworkPolicy; pods of one tenant still reach each other (multi-node NCCL)."""
    policy = stack_json(stack)["resource"]["kubernetes_network_policy_v1"][f"netpol_{tenant}"]
    assert policy["metadata"]["namespace"] == f"${{kubernetes_namespace_v1.ns_{tenant}.metadata[0].name}}"
    assert policy["spec"] == {"pod_selector": {}, "policy_types": ["Ingress"], "ingress": [{"from": [{"pod_selector": {}}]}]}


def test_the_preemption_policy_change_replaces_the_class_and_preview_does_not_block_it(stack_json):
    """``preemptionPolicy`` is immutable (kubernetes/kubernetes pkg/apis/scheduling/validation/validation.go:63-64,
    ValidatePriorityClassUpdate) and ForceNew in the provider (preview/forcenew/kubernetes.json): a cluster applied
    with the old ``training-high`` gets a replaced PriorityClass. It is no protected resource, so ``gpufleet preview``
    names the replacement without blocking the upgrade (docs/survive.md says what the short gap means)."""
    import copy

    from preview.diff import ExitCode, Kind, preview
    from preview.forcenew import load_tables

    head = stack_json("prod-gke-scheduler")
    base = copy.deepcopy(head)
    base["resource"]["kubernetes_priority_class_v1"]["priority_training_high"]["preemption_policy"] = "PreemptLowerPriority"
    result = preview({"prod-gke-scheduler": base}, {"prod-gke-scheduler": head}, load_tables())
    (finding,) = result.findings
    assert (finding.kind, finding.address) == (Kind.REPLACED, "kubernetes_priority_class_v1.priority_training_high")
    assert [(c.path, c.old, c.new, c.forces_replacement) for c in finding.changes] == [("preemption_policy", "PreemptLowerPriority", "Never", True)]
    assert not finding.blocking and result.exit_code != ExitCode.BLOCKED
