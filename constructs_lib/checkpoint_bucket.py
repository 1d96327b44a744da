"""The cluster's checkpoint bucket and the per-tenant, prefix-conditioned grants on it.

Values are hashicorp/google v6.50.0's (google/services/storage/resource_storage_bucket.go;
clusters.derive.checkpoints cites the lines). The bucket is private by construction: uniform
bucket-level access (no object ACLs, so IAM conditions apply, which Cloud Storage allows only with
uniform access), public access prevention enforced, versioned so a run that overwrites a good
checkpoint with a bad one can be rolled back for ``NONCURRENT_DAYS``. Two lifecycle rules bound the
cost: live objects older than ``retention_days`` and noncurrent versions older than
``NONCURRENT_DAYS`` are deleted. ``force_destroy`` stays false and, outside dev, so does any
destroy (``prevent_destroy``): the checkpoints are the only copy of days of GPU time.
"""

from __future__ import annotations

from constructs import Construct

from clusters.derive.checkpoints import (
    ARCHIVED,
    CHECKPOINT_LABEL,
    CHECKPOINT_ROLE,
    DELETE,
    LIVE,
    NONCURRENT_DAYS,
    PUBLIC_ACCESS_PREVENTION,
    SOFT_DELETE_SECONDS,
    CheckpointBucketSpec,
    Principal,
    ksa_principal,
)
from constructs_lib.naming import pin
from constructs_lib.providers import google


class CheckpointBucket(Construct):
    """``self.bucket`` is the bucket resource (escape hatch); ``self.grants[tenant]`` its binding."""

    def __init__(self, scope: Construct, id_: str, *, spec: CheckpointBucketSpec, cluster: str, node_service_account: str,
                 tenant_service_accounts: dict[str, str]) -> None:
        super().__init__(scope, id_)
        bucket = google.storage_bucket
        self.bucket = pin(bucket.StorageBucket(
            self, "bucket", name=spec.name, project=spec.project, location=spec.location,
            uniform_bucket_level_access=True, public_access_prevention=PUBLIC_ACCESS_PREVENTION, force_destroy=False,
            versioning={"enabled": True},
            soft_delete_policy={"retention_duration_seconds": SOFT_DELETE_SECONDS},
            # Typed structs: a plain dict inside a list reaches jsii unconverted and loses its snake_case keys.
            lifecycle_rule=[
                bucket.StorageBucketLifecycleRule(action=bucket.StorageBucketLifecycleRuleAction(type=DELETE),
                                                  condition=bucket.StorageBucketLifecycleRuleCondition(age=spec.retention_days, with_state=LIVE)),
                bucket.StorageBucketLifecycleRule(action=bucket.StorageBucketLifecycleRuleAction(type=DELETE),
                                                  condition=bucket.StorageBucketLifecycleRuleCondition(
                                                      days_since_noncurrent_time=NONCURRENT_DAYS, with_state=ARCHIVED)),
            ],
            labels={"gpufleet-cluster": cluster, CHECKPOINT_LABEL[0]: CHECKPOINT_LABEL[1]},
            lifecycle={"prevent_destroy": spec.protected},
        ), "checkpoint_bucket")
        project_number = None
        if any(g.principal == Principal.KSA for g in spec.grants):
            # The KSA principal names the project by number, which no cluster file states.
            project_number = pin(google.data_google_project.DataGoogleProject(self, "project", project_id=spec.project),
                                 "checkpoint_project").number
        self.grants = {}
        for grant in spec.grants:
            if grant.principal == Principal.NODE_SA:
                member = f"serviceAccount:{node_service_account}"
            elif grant.principal == Principal.TENANT_SA:
                member = f"serviceAccount:{tenant_service_accounts[grant.tenant]}"
            else:
                member = ksa_principal(str(project_number), spec.project, grant.namespace)
            key = grant.tenant.replace("-", "_")
            self.grants[grant.tenant] = pin(google.storage_bucket_iam_member.StorageBucketIamMember(
                self, f"tenant_{key}", bucket=self.bucket.name, role=CHECKPOINT_ROLE, member=member,
                condition={"title": f"checkpoints of tenant {grant.tenant}",
                           "description": f"objects and listings under {grant.tenant}/ only",
                           "expression": spec.condition(grant.tenant)},
            ), f"checkpoint_tenant_{key}")
