"""Rules across cluster files: names two clusters would both claim in one GCP project or DNS zone.

Each cluster file passes on its own, yet two of them can derive the same service account id
(``a`` + tenant ``b-c`` and ``a-b`` + tenant ``c`` both give ``a-b-c``), the same instance group or
static IP name, or claim one DNS record: the second apply fails, or silently takes the first
cluster's record over. Reported on the later file (in name order), naming the earlier one.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from clusters.derive.tenants import tenant_account_id
from clusters.rules import nomad_pool_name
from clusters.schema import ClusterConfig, SchedulerKind
from clusters.source import FieldPath

# constructs_lib/iam.py names the node service account from the first 22 characters of the cluster.
NODE_SA_PREFIX = 22


@dataclass(frozen=True)
class Claim:
    scope: str  # "project <id>" or "DNS zone <name>"
    kind: str
    name: str
    path: FieldPath


def claims(config: ClusterConfig) -> Iterator[Claim]:
    """Every project- or zone-scoped name this cluster's stacks create (a pure function of the file)."""
    project = f"project {config.gcp.project}"
    yield Claim(project, "node service account id", f"{config.name[:NODE_SA_PREFIX]}-nodes", ("name",))
    for t, tenant in enumerate(config.tenants):
        if tenant.service_account is not None:
            yield Claim(project, "tenant service account id", tenant_account_id(config.name, tenant.name), ("tenants", t, "name"))
    regional = f"{project}, region {config.gcp.region}"
    for i, ip in enumerate(config.gcp.static_ips):
        scope, kind = (project, "global static IP name") if ip.use is not None and ip.use.is_global else (regional, "static IP name")
        yield Claim(scope, kind, f"{config.name}-{ip.name}", ("gcp", "static_ips", i, "name"))
    if config.scheduler == SchedulerKind.NOMAD:
        for p, pool in enumerate(config.gpu_pools):
            yield Claim(regional, "instance group name", nomad_pool_name(config.name, pool.name), ("gpu_pools", p, "name"))
    if config.dns is not None:
        for r, record in enumerate(config.dns.records):
            yield Claim(f"DNS zone {config.dns.zone_name}", "DNS record", record.name, ("dns", "records", r, "name"))


def cross_cluster(configs: list[tuple[str, ClusterConfig]]) -> list[tuple[int, FieldPath, str]]:
    """(index into ``configs``, field path, message) for each name a later file claims again; ``configs`` are (file, config)."""
    owner: dict[tuple[str, str], tuple[str, str]] = {}
    findings: list[tuple[int, FieldPath, str]] = []
    clusters: dict[str, str] = {}
    for index, (file, config) in enumerate(configs):
        if config.name in clusters:
            findings.append((index, ("name",), f"cluster {config.name!r} is also defined in {clusters[config.name]}; keep one file per"
                             " cluster (a .yml and a .yaml of the same name count twice): delete or rename one"))
            continue
        clusters[config.name] = file
        for claim in claims(config):
            key = (claim.scope, claim.name)
            if key in owner and owner[key][0] != config.name:
                other, other_file = owner[key]
                fix = "rename the record or drop it from one file" if claim.kind == "DNS record" else \
                    "rename one of them (or put the clusters in different projects)"
                findings.append((index, claim.path, f"{claim.kind} {claim.name!r} in {claim.scope} is already claimed by cluster {other}"
                                 f" ({other_file}); both applies would fight over it; {fix}"))
            owner.setdefault(key, (config.name, file))
    return findings
