"""The checkpoint bucket of every cluster (issue 25): its values, and that only each tenant's identity reaches its prefix.

Values are checked against hashicorp/google v6.50.0 (the provider pyproject.toml pins through
cdktf-cdktf-provider-google 16.12.1): google/services/storage/resource_storage_bucket.go:200 (lifecycle
action types "Delete, SetStorageClass and AbortIncompleteMultipartUpload"), :257 (with_state one of LIVE,
ARCHIVED, ANY, ""), :551 (soft delete retention_duration_seconds), website/docs/r/storage_bucket.html.markdown:182
(public_access_prevention "inherited" or "enforced"). The IAM conditions are evaluated with cel-python against
the resource names Cloud Storage authorizes: ``projects/_/buckets/<b>/objects/<name>`` for an object and
``projects/_/buckets/<b>`` with the ``storage.googleapis.com/objectListPrefix`` API attribute for a listing.
"""

from __future__ import annotations

import json
from typing import Any

import celpy
import pytest

from clusters.derive.checkpoints import checkpoint_uri, derive_checkpoint_bucket, prefix_condition
from clusters.rules import check

ACTION_TYPES = {"Delete", "SetStorageClass", "AbortIncompleteMultipartUpload"}
WITH_STATES = {"LIVE", "ARCHIVED", "ANY", ""}
PUBLIC_ACCESS_PREVENTION = {"inherited", "enforced"}
REGIONS = {"prod-gke": "us-central1", "dev-gke": "us-central1", "prod-nomad": "europe-west4"}


def bucket(stack: dict) -> dict:
    return stack["resource"]["google_storage_bucket"]["checkpoint_bucket"]


def members(stack: dict) -> dict[str, dict]:
    return stack["resource"]["google_storage_bucket_iam_member"]


@pytest.mark.parametrize("name", ["prod-gke", "dev-gke", "prod-nomad"])
def test_the_bucket_is_private_versioned_and_bounded_in_time(stack_json, example_configs, name):
    config = next(c for c in example_configs if c.name == name)
    b = bucket(stack_json(name))
    assert b["name"] == f"{config.gcp.project}-{name}-ckpt" and b["location"] == REGIONS[name] == config.gcp.region
    assert b["uniform_bucket_level_access"] is True  # IAM conditions on a bucket need uniform access
    assert b["public_access_prevention"] == "enforced" and b["public_access_prevention"] in PUBLIC_ACCESS_PREVENTION
    assert b["force_destroy"] is False and b["versioning"] == {"enabled": True}
    assert b["soft_delete_policy"] == {"retention_duration_seconds": 0}  # versioning keeps overwritten checkpoints once, not twice
    rules = b["lifecycle_rule"]
    assert all(r["action"]["type"] in ACTION_TYPES and r["condition"]["with_state"] in WITH_STATES for r in rules)
    assert rules == [{"action": {"type": "Delete"}, "condition": {"age": 30, "with_state": "LIVE"}},
                     {"action": {"type": "Delete"}, "condition": {"days_since_noncurrent_time": 7, "with_state": "ARCHIVED"}}]
    assert b["lifecycle"] == {"prevent_destroy": name != "dev-gke"}
    assert stack_json(name)["output"]["checkpoint_bucket"]["value"] == "${google_storage_bucket.checkpoint_bucket.name}"


def test_retention_comes_from_the_cluster_file(example_configs):
    from cdktf import Testing

    from stacks.fleet import build_fleet

    prod = next(c for c in example_configs if c.name == "prod-nomad")
    config = prod.model_copy(update={"checkpoints": prod.checkpoints.model_copy(update={"retention_days": 90, "bucket": "acme-ckpt"})})
    stack = json.loads(Testing.synth(build_fleet(Testing.app(), (config,)).stacks["prod-nomad"]))
    assert bucket(stack)["name"] == "acme-ckpt"
    assert bucket(stack)["lifecycle_rule"][0]["condition"] == {"age": 90, "with_state": "LIVE"}


def test_each_tenant_gets_one_grant_for_its_own_identity_and_nobody_else_gets_any(stack_json):
    gke, nomad = stack_json("prod-gke"), stack_json("prod-nomad")
    assert {k: v["member"] for k, v in members(gke).items()} == {
        # research has a GCP service account: its KSA impersonates it (the scheduler stack's annotation, below)
        "checkpoint_tenant_research": "serviceAccount:${google_service_account.tenant_sa_research.email}",
        # applied has none: its KSA itself, through Workload Identity Federation for GKE
        "checkpoint_tenant_applied": "principal://iam.googleapis.com/projects/${data.google_project.checkpoint_project.number}/locations/"
                                     "global/workloadIdentityPools/ml-train-prod.svc.id.goog/subject/ns/applied/sa/training",
    }
    assert gke["data"]["google_project"]["checkpoint_project"]["project_id"] == "ml-train-prod"
    # Nomad tasks run as the client VMs' service account, the only identity there is.
    assert {v["member"] for v in members(nomad).values()} == {"serviceAccount:${google_service_account.node_sa.email}"}
    for stack in (gke, nomad):
        for grant in members(stack).values():
            assert grant["role"] == "roles/storage.objectUser" and grant["bucket"] == "${google_storage_bucket.checkpoint_bucket.name}"
            assert grant["condition"]["expression"] and grant["condition"]["title"]
        others = [t for t in stack["resource"] if t.startswith("google_storage_") and t not in ("google_storage_bucket", "google_storage_bucket_iam_member")]
        assert others == []  # no bucket-wide policy, binding or ACL beside the conditioned members
        assert "allUsers" not in json.dumps(stack) and "allAuthenticatedUsers" not in json.dumps(stack)


def test_the_ksa_and_service_account_granted_are_the_ones_the_pods_run_as(stack_json):
    """The KSA principal names the namespace and KSA the scheduler stack creates; research's KSA carries the
    workload identity annotation (its pods act as the service account granted), applied's does not."""
    sched = stack_json("prod-gke-scheduler")["resource"]["kubernetes_service_account_v1"]
    annotations = {sa["metadata"]["namespace"].removeprefix("${kubernetes_namespace_v1.ns_").removesuffix(".metadata[0].name}"):
                   sa["metadata"].get("annotations", {}) for sa in sched.values() if sa["metadata"]["name"] == "training"}
    assert set(annotations) == {"research", "applied"}
    assert annotations["research"]["iam.gke.io/gcp-service-account"].startswith("${")
    assert "iam.gke.io/gcp-service-account" not in annotations["applied"]


def _allowed(expression: str, resource: str, list_prefix: str | None = None) -> bool:
    env = celpy.Environment()
    program = env.program(env.compile(expression), functions={"getAttribute": lambda api, key, default: api.get(key, default)})
    api: dict[str, Any] = {} if list_prefix is None else {"storage.googleapis.com/objectListPrefix": list_prefix}
    return bool(program.evaluate({"resource": celpy.json_to_cel({"name": resource}), "api": celpy.json_to_cel(api)}))


@pytest.mark.parametrize(("resource", "list_prefix", "allowed"), [
    ("projects/_/buckets/b-ckpt/objects/app/3f9c/step-100.pt", None, True),
    ("projects/_/buckets/b-ckpt/objects/app/", None, True),
    ("projects/_/buckets/b-ckpt/objects/applied/3f9c/step-100.pt", None, False),  # a tenant whose name starts with this one's
    ("projects/_/buckets/b-ckpt/objects/ap", None, False),
    ("projects/_/buckets/b-ckpt/objects/other/app/x", None, False),
    ("projects/_/buckets/b-ckpt-2/objects/app/x", None, False),  # another bucket whose name starts with this one's
    ("projects/_/buckets/b-ckpt", "app/", True),  # objects.list is authorized on the bucket: only with the tenant's prefix
    ("projects/_/buckets/b-ckpt", "app/3f9c/", True),
    ("projects/_/buckets/b-ckpt", "", False),
    ("projects/_/buckets/b-ckpt", "applied/", False),
    ("projects/_/buckets/b-ckpt", "app", False),
    ("projects/_/buckets/b-ckpt", None, False),  # bucket-level calls without a listing prefix (metadata, IAM)
])
def test_the_condition_admits_the_tenants_prefix_only(resource, list_prefix, allowed):
    assert _allowed(prefix_condition("b-ckpt", "app"), resource, list_prefix) is allowed


def test_the_synthesized_conditions_are_the_derived_ones(stack_json, example_configs):
    config = next(c for c in example_configs if c.name == "prod-gke")
    spec = derive_checkpoint_bucket(config)
    grants = members(stack_json("prod-gke"))
    for tenant in ("research", "applied"):
        expression = grants[f"checkpoint_tenant_{tenant}"]["condition"]["expression"]
        assert expression == spec.condition(tenant)
        other = "applied" if tenant == "research" else "research"
        assert _allowed(expression, f"projects/_/buckets/{spec.name}/objects/{tenant}/e1/ckpt.pt")
        assert not _allowed(expression, f"projects/_/buckets/{spec.name}/objects/{other}/e1/ckpt.pt")


def test_the_run_directory_is_under_the_tenants_prefix():
    assert checkpoint_uri("b-ckpt", "app", "3f9c2a1b") == "gs://b-ckpt/app/3f9c2a1b/"
    assert _allowed(prefix_condition("b-ckpt", "app"), "projects/_/buckets/b-ckpt/objects/" + checkpoint_uri("b-ckpt", "app", "e").removeprefix("gs://b-ckpt/") + "x")


def test_fails_when_the_derived_bucket_name_is_too_long(example_configs):
    prod = next(c for c in example_configs if c.name == "prod-gke")
    gcp = prod.gcp.model_copy(update={"project": "a-very-long-project-id-123456"})
    long = prod.model_copy(update={"gcp": gcp, "name": "a-cluster-name-that-is-long-enough"})
    findings = [message for path, message in check(long) if path == ("name",)]
    assert findings and "checkpoint bucket name" in findings[0] and "checkpoints: {bucket:" in findings[0]
    fixed = long.model_copy(update={"checkpoints": long.checkpoints.model_copy(update={"bucket": "acme-ckpt"})})
    assert not [m for _, m in check(fixed) if "checkpoint bucket" in m]
