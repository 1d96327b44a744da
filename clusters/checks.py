"""Cross-field rules of a cluster file, as pure functions returning (field path, message) pairs.

Each rule comes from a known-good source (REFERENCE.md: Google's cluster toolkit node-pool
rules, the GPU machine table) and each message says what to change.
"""

from __future__ import annotations

import ipaddress
import re
from datetime import datetime
from collections import Counter
from collections.abc import Iterator

from clusters import rules
from clusters.plan_reach import planned_from
from clusters.derive.addresses import dns_record_address, grant_address
from clusters.derive.gke import SYSTEM_POOL_NAME, derive_control_plane
from clusters.derive.pools import derive_gpu_pool, pool_gpudirect, kueue_queue_key, machine_accelerator
from clusters.derive.tenants import tenant_account_id
from clusters.families import (FAMILIES, GPUDIRECT_RANGE_MAX_PREFIX, IMAGE_DRIVER_BRANCH, MIN_DRIVER_BRANCH, GpuDirect, gpudirect_min_gke_version,
                               image_driver_branch, machine_family)
from clusters.machines import MACHINE_GPUS, N1_ACCELERATOR, N1_GPU_CHOICES, is_n1
from clusters.schema import ClusterConfig, DnsRecord, Environment, GpuPool, SchedulerKind
from clusters.source import FieldPath, did_you_mean

Finding = tuple[FieldPath, str]

# The longest dated upgrade exclusion GKE can accept. A NO_MINOR(_OR_NODE)_UPGRADES exclusion may last
# until the end of support of the cluster's minor version (the GKE API's ExclusionUntilEndOfSupport:
# "the cluster control plane version's end of support time, or end of extended support time when the
# cluster is on extended support channel", google.container.v1 NodePool.ExclusionUntilEndOfSupport.end_time),
# and a minor version gets 14 months of standard support from its release (GKE versioning and support
# docs); gpufleet's release channels (RAPID, REGULAR, STABLE: clusters/schema.py) have no extended
# support. So even a minor released the day the exclusion starts is out of support after 14 months
# (14 x 30.44 days); a 5-year exclusion is refused by GKE at apply, and here at review.
MAX_EXCLUSION_DAYS = 426


def cross_check(config: ClusterConfig, file_stem: str | None = None) -> list[Finding]:
    findings: list[Finding] = []
    if file_stem is not None and config.name != file_stem:
        findings.append((("name",), f"{config.name!r} must equal the file name {file_stem!r}; rename the file or set name: {file_stem}"))
    findings += _scheduler_sections(config)
    findings += _gcp(config)
    findings += _unique(config.gpu_pools, "gpu_pools", "pool")
    findings += _unique(config.gcp.static_ips, ("gcp", "static_ips"), "static IP")
    findings += _unique(config.tenants, "tenants", "tenant")
    for i, pool in enumerate(config.gpu_pools):
        findings += [(("gpu_pools", i, *path), msg) for path, msg in _pool(pool, config)]
    findings += _iam(config)
    findings += _tenant_names(config)
    findings += _nomad(config)
    findings += planned_from(config)
    if not any(path[0] == "gpu_pools" for path, _ in findings):
        findings += _tenants(config)
    findings += _static_ips(config)
    findings += _dns(config)
    findings += rules.check(config)
    return findings


def _scheduler_sections(config: ClusterConfig) -> Iterator[Finding]:
    if config.scheduler == SchedulerKind.NOMAD and config.nomad is None:
        yield (("nomad",), "scheduler nomad needs a nomad: section (datacenter, vault_addr); add it")
    if config.scheduler == SchedulerKind.GKE and config.nomad is not None:
        yield (("nomad",), "a nomad: section only applies to scheduler: nomad; remove it or set scheduler: nomad")
    if config.scheduler == SchedulerKind.NOMAD and config.gke is not None:
        yield (("gke",), "a gke: section only applies to scheduler: gke; remove it or set scheduler: gke")
    if config.scheduler == SchedulerKind.GKE and config.gcp.master_cidr is None:
        yield (("gcp", "master_cidr"), "GKE private clusters need master_cidr, a /28 such as '172.16.0.0/28'; add it")
    if config.scheduler == SchedulerKind.GKE:
        yield from _gke_access(config)
        yield from _gke_gpudirect_version(config)
        yield from _gpudirect(config)


def _gke_gpudirect_version(config: ClusterConfig) -> Iterator[Finding]:
    """A pinned control-plane version must be one the pools' GPUDirect plugin supports (toolkit gpu_direct.tf)."""
    version = config.gke.min_master_version if config.gke else None
    if version is None:
        return
    for pool in config.gpu_pools:
        transport = pool_gpudirect(pool)
        floor = gpudirect_min_gke_version(transport, version)
        if floor is not None:
            yield (("gke", "min_master_version"), f"{version} is below {floor}, the lowest GKE version of its minor (or the lowest listed) whose "
                   f"GPUDirect-{transport.value.upper()} plugin supports pool {pool.name} ({pool.machine_type}; toolkit gke-node-pool/gpu_direct.tf); "
                   f"set min_master_version: {floor} or later, or remove it to follow the release channel")
            return


def _gke_access(config: ClusterConfig) -> Iterator[Finding]:
    """The scheduler stack is planned from outside the VPC (CI, Terraform Cloud), and tenant RBAC names Google groups."""
    control_plane = derive_control_plane(config)
    if not control_plane.reachable_from_ci:
        yield (("gke", "dns_endpoint"), "with the DNS endpoint off and no public IP endpoint in master_authorized_networks nobody outside"
               " the VPC can reach the control plane, so CI and Terraform Cloud cannot plan the scheduler stack;"
               " set gke.dns_endpoint: true (IAM-authorized, no IP allow-list)")
    gke = config.gke
    if gke is not None:
        if gke.system_pool.min_nodes > gke.system_pool.max_nodes:
            yield (("gke", "system_pool", "min_nodes"), f"min_nodes {gke.system_pool.min_nodes} is above max_nodes"
                   f" {gke.system_pool.max_nodes}; lower min_nodes or raise max_nodes")
        exclusion = gke.upgrade_exclusion
        if exclusion is not None and (exclusion.start_time is None) != (exclusion.end_time is None):
            given, missing = ("start_time", "end_time") if exclusion.end_time is None else ("end_time", "start_time")
            yield (("gke", "upgrade_exclusion", given), f"{given} without {missing}: a dated exclusion needs both;"
                   " set both, or remove both and gpufleet renews the exclusion every calendar quarter")
        elif exclusion is not None and exclusion.end_time is not None and exclusion.start_time is not None:
            days = (_instant(exclusion.end_time) - _instant(exclusion.start_time)).total_seconds() / 86400
            if days <= 0:
                yield (("gke", "upgrade_exclusion", "end_time"), f"{exclusion.end_time} is not after start_time {exclusion.start_time};"
                       " set an end_time after the start (GKE allows NO_MINOR_OR_NODE_UPGRADES until the minor version's end of support)")
            elif days > MAX_EXCLUSION_DAYS:
                yield (("gke", "upgrade_exclusion", "end_time"), f"{exclusion.end_time} is {days:.0f} days after start_time {exclusion.start_time};"
                       f" GKE refuses a {exclusion.scope} exclusion that outlasts the end of support of the cluster's minor version, at most"
                       f" 14 months after its release on the {gke.release_channel} channel (allowed: up to {MAX_EXCLUSION_DAYS} days);"
                       f" set end_time at most {MAX_EXCLUSION_DAYS} days after start_time, or remove both dates and gpufleet renews the"
                       " exclusion every calendar quarter")
    grouped = [t.name for t in config.tenants if any(m.startswith("group:") for m in t.groups)]
    if grouped and (config.gke is None or config.gke.rbac_security_group is None):
        yield (("gke", "rbac_security_group"), f"tenants {', '.join(grouped)} bind Google groups, which GKE RBAC only matches with"
               " Google Groups for RBAC; set gke.rbac_security_group: gke-security-groups@<your domain> and nest the tenant groups in it")


def _instant(rfc3339: str) -> datetime:
    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00"))


def _gpudirect(config: ClusterConfig) -> Iterator[Finding]:
    """GPUDirect VPC subnets are carved from gcp.gpudirect_cidr; an RDMA VPC's network profile is zonal."""
    pools = [(i, p) for i, p in enumerate(config.gpu_pools) if pool_gpudirect(p) != GpuDirect.NONE]
    if not pools:
        return
    gcp = config.gcp
    net = ipaddress.IPv4Network(gcp.gpudirect_cidr)
    if net.prefixlen > GPUDIRECT_RANGE_MAX_PREFIX:
        yield (("gcp", "gpudirect_cidr"), f"{gcp.gpudirect_cidr!r} is too small for 16 /20 GPUDirect subnets; use a /16 such as '192.168.0.0/16'")
    for field in ("subnet_cidr", "pods_cidr", "services_cidr", "master_cidr"):
        other = getattr(gcp, field)
        if other and net.overlaps(ipaddress.IPv4Network(other)):
            yield (("gcp", "gpudirect_cidr"), f"{gcp.gpudirect_cidr!r} overlaps {field} {other!r}; pick a range that overlaps none of them, e.g. '192.168.0.0/16'")
    rdma_zones = {}
    for i, p in pools:
        if pool_gpudirect(p) != GpuDirect.RDMA:
            continue
        zones = p.zones or gcp.zones
        if len(zones) != 1:
            yield (("gpu_pools", i, "zones"), f"{p.machine_type} uses an RDMA VPC whose RoCE network profile is zonal; set zones: [{zones[0]}]")
        rdma_zones.setdefault(zones[0], i)
    if len(rdma_zones) > 1:
        (first, _), (zone, i) = sorted(rdma_zones.items(), key=lambda kv: kv[1])[:2]
        yield (("gpu_pools", i, "zones"), f"RDMA pools share one RoCE VPC in zone {first}; put this pool in {first} too")


def _gcp(config: ClusterConfig) -> Iterator[Finding]:
    gcp = config.gcp
    for i, zone in enumerate(gcp.zones):
        if not zone.startswith(gcp.region + "-"):
            yield (("gcp", "zones", i), f"zone {zone!r} is not in region {gcp.region!r}; use e.g. '{gcp.region}-a'")
    if gcp.master_cidr and ipaddress.IPv4Network(gcp.master_cidr).prefixlen != 28:
        yield (("gcp", "master_cidr"), f"{gcp.master_cidr!r} must be a /28 (GKE requires it); e.g. '172.16.0.0/28'")
    ranges = [(f, getattr(gcp, f)) for f in ("subnet_cidr", "pods_cidr", "services_cidr", "master_cidr") if getattr(gcp, f)]
    for a in range(len(ranges)):
        for b in range(a + 1, len(ranges)):
            (fa, ca), (fb, cb) = ranges[a], ranges[b]
            if ipaddress.IPv4Network(ca).overlaps(ipaddress.IPv4Network(cb)):
                yield (("gcp", fb), f"{cb!r} overlaps {fa} {ca!r}; pick a range that overlaps none of subnet/pods/services/master")


def _unique(items: tuple, field: str | tuple[str, ...], what: str) -> Iterator[Finding]:
    base = (field,) if isinstance(field, str) else field
    counts = Counter(item.name for item in items)
    seen: set[str] = set()
    for i, item in enumerate(items):
        if counts[item.name] > 1 and item.name in seen:
            yield ((*base, i, "name"), f"duplicate {what} name {item.name!r}; names must be unique, rename one")
        seen.add(item.name)


def _pool(pool: GpuPool, config: ClusterConfig) -> Iterator[Finding]:
    yield from _pool_machine(pool)
    yield from _pool_sizing(pool)
    if pool.spot and pool.reservation:
        yield (("reservation",), "spot pools cannot consume a reservation; remove reservation or set spot: false")
    if pool.queued_provisioning:
        if pool.reservation:
            yield (("queued_provisioning",), "queued provisioning (DWS) cannot use a reservation; remove reservation")
        if pool.spot:
            yield (("queued_provisioning",), "queued provisioning (DWS) cannot be spot; set spot: false")
        if (pool.min_nodes or 0) != 0 or pool.node_count is not None:
            yield (("queued_provisioning",), "queued provisioning (DWS) needs autoscaling with min_nodes: 0; set min_nodes: 0 and drop node_count")
        if pool.placement == "COMPACT":
            yield (("placement",), "queued provisioning (DWS) cannot use COMPACT placement (toolkit gke-node-pool precondition); remove placement")
    family = machine_family(pool.machine_type)
    if pool.gpudirect is True and family.gpudirect == GpuDirect.NONE:
        built = ", ".join(sorted(f"{f.prefixes[0]} ({f.gpudirect.value.upper()})" for f in FAMILIES if f.gpudirect != GpuDirect.NONE))
        yield (("gpudirect",), f"true on {pool.machine_type}, which has no GPUDirect NICs (it would be silently ignored); allowed on: {built};"
               " remove gpudirect (it is on by default where the machine has it) or pick one of those machine types")
    if pool.boot_disk_type is not None and pool.boot_disk_type.value not in family.boot_disk_types:
        yield (("boot_disk_type",), f"{pool.boot_disk_type.value} is not offered on {pool.machine_type}; allowed:"
               f" {', '.join(family.boot_disk_types)}; set boot_disk_type: {family.boot_disk_types[0]} or omit it")
    if config.scheduler == SchedulerKind.GKE and pool.name == SYSTEM_POOL_NAME:
        yield (("name",), f"{SYSTEM_POOL_NAME!r} is the name of the cluster's system pool; rename the GPU pool")
    zones = pool.zones or config.gcp.zones
    if pool.reservation and len(zones) != 1:
        yield (("reservation",), f"reservation {pool.reservation} is zonal but the pool spans {len(zones)} zones ({', '.join(zones)});"
               " set zones: [<the reservation's zone>] on the pool")
    for i, zone in enumerate(pool.zones or ()):
        if zone not in config.gcp.zones:
            yield (("zones", i), f"zone {zone!r} is not one of the cluster's zones {list(config.gcp.zones)}; add it to gcp.zones or pick one of those")
    if pool.placement_policy_name is not None and pool.placement != "COMPACT":
        yield (("placement_policy_name",), "placement_policy_name names a compact placement policy; set placement: COMPACT or remove placement_policy_name")
    if pool.reservation and pool.placement == "COMPACT" and pool.placement_policy_name is None:
        # Review B10, decided: refuse. Reserved A3/A4 capacity comes with its own placement (blocks,
        # or the compact policy the reservation was created with); the toolkit's reserved A3
        # blueprints set no placement policy, and a fresh policy GKE creates for the pool need not
        # match the reserved hosts, so scale-ups could fail with capacity sitting unused. Naming the
        # reservation's own policy (toolkit placement_policy.name) stays possible.
        yield (("placement",), "a specific reservation brings its own placement and a new COMPACT policy need not match the reserved"
               " hosts; remove placement, or set placement_policy_name to the compact policy the reservation was created with")
    if pool.placement == "COMPACT" and len(zones) != 1:
        yield (("placement",), f"COMPACT placement needs exactly one zone, the pool has {len(zones)} ({', '.join(zones)}); set zones: [{zones[0]}]")
    if config.environment != Environment.DEV and pool.protected is False and pool.reservation:
        yield (("protected",), "a reserved pool outside dev must stay protected; remove protected: false")


def _pool_machine(pool: GpuPool) -> Iterator[Finding]:
    derived = machine_accelerator(pool.machine_type, pool.accelerator, pool.gpus_per_node)
    if derived is None:
        yield (("machine_type",), f"{pool.machine_type!r} is not a known GPU machine type{did_you_mean(pool.machine_type, MACHINE_GPUS)};"
               " allowed: a2-*/a3-*/a4-*/g2-* GPU shapes or n1-* with a T4")
        return
    accelerator, gpus = derived
    if is_n1(pool.machine_type):
        if pool.accelerator not in (None, N1_ACCELERATOR):
            yield (("accelerator",), f"{pool.accelerator!r} cannot attach to {pool.machine_type}; N1 takes {N1_ACCELERATOR}")
        if pool.gpus_per_node is None:
            yield (("gpus_per_node",), f"N1 machines take a chosen T4 count; set gpus_per_node to one of {list(N1_GPU_CHOICES)}")
        elif pool.gpus_per_node not in N1_GPU_CHOICES:
            yield (("gpus_per_node",), f"{pool.gpus_per_node} T4s cannot attach to an N1 machine; allowed: {list(N1_GPU_CHOICES)}")
        return
    if pool.accelerator is not None and pool.accelerator != accelerator:
        yield (("accelerator",), f"{pool.accelerator!r} does not match machine type {pool.machine_type} ({accelerator}); set accelerator: {accelerator} or omit it")
    if pool.gpus_per_node is not None and pool.gpus_per_node != gpus:
        better = next((m for m, g in sorted(MACHINE_GPUS.items()) if g.accelerator == accelerator and g.gpus == pool.gpus_per_node), None)
        alt = f" or pick {better}" if better else ""
        yield (("gpus_per_node",), f"{pool.gpus_per_node} does not match machine type {pool.machine_type} ({gpus} GPUs); set gpus_per_node: {gpus}{alt}")


def _pool_sizing(pool: GpuPool) -> Iterator[Finding]:
    if pool.node_count is not None:
        if pool.min_nodes is not None or pool.max_nodes is not None:
            yield (("node_count",), "a static node_count excludes autoscaling; remove min_nodes/max_nodes or node_count")
        return
    if pool.max_nodes is None:
        yield (("max_nodes",), "autoscaling pools need max_nodes; add max_nodes (or set a static node_count)")
    elif (pool.min_nodes or 0) > pool.max_nodes:
        yield (("min_nodes",), f"min_nodes {pool.min_nodes} is above max_nodes {pool.max_nodes}; lower min_nodes or raise max_nodes")


def _iam(config: ClusterConfig) -> Iterator[Finding]:
    addresses: dict[str, str] = {}
    for g, grant in enumerate(config.iam.grants):
        for m, member in enumerate(grant.members):
            address = grant_address(grant.role, member)
            if address not in addresses:
                addresses[address] = member
                continue
            other = addresses[address]
            yield (("iam", "grants", g, "members", m), f"{member!r} already has {grant.role}; list each member once per role"
                   if other == member else f"{member!r} and {other!r} would share the Terraform address {address}"
                   " (only letters, digits and '_' tell addresses apart); grant one of them through a group")
    if config.environment == Environment.DEV:
        return
    for g, grant in enumerate(config.iam.grants):
        for m, member in enumerate(grant.members):
            if member.startswith("user:"):
                yield (("iam", "grants", g, "members", m),
                       f"{member!r}: user members are refused outside dev; grant a group: or serviceAccount: instead")
    for t, tenant in enumerate(config.tenants):
        for m, member in enumerate(tenant.groups):
            if member.startswith("user:"):
                yield (("tenants", t, "groups", m), f"{member!r}: tenants are groups outside dev; use group:team@example.com")


# Namespaces the platform (Kubernetes, GKE, Kueue) or Nomad already owns; a tenant must not take them over.
RESERVED_NAMESPACES = ("default", "kube-node-lease", "kube-public", "kube-system", "kueue-system", "gke-managed-system", "gmp-system")
GCP_ACCOUNT_ID_MAX = 30
HOSTNAME = re.compile(r"^(?=.{1,253}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63}\.?$")
# Cloud auto-join values are plain words (go-discover); '$', '%', quotes and braces never occur.
SERVER_ADDRESS = re.compile(r"^(provider=[a-z0-9]+( [a-z_]+=[^\s$%{}\"']+)*|[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]{1,5})?)$")


def _tenant_names(config: ClusterConfig) -> Iterator[Finding]:
    for t, tenant in enumerate(config.tenants):
        if tenant.name in RESERVED_NAMESPACES or tenant.name.startswith(("kube-", "gke-")):
            yield (("tenants", t, "name"), f"tenant {tenant.name!r} would take over a namespace the platform owns"
                   f" ({', '.join(RESERVED_NAMESPACES)}, kube-*, gke-*); pick another name, e.g. 'team-{tenant.name}'")
        if tenant.service_account is not None:
            account_id = tenant_account_id(config.name, tenant.name)
            if len(account_id) > GCP_ACCOUNT_ID_MAX:
                room = GCP_ACCOUNT_ID_MAX - len(config.name) - 1
                yield (("tenants", t, "service_account"), f"the tenant's GCP service account id {account_id!r} is {len(account_id)} characters,"
                       f" GCP allows {GCP_ACCOUNT_ID_MAX}; shorten the tenant name to {room} characters or drop service_account")


def _nomad(config: ClusterConfig) -> Iterator[Finding]:
    """Nomad clients run in plain managed instance groups: GKE-only pool features do not apply."""
    if config.scheduler != SchedulerKind.NOMAD:
        return
    for i, pool in enumerate(config.gpu_pools):
        if pool.queued_provisioning:
            yield (("gpu_pools", i, "queued_provisioning"), "queued provisioning (DWS) is a GKE feature; remove it from Nomad pools or use scheduler: gke")
        if pool.placement is not None:
            yield (("gpu_pools", i, "placement"), f"placement {pool.placement} is a GKE node-pool feature; remove it from Nomad pools or use scheduler: gke")
        if pool.reservation and "/reservationBlocks/" in pool.reservation:
            yield (("gpu_pools", i, "reservation"), "reservation blocks are targeted through GKE node pools only; name the whole reservation on Nomad pools")
        if pool.host_maintenance_interval is not None:
            yield (("gpu_pools", i, "host_maintenance_interval"), "host_maintenance_interval is a GKE node-pool setting; remove it from Nomad pools")
        if pool.gpudirect is True:
            yield (("gpu_pools", i, "gpudirect"), "true on a Nomad pool: GPUDirect NICs and their NCCL plugins are set up on GKE node pools"
                   " only (Nomad clients get one gVNIC); remove gpudirect or use scheduler: gke")
        yield from _nomad_driver_branch(config, i, pool)
    for t, tenant in enumerate(config.tenants):
        if tenant.service_account is not None:
            yield (("tenants", t, "service_account"), "tenant GCP service accounts are bound through GKE workload identity;"
                   " Nomad jobs get credentials from Vault instead: remove service_account or use scheduler: gke")
    if config.nomad is None:
        return
    yield from _nomad_servers(config)
    yield from _nomad_existing_servers_scaling(config)
    for s, server in enumerate(config.nomad.existing_servers):
        if server in config.nomad.existing_servers[:s]:
            yield (("nomad", "existing_servers", s), f"{server!r} is listed twice; list each server once")
        elif not SERVER_ADDRESS.match(server):
            yield (("nomad", "existing_servers", s), f"{server!r} is not a Nomad server address; write 'host', 'host:4647' or a cloud auto-join string"
                   " such as 'provider=gce tag_value=nomad-server'")


def _nomad_driver_branch(config: ClusterConfig, index: int, pool: GpuPool) -> Iterator[Finding]:
    """A Nomad client runs the driver its image brings: refuse an image whose named branch is older than the GPU needs."""
    derived = machine_accelerator(pool.machine_type, pool.accelerator, pool.gpus_per_node)
    need = MIN_DRIVER_BRANCH.get(derived[0]) if derived else None
    image = config.nomad.client_machine_image if config.nomad else ""
    have = image_driver_branch(image)
    if need is not None and have is not None and have < need:
        fixed = IMAGE_DRIVER_BRANCH.sub(f"-with-nvidia-{need}", image.rsplit("/", 1)[-1])
        yield (("gpu_pools", index, "machine_type"), f"{pool.machine_type} ({derived[0]}) needs NVIDIA driver branch {need} or newer;"
               f" nomad.client_machine_image brings {have}; set nomad.client_machine_image to"
               f" {image.rsplit('/', 1)[0]}/{fixed} (an image with that branch)")


def _nomad_existing_servers_scaling(config: ClusterConfig) -> Iterator[Finding]:
    """gpufleet runs the Nomad Autoscaler on the servers it creates; on existing servers nothing it
    provisions would resize a pool, so an autoscaled pool would stay at its minimum (at 0 its jobs
    queue for ever)."""
    if config.nomad is None or not config.nomad.existing_servers:
        return
    for i, pool in enumerate(config.gpu_pools):
        if pool.node_count is None:
            yield (("gpu_pools", i, "min_nodes"), f"pool {pool.name} autoscales, but on nomad.existing_servers gpufleet runs no Nomad Autoscaler:"
                   f" it would stay at {pool.min_nodes or 0} node(s); give it a fixed node_count, or remove nomad.existing_servers so gpufleet"
                   " creates the servers and their autoscaler")


def _nomad_servers(config: ClusterConfig) -> Iterator[Finding]:
    """Servers gpufleet creates must keep quorum through a zone loss, and someone must be able to
    reach their API to apply the scheduler stack (the firewall admits only the node subnet and
    nomad.api_access)."""
    nomad = config.nomad
    if nomad is None or nomad.existing_servers:
        return
    servers = nomad.servers
    zones = servers.zones or config.gcp.zones
    at = ("nomad", "servers", "zones") if servers.zones else ("gcp", "zones")
    for i, zone in enumerate(servers.zones or ()):
        if not zone.startswith(config.gcp.region + "-"):
            yield (("nomad", "servers", "zones", i), f"zone {zone!r} is not in region {config.gcp.region!r}; use e.g. '{config.gcp.region}-c'")
    distinct = sorted(set(zones))
    if len(distinct) < 3 and servers.fewer_zones_reason is None:
        yield (at, f"the {servers.count} Nomad servers would span {len(distinct)} zone(s) ({', '.join(distinct)}): losing one zone can take"
               f" the quorum; set nomad.servers.zones to 3 zones, e.g. [{config.gcp.region}-a, {config.gcp.region}-b, {config.gcp.region}-c],"
               " or write why not in nomad.servers.fewer_zones_reason")
    scaled = [p.name for p in config.gpu_pools if p.node_count is None]
    if scaled and nomad.autoscaler is None:
        yield (("nomad", "autoscaler"), f"pools {', '.join(scaled)} autoscale, which on Nomad needs the Nomad Autoscaler and its metrics;"
               " add nomad.autoscaler.prometheus_address (a Prometheus scraping the servers' /v1/metrics?format=prometheus),"
               " or give each pool a fixed node_count")
    if not nomad.api_access.cidrs:
        yield (("nomad", "api_access"), "nobody outside the node subnet can reach the Nomad API, so the scheduler stack cannot be applied"
               " (the firewall admits only the subnet); add nomad.api_access.cidrs, e.g. [{name: corp-vpn, cidr: 198.51.100.0/24}],"
               " with the ranges of the operators' VPN and of the CI runners that plan it")


def _tenants(config: ClusterConfig) -> Iterator[Finding]:
    pools = {p.name: derive_gpu_pool(p, config) for p in config.gpu_pools}
    totals: Counter[str] = Counter()
    for t, tenant in enumerate(config.tenants):
        for pool_name, quota in sorted(tenant.gpu_quota.items()):
            path = ("tenants", t, "gpu_quota", pool_name)
            spec = pools.get(pool_name)
            if spec is None:
                yield (path, f"unknown GPU pool {pool_name!r}{did_you_mean(pool_name, pools)}; allowed: {', '.join(sorted(pools))}")
                continue
            if quota > spec.capacity_gpus:
                yield (path, f"quota {quota} exceeds pool {pool_name} capacity {spec.capacity_gpus} GPUs ({spec.max_total_nodes} nodes x"
                       f" {spec.gpus_per_node} GPUs); lower it or raise {'max_nodes' if spec.autoscaling else 'node_count'}")
            totals[pool_name] += quota
    keys: dict[str, tuple[str, str]] = {}
    for t, tenant in enumerate(config.tenants):
        for pool_name in sorted(pools):
            other = keys.setdefault(kueue_queue_key(tenant.name, pool_name), (tenant.name, pool_name))
            if other != (tenant.name, pool_name):
                yield (("tenants", t, "name"), f"tenant {tenant.name!r} on pool {pool_name!r} and tenant {other[0]!r} on pool {other[1]!r}"
                       " would share one Kueue queue address ('-' reads as '_'); rename the tenant")
    for pool_name, total in sorted(totals.items()):
        spec = pools[pool_name]
        if total > spec.capacity_gpus and not spec.overcommit:
            index = next(i for i, p in enumerate(config.gpu_pools) if p.name == pool_name)
            yield (("gpu_pools", index, "overcommit"),
                   f"tenant quotas on pool {pool_name} add up to {total} GPUs, above its capacity {spec.capacity_gpus}; lower quotas or set overcommit: true on the pool")


def _nomad_api_record(config: ClusterConfig, record: DnsRecord, path: FieldPath) -> Iterator[Finding]:
    if config.scheduler != SchedulerKind.NOMAD or config.nomad is None or config.nomad.existing_servers:
        yield ((*path, "nomad_api"), "nomad_api points at the internal load balancer of the Nomad servers this file creates;"
               " remove it, or use hostname for servers managed elsewhere")
    if record.proxied:
        yield ((*path, "proxied"), "Cloudflare cannot proxy the Nomad API's internal address; set proxied: false")


def _static_ips(config: ClusterConfig) -> Iterator[Finding]:
    """Review C11: every reserved address has something that attaches it."""
    for i, ip in enumerate(config.gcp.static_ips):
        path = ("gcp", "static_ips", i)
        if config.scheduler == SchedulerKind.NOMAD:
            yield ((*path, "name"), f"static IP {ip.name!r} would be reserved and billed with nothing to attach it to: a Nomad cluster's"
                   " API sits behind an internal load balancer; remove it, and give a DNS record nomad_api: true instead")
        elif ip.use is None:
            yield ((*path, "use"), f"static IP {ip.name!r} needs use: ingress (global address, GKE Ingress), load_balancer"
                   " (regional, an L4 LoadBalancer Service) or regional_gateway (regional Gateway); add the one that attaches it")


def _dns(config: ClusterConfig) -> Iterator[Finding]:
    if config.dns is None:
        return
    ips = {ip.name for ip in config.gcp.static_ips}
    names: Counter[str] = Counter(r.name for r in config.dns.records)
    addresses: dict[str, str] = {}
    for r, record in enumerate(config.dns.records):
        path = ("dns", "records", r)
        if sum((record.static_ip is not None, record.hostname is not None, record.nomad_api)) != 1:
            yield ((*path, "name"), f"record {record.name!r} needs exactly one of static_ip (A record), hostname (CNAME)"
                   " or nomad_api: true (A record to the Nomad API's internal address); keep one of them")
        if record.nomad_api:
            yield from _nomad_api_record(config, record, path)
        if record.static_ip is not None and record.static_ip not in ips:
            allowed = ", ".join(sorted(ips)) or "none declared under gcp.static_ips"
            yield ((*path, "static_ip"), f"unknown static IP {record.static_ip!r}{did_you_mean(record.static_ip, ips)}; allowed: {allowed};"
                   " pick one of those or declare it under gcp.static_ips")
        if record.proxied and record.ttl != 1:
            yield ((*path, "ttl"), f"proxied records have an automatic TTL; set ttl: 1 or proxied: false (got {record.ttl})")
        if not record.proxied and 1 < record.ttl < 60:
            yield ((*path, "ttl"), f"TTL {record.ttl} is below Cloudflare's minimum 60; use 1 (auto) or 60..86400")
        zone = config.dns.zone_name
        if record.name == zone or record.name.endswith("." + zone):
            relative = record.name.removesuffix(zone).rstrip(".") or "@"
            yield ((*path, "name"), f"record name {record.name!r} already ends in the zone {zone!r}; write it relative to the zone: {relative!r}")
        if record.hostname is not None and not HOSTNAME.match(record.hostname):
            yield ((*path, "hostname"), f"{record.hostname!r} is not a hostname a CNAME can point at; write a name like 'app.example.com'"
                   " (no scheme, port or IP address; use static_ip for an address of this cluster)")
        if names[record.name] > 1:
            yield ((*path, "name"), f"duplicate DNS record {record.name!r}; each name appears once")
        address = dns_record_address(record.name)
        other = addresses.setdefault(address, record.name)
        if other != record.name:
            yield ((*path, "name"), f"records {record.name!r} and {other!r} both become the Terraform address {address}"
                   " ('.' and '-' read as '_', '@' as apex, '*' as wildcard); rename one")
