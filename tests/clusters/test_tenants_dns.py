"""Tenants, GPU quotas and DNS records: bad input is one line with file, line, field and fix."""

from __future__ import annotations


import pytest

import clusters
from clusters.derive.tenants import CONTROLLER_KSA, WORKLOAD_KSA, derive_tenants, tenant_account_id
from clusters.errors import ConfigError
from tests.clusters.conftest import assert_rejected


def tenant(data, i=0):
    return data["tenants"][i]


def record(data, i=0):
    return data["dns"]["records"][i]


def long_tenant(d):
    tenant(d)["name"] = "research-and-development-x"


CASES = [
    # (id, base, mutate, field path in the message, fragment of the fix)
    ("quota-unknown-pool", "prod-gke", lambda d: tenant(d)["gpu_quota"].update({"h10": 8}), "tenants[0].gpu_quota.h10",
     "unknown GPU pool 'h10' (did you mean 'h100'?); allowed: h100, l4-spot"),
    ("quota-above-capacity", "prod-gke", lambda d: tenant(d)["gpu_quota"].update({"h100": 40}), "tenants[0].gpu_quota.h100",
     "exceeds pool h100 capacity 32 GPUs"),
    ("quotas-sum-above-capacity", "prod-gke", lambda d: tenant(d, 1)["gpu_quota"].update({"h100": 16}), "gpu_pools[0].overcommit",
     "add up to 40 GPUs, above its capacity 32; lower quotas or set overcommit: true"),
    ("negative-quota", "prod-gke", lambda d: tenant(d)["gpu_quota"].update({"h100": -1}), "tenants[0].gpu_quota.h100",
     "too small; allowed: >= 0; raise the value"),
    ("duplicate-tenant", "prod-gke", lambda d: tenant(d, 1).update(name="research"), "tenants[1].name", "duplicate tenant name 'research'"),
    ("tenant-not-dns", "prod-gke", lambda d: tenant(d).update(name="Research_Team"), "tenants[0].name", "not DNS-safe"),
    ("tenant-reserved-namespace", "prod-gke", lambda d: tenant(d).update(name="kube-system"), "tenants[0].name",
     "a namespace the platform owns"),
    ("tenant-default-namespace", "prod-nomad", lambda d: tenant(d).update(name="default"), "tenants[0].name", "pick another name"),
    ("tenant-user-outside-dev", "prod-gke", lambda d: tenant(d).update(groups=["user:bob@example.com"]), "tenants[0].groups[0]",
     "use group:team@example.com"),
    ("tenant-bad-member", "prod-gke", lambda d: tenant(d).update(groups=["ml-research@example.com"]), "tenants[0].groups[0]",
     "write 'group:team@example.com'"),
    ("tenant-sa-id-too-long", "prod-gke", long_tenant, "tenants[0].service_account", "GCP allows 30; shorten the tenant name to 21"),
    ("tenant-sa-bad-role", "prod-gke", lambda d: tenant(d)["service_account"].update(roles=["storage.admin"]),
     "tenants[0].service_account.roles[0]", "'storage.admin'"),
    ("tenant-sa-on-nomad", "prod-nomad", lambda d: tenant(d).update(service_account={"roles": ["roles/storage.objectViewer"]}),
     "tenants[0].service_account", "Nomad jobs get credentials from Vault"),
    ("tenant-unknown-field", "prod-gke", lambda d: tenant(d).update(quota={"h100": 1}), "tenants[0].quota", "did you mean 'gpu_quota'"),
    ("dns-unknown-static-ip", "prod-gke", lambda d: record(d).update(static_ip="ingres"), "dns.records[0].static_ip",
     "unknown static IP 'ingres' (did you mean 'ingress'?); allowed: ingress"),
    ("dns-no-static-ips", "prod-gke", lambda d: d["gcp"].pop("static_ips"), "dns.records[0].static_ip", "none declared under gcp.static_ips"),
    ("dns-both-targets", "prod-gke", lambda d: record(d).update(hostname="x.example.org"), "dns.records[0].name",
     "needs exactly one of static_ip (A record), hostname (CNAME) or nomad_api: true"),
    ("static-ip-without-use", "prod-gke", lambda d: d["gcp"]["static_ips"][0].pop("use"), "gcp.static_ips[0].use",
     "needs use: ingress (global address, GKE Ingress), load_balancer (regional, an L4 LoadBalancer Service) or regional_gateway"),
    ("static-ip-unknown-use", "prod-gke", lambda d: d["gcp"]["static_ips"][0].update(use="gateway"), "gcp.static_ips[0].use", "ingress"),
    ("static-ip-on-nomad", "prod-nomad", lambda d: d["gcp"].update(static_ips=[{"name": "nomad-ui"}]), "gcp.static_ips[0].name",
     "nothing to attach it to"),
    ("nomad-api-record-on-gke", "prod-gke", lambda d: record(d, 1).pop("hostname") and record(d, 1).update(nomad_api=True, ttl=1),
     "dns.records[1].nomad_api", "use hostname for servers managed elsewhere"),
    ("nomad-api-record-proxied", "prod-nomad", lambda d: record(d).update(proxied=True), "dns.records[0].proxied",
     "cannot proxy the Nomad API's internal address"),
    ("nomad-api-record-and-static-ip", "prod-nomad", lambda d: record(d).update(hostname="nomad.example.org"), "dns.records[0].name",
     "needs exactly one of"),
    ("dns-no-target", "prod-gke", lambda d: record(d, 1).pop("hostname"), "dns.records[1].name", "needs exactly one of"),
    ("dns-proxied-with-ttl", "prod-gke", lambda d: record(d, 1).update(proxied=True), "dns.records[1].ttl",
     "proxied records have an automatic TTL; set ttl: 1"),
    ("dns-ttl-below-minimum", "prod-gke", lambda d: record(d, 1).update(ttl=30), "dns.records[1].ttl", "below Cloudflare's minimum 60"),
    ("dns-ttl-too-long", "prod-gke", lambda d: record(d, 1).update(ttl=100000), "dns.records[1].ttl", "too large; allowed: <= 86400; lower the value"),
    ("dns-duplicate-name", "prod-gke", lambda d: record(d, 1).update(name="tensorboard.prod"), "dns.records[1].name",
     "duplicate DNS record 'tensorboard.prod'"),
    ("dns-names-collide-as-addresses", "prod-gke", lambda d: record(d, 1).update(name="tensorboard-prod"), "dns.records[1].name",
     "both become the Terraform address dns_tensorboard_prod"),
    ("dns-wildcard-collides-with-a-name", "prod-gke", lambda d: d["dns"]["records"].append({"name": "*.prod", "hostname": "a.example.org"})
     or d["dns"]["records"].append({"name": "wildcard.prod", "hostname": "b.example.org"}), "dns.records[3].name",
     "both become the Terraform address dns_wildcard_prod"),
    ("dns-name-includes-zone", "prod-gke", lambda d: record(d).update(name="tensorboard.prod.example.com"), "dns.records[0].name",
     "write it relative to the zone: 'tensorboard.prod'"),
    ("dns-cname-to-ip", "prod-gke", lambda d: record(d, 1).update(hostname="203.0.113.7"), "dns.records[1].hostname",
     "use static_ip for an address of this cluster"),
    ("dns-cname-with-scheme", "prod-gke", lambda d: record(d, 1).update(hostname="https://tb.example.com"), "dns.records[1].hostname",
     "no scheme, port or IP address"),
    ("dns-bad-zone-id", "prod-gke", lambda d: d["dns"].update(zone_id="example.com"), "dns.zone_id", "not a Cloudflare zone id"),
    ("dns-bad-record-name", "prod-gke", lambda d: record(d).update(name="Tensor_Board"), "dns.records[0].name", "is not a record name relative to the zone"),
    ("nomad-compact-placement", "prod-nomad", lambda d: d["gpu_pools"][0].update(placement="COMPACT", zones=["europe-west4-a"]),
     "gpu_pools[0].placement", "GKE node-pool feature"),
    ("nomad-reservation-block", "prod-nomad", lambda d: d["gpu_pools"][0].update(reservation="a100-res/reservationBlocks/b1", zones=["europe-west4-a"]),
     "gpu_pools[0].reservation", "name the whole reservation on Nomad pools"),
    ("nomad-host-maintenance", "prod-nomad", lambda d: d["gpu_pools"][0].update(host_maintenance_interval="PERIODIC"),
     "gpu_pools[0].host_maintenance_interval", "GKE node-pool setting"),
    ("flow-log-sampling-zero", "prod-gke", lambda d: d["gcp"].update(flow_log_sampling=0), "gcp.flow_log_sampling", "allowed: > 0"),
    ("host-maintenance-unknown", "prod-gke", lambda d: d["gpu_pools"][0].update(host_maintenance_interval="WEEKLY"),
     "gpu_pools[0].host_maintenance_interval", "PERIODIC"),
    ("nomad-queued-provisioning", "prod-nomad", lambda d: d["gpu_pools"][1].update(queued_provisioning=True, spot=False, min_nodes=0),
     "gpu_pools[1].queued_provisioning", "queued provisioning (DWS) is a GKE feature"),
    ("gke-groups-without-rbac-group", "prod-gke", lambda d: d["gke"].pop("rbac_security_group"), "gke.rbac_security_group",
     "tenants research, applied bind Google groups, which GKE RBAC only matches with Google Groups for RBAC;"
     " set gke.rbac_security_group: gke-security-groups@<your domain>"),
    ("gke-groups-without-gke-section", "dev-gke", lambda d: d.pop("gke"), "gke.rbac_security_group", "tenants sandbox bind Google groups"),
    ("gke-rbac-group-wrong-name", "prod-gke", lambda d: d["gke"].update(rbac_security_group="ml-research@example.com"),
     "gke.rbac_security_group", "GKE only reads the group named 'gke-security-groups@<your Workspace domain>'"),
    ("gke-unreachable-control-plane", "dev-gke", lambda d: d["gcp"].pop("master_authorized_networks") and d["gke"].update(dns_endpoint=False),
     "gke.dns_endpoint", "CI and Terraform Cloud cannot plan the scheduler stack; set gke.dns_endpoint: true"),
    ("grant-members-share-an-address", "prod-gke", lambda d: d["iam"]["grants"][0].update(members=["group:ml-platform@example.com",
     "group:ml.platform@example.com"]), "iam.grants[0].members[1]", "would share the Terraform address grant_container_developer_group_ml_platform_example_com"),
    ("grant-member-twice", "prod-gke", lambda d: d["iam"]["grants"].append(dict(d["iam"]["grants"][0])), "iam.grants[1].members[0]",
     "already has roles/container.developer; list each member once per role"),
    ("nomad-bad-existing-server", "prod-nomad", lambda d: d["nomad"].update(existing_servers=["http://10.0.0.2:4646"]),
     "nomad.existing_servers[0]", "write 'host', 'host:4647' or a cloud auto-join string"),
]


@pytest.mark.parametrize(("base", "mutate", "field", "fix"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_fails_when_tenants_quotas_or_dns_are_wrong(write_cluster, base, mutate, field, fix):
    assert_rejected(write_cluster(base, mutate), field, fix)


def test_fails_when_quota_exceeds_capacity_points_at_the_quota_line(write_cluster):
    path = write_cluster("prod-gke", lambda d: tenant(d)["gpu_quota"].update({"h100": 40}))
    with pytest.raises(ConfigError) as err:
        clusters.load(path)
    (problem,) = [p for p in err.value.problems if p.field == "tenants[0].gpu_quota.h100"]
    assert path.read_text().splitlines()[problem.line - 1].strip().startswith("h100: 40")


def test_overcommit_allows_quotas_above_capacity(write_cluster):
    def overcommit(d):
        tenant(d, 1)["gpu_quota"]["h100"] = 16
        d["gpu_pools"][0]["overcommit"] = True

    config = clusters.load(write_cluster("prod-gke", overcommit))
    assert sum(dict(t.gpu_quota)["h100"] for t in derive_tenants(config)) == 40


def test_existing_servers_accept_hosts_ports_and_auto_join(write_cluster):
    servers = ["10.0.0.2", "nomad-1.internal:4647", "provider=gce tag_value=nomad-server"]
    def mutate(d: dict) -> None:
        d["nomad"]["existing_servers"] = servers
        d["dns"]["records"] = [{"name": "nomad.prod", "hostname": "nomad.corp.example.com"}]  # no internal LB of ours to point at
        for pool in d["gpu_pools"]:  # no autoscaler of ours on existing servers
            pool["node_count"] = pool.pop("max_nodes")
            del pool["min_nodes"]

    config = clusters.load(write_cluster("prod-nomad", mutate))
    assert config.nomad.existing_servers == tuple(servers)


def test_tenants_derive_in_name_order_with_their_identity(example_configs):
    prod = {c.name: c for c in example_configs}["prod-gke"]
    research, applied = sorted(derive_tenants(prod), key=lambda t: t.name, reverse=True)
    assert [t.name for t in derive_tenants(prod)] == ["applied", "research"]
    assert research.gpu_quota == (("h100", 24), ("l4-spot", 8)) and research.total_gpus == 32
    assert research.gcp_account_id == tenant_account_id("prod-gke", "research") == "prod-gke-research"
    assert research.gcp_roles == ("roles/storage.objectViewer",)
    assert applied.gcp_account_id is None and applied.gcp_roles == ()
    assert WORKLOAD_KSA != CONTROLLER_KSA


def test_groups_rbac_is_not_needed_when_tenants_bind_no_groups(write_cluster):
    def no_groups(d):
        d["gke"].pop("rbac_security_group")
        for t in d["tenants"]:
            t.pop("groups")

    assert clusters.load(write_cluster("prod-gke", no_groups)).gke.rbac_security_group is None


def test_grants_of_one_local_part_in_two_domains_are_two_grants(write_cluster):
    members = ["group:ml@a.example.com", "group:ml@b.example.com"]
    config = clusters.load(write_cluster("prod-gke", lambda d: d["iam"]["grants"][0].update(members=members)))
    assert config.iam.grants[0].members == tuple(members)
