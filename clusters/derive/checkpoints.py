"""The checkpoint bucket of a cluster: its name, lifecycle, and who may use which prefix.

One bucket per cluster, one prefix per tenant (``<tenant>/``), and per run one directory under it
(``<tenant>/<experiment id>/``): the id is the experiment's, not an attempt's, so every attempt of a
run finds what the previous one wrote (``checkpoint_uri``). Pure derivations; the construct
(``constructs_lib.checkpoint_bucket``) only declares what these say. Nothing here knows cdktf.

Who reads and writes a tenant's prefix is the identity its training pods run as:

- GKE, a tenant with ``service_account``: its GCP service account (``TenantIdentity``), which the
  tenant's ``training`` KSA impersonates (the KSA carries the ``iam.gke.io/gcp-service-account``
  annotation, ``constructs_lib.k8s_tenancy``);
- GKE, a tenant without one: the KSA itself, through Workload Identity Federation for GKE
  (``principal://iam.googleapis.com/projects/<number>/locations/global/workloadIdentityPools/
  <project>.svc.id.goog/subject/ns/<namespace>/sa/<ksa>``, the principal identifier Google documents
  for a Kubernetes service account);
- Nomad: the client VMs' service account. Every task on a Nomad client runs as that one identity,
  so on Nomad the prefixes separate tenants' files by convention only (docs/checkpoints.md says so).

Each grant carries an IAM condition limiting it to the tenant's prefix: objects whose name starts
with ``<tenant>/`` (``resource.name`` of a Cloud Storage object is
``projects/_/buckets/<bucket>/objects/<name>``) and object listings whose prefix does (the
``storage.googleapis.com/objectListPrefix`` API attribute; ``objects.list`` is checked against the
bucket, so without it a tenant could not list even its own directory).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from clusters.derive.tenants import WORKLOAD_KSA, derive_tenants
from clusters.schema import ClusterConfig, Environment, SchedulerKind

# Read, create, overwrite and delete objects, list them, multipart uploads; no bucket settings,
# no IAM (Cloud Storage predefined roles: roles/storage.objectUser). gcs-fuse-csi-driver's
# docs/authentication.md grants the same role for a read-write mount.
CHECKPOINT_ROLE = "roles/storage.objectUser"
# A checkpoint overwritten or deleted by a diverging run stays recoverable this long as a
# noncurrent version (the bucket is versioned), then the lifecycle rule removes it.
NONCURRENT_DAYS = 7
# Versioning already keeps overwritten and deleted checkpoints; Cloud Storage's soft delete would
# keep each of them (checkpoints are large and rewritten often) a second time. 0 turns it off
# (hashicorp/google v6.50.0 resource_storage_bucket.go:551 retention_duration_seconds).
SOFT_DELETE_SECONDS = 0
# hashicorp/google v6.50.0 website/docs/r/storage_bucket.html.markdown:182: "Acceptable values are
# "inherited" or "enforced"" (the schema at resource_storage_bucket.go:537 has no validator).
PUBLIC_ACCESS_PREVENTION = "enforced"
# hashicorp/google v6.50.0 resource_storage_bucket.go:200: lifecycle action types "Delete,
# SetStorageClass and AbortIncompleteMultipartUpload"; with_state (:257) one of LIVE, ARCHIVED, ANY.
DELETE = "Delete"
LIVE, ARCHIVED = "LIVE", "ARCHIVED"
ENV_CHECKPOINT_URI = "GPUFLEET_CHECKPOINT_URI"
# The bucket's label; safety.checkov_exempt recognises the checkpoint bucket by it.
CHECKPOINT_LABEL = ("gpufleet-purpose", "checkpoints")


class Principal(StrEnum):
    TENANT_SA = "tenant_sa"
    KSA = "ksa"
    NODE_SA = "node_sa"


@dataclass(frozen=True)
class CheckpointGrant:
    tenant: str
    principal: Principal
    namespace: str
    # TENANT_SA: the tenant's GCP service account id (clusters.derive.tenants.tenant_account_id).
    account_id: str | None = None


@dataclass(frozen=True)
class CheckpointBucketSpec:
    name: str
    project: str
    location: str
    retention_days: int
    protected: bool
    grants: tuple[CheckpointGrant, ...]

    def condition(self, tenant: str) -> str:
        return prefix_condition(self.name, tenant)


def bucket_name(config: ClusterConfig) -> str:
    """The file's ``checkpoints.bucket``, else ``<project>-<cluster>-ckpt`` (``clusters.rules`` checks it)."""
    return config.checkpoints.bucket or f"{config.gcp.project}-{config.name}-ckpt"


def tenant_prefix(tenant: str) -> str:
    return f"{tenant}/"


def checkpoint_uri(bucket: str, tenant: str, run: str) -> str:
    """``gs://<bucket>/<tenant>/<run>/``: the directory a run writes and every attempt of it resumes from."""
    return f"gs://{bucket}/{tenant_prefix(tenant)}{run}/"


def _cel_string(text: str) -> str:
    """A CEL string literal; bucket and tenant names are charset-checked (no quote or backslash) but escape anyway."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def prefix_condition(bucket: str, tenant: str) -> str:
    """IAM condition: objects under the tenant's prefix, and listings asking only for that prefix."""
    objects = f"projects/_/buckets/{bucket}/objects/{tenant_prefix(tenant)}"
    return (f"resource.name.startsWith({_cel_string(objects)})"
            f" || api.getAttribute(\"storage.googleapis.com/objectListPrefix\", \"\").startsWith({_cel_string(tenant_prefix(tenant))})")


def ksa_principal(project_number: str, project: str, namespace: str, ksa: str = WORKLOAD_KSA) -> str:
    """Workload Identity Federation for GKE's principal identifier of one Kubernetes service account."""
    return (f"principal://iam.googleapis.com/projects/{project_number}/locations/global/workloadIdentityPools/"
            f"{project}.svc.id.goog/subject/ns/{namespace}/sa/{ksa}")


def derive_checkpoint_bucket(config: ClusterConfig) -> CheckpointBucketSpec:
    grants = []
    for tenant in derive_tenants(config):
        if config.scheduler == SchedulerKind.NOMAD:
            grants.append(CheckpointGrant(tenant.name, Principal.NODE_SA, tenant.namespace))
        elif tenant.gcp_account_id is not None:
            grants.append(CheckpointGrant(tenant.name, Principal.TENANT_SA, tenant.namespace, tenant.gcp_account_id))
        else:
            grants.append(CheckpointGrant(tenant.name, Principal.KSA, tenant.namespace))
    return CheckpointBucketSpec(
        name=bucket_name(config),
        project=config.gcp.project,
        location=config.gcp.region,
        retention_days=config.checkpoints.retention_days,
        # Checkpoints are the only copy of days of training: protected like the pools outside dev.
        protected=config.environment != Environment.DEV,
        grants=tuple(grants),
    )
