"""Rules that catch what the cloud APIs would refuse only at apply time, or what would cost money silently.

Each is a pure function of one validated ClusterConfig returning (field path, message) pairs, the
message naming the value, what is allowed and the fix. Facts come from checked-in tables:
``clusters/gcp_zones.json`` (zones and the GPU series each offers), ``clusters.machines`` and
``clusters.names`` (the naming rules of each API, with their sources).
"""

from __future__ import annotations

from collections.abc import Iterator

from clusters import gcp_zones, names
from clusters.derive.checkpoints import bucket_name
from clusters.derive.pools import CLUSTER_LABEL, POOL_LABEL
from clusters.derive.tenants import tenant_account_id
from clusters.machines import machine_series
from clusters.schema import ClusterConfig, Environment, GcsState, LocalState, SchedulerKind
from clusters.source import FieldPath, did_you_mean

Finding = tuple[FieldPath, str]

# Boot disk types per machine family (A3 Ultra / A4: Hyperdisk only) are checked from
# clusters/families.py in clusters/checks.py, one rule for every family.


def check(config: ClusterConfig) -> list[Finding]:
    findings: list[Finding] = []
    findings += _region_and_zones(config)
    findings += _machine_zones(config)
    findings += _derived_names(config)
    findings += _labels(config)
    findings += _state(config)
    findings += _guard_rails(config)
    return findings


def _region_and_zones(config: ClusterConfig) -> Iterator[Finding]:
    table = gcp_zones.load()
    regions = table.regions
    gcp = config.gcp
    if gcp.region not in regions:
        yield (("gcp", "region"), f"{gcp.region!r} is not a GCP region{did_you_mean(gcp.region, regions)} ({table.cite});"
               " fix the spelling, or if Google added it, refresh the table with tools/refresh_gcp_zones.py")
        return
    allowed = ", ".join(regions[gcp.region])
    for i, zone in enumerate(gcp.zones):
        if zone.startswith(gcp.region + "-") and zone not in table.zones:
            yield (("gcp", "zones", i), f"zone {zone!r} does not exist in {gcp.region}; allowed: {allowed} ({table.cite}); pick one of those")


def _machine_zones(config: ClusterConfig) -> Iterator[Finding]:
    """A pool whose machine series a zone does not offer never gets a node there (or fails to create)."""
    table = gcp_zones.load()
    for p, pool in enumerate(config.gpu_pools):
        series = machine_series(pool.machine_type)
        if series is None:
            continue
        zones = pool.zones or config.gcp.zones
        offering = table.offering(config.gcp.region, series)
        for z, zone in enumerate(zones):
            if zone not in table.zones or series in table.zones[zone]:
                continue
            path = ("gpu_pools", p, "zones", z) if pool.zones else ("gpu_pools", p, "machine_type")
            where = f"zones: [{', '.join(offering)}] on the pool" if offering else "a machine type offered there or another region"
            yield (path, f"{pool.machine_type} ({series} series) is not offered in zone {zone}; zones of {config.gcp.region}"
                   f" offering {series}: {', '.join(offering) or 'none'} ({table.cite}); set {where}")


def nomad_pool_name(cluster: str, pool: str) -> str:
    """The Nomad client MIG, autoscaler and base instance name (constructs_lib/nomad_client_pool.py)."""
    return f"{cluster}-{pool}"


# Limits of names derived from the cluster and pool names: MIG base instance names allow 58
# characters (the MIG appends '-xxxx'), instance template name_prefix 54 (google provider).
BASE_INSTANCE_NAME_MAX = 58
NAME_PREFIX_MAX = 54


def _derived_names(config: ClusterConfig) -> Iterator[Finding]:
    if config.scheduler == SchedulerKind.NOMAD:
        for p, pool in enumerate(config.gpu_pools):
            name = nomad_pool_name(config.name, pool.name)
            limit = min(BASE_INSTANCE_NAME_MAX, NAME_PREFIX_MAX - 1)
            if len(name) > limit:
                yield (("gpu_pools", p, "name"), f"the pool's instance group name {name!r} is {len(name)} characters; Compute Engine"
                       f" allows {limit} here (base instance name 58, template prefix 54 with '-'); shorten the pool name to"
                       f" {max(limit - len(config.name) - 1, 1)} characters or the cluster name")
    for t, tenant in enumerate(config.tenants):
        if tenant.service_account is not None:
            account = tenant_account_id(config.name, tenant.name)
            reason = names.account_id(account)
            if reason and len(account) < names.ACCOUNT_ID_MIN:
                yield (("tenants", t, "service_account"), f"the tenant's GCP service account id {account!r} is too short: {reason};"
                       " use a longer tenant or cluster name")
    checkpoints = bucket_name(config)
    reason = names.bucket(checkpoints) or ("a dotted bucket name needs a verified domain" if "." in checkpoints else None)
    if reason:
        field = ("checkpoints", "bucket") if config.checkpoints.bucket else ("name",)
        yield (field, f"the checkpoint bucket name {checkpoints!r} is not a valid Cloud Storage bucket name: {reason};"
               " set checkpoints: {bucket: <3-63 lowercase letters, digits, '-'>}, e.g. 'ml-train-ckpt'")
    if config.dns is not None:
        for r, record in enumerate(config.dns.records):
            full = config.dns.zone_name if record.name == "@" else f"{record.name}.{config.dns.zone_name}"
            reason = names.dns_name(full)
            if reason:
                yield (("dns", "records", r, "name"), f"{full!r}: {reason}; shorten the record name")


def _labels(config: ClusterConfig) -> Iterator[Finding]:
    """Pool labels become GKE node labels (Kubernetes rules) and GCE labels (Nomad): both must accept them."""
    reserved = (CLUSTER_LABEL, POOL_LABEL)
    for p, pool in enumerate(config.gpu_pools):
        for key, value in sorted(pool.labels.items()):
            if key in reserved:
                yield (("gpu_pools", p, "labels", key), f"{key} is set by gpufleet (cluster and pool names); remove it or rename the key")
                continue
            reason = names.label_value(value)
            if reason:
                suggestion = "-".join(part for part in "".join(c if c.isalnum() else " " for c in value.lower()).split())[:63]
                yield (("gpu_pools", p, "labels", key), f"{value!r} is not a valid label value: {reason}; write e.g."
                       f" {suggestion or 'pretrain'!r}")
        for t, taint in enumerate(pool.taints):
            reason = names.label_value(taint.value)
            if reason:
                yield (("gpu_pools", p, "taints", t, "value"), f"{taint.value!r} is not a valid taint value: {reason}; write e.g. 'true'")


def _state(config: ClusterConfig) -> Iterator[Finding]:
    if isinstance(config.state, GcsState):
        reason = names.bucket(config.state.bucket)
        if reason:
            yield (("state", "bucket"), f"{config.state.bucket!r} is not a valid Cloud Storage bucket name: {reason}; e.g. 'ml-tfstate-prod'")


def _guard_rails(config: ClusterConfig) -> Iterator[Finding]:
    if config.environment == Environment.PROD and isinstance(config.state, LocalState):
        yield (("state",), "prod clusters cannot keep Terraform state on a laptop (backend local, the default);"
               " allowed: gcs or tfc; add state: {backend: gcs, bucket: <state bucket>} or {backend: tfc, organization: <org>}")
    if config.nomad is not None and config.environment != Environment.DEV and config.nomad.vault_addr.startswith("http://"):
        yield (("nomad", "vault_addr"), f"{config.nomad.vault_addr!r} sends Vault tokens in clear text; plain http:// is allowed only"
               " in dev; write the https:// address of your Vault")
