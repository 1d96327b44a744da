"""Nomad clusters gpufleet builds servers for: quorum through a zone loss, and an API someone can reach."""

from __future__ import annotations

import pytest

import clusters
from clusters.derive.nomad import derive_nomad_servers
from tests.clusters.conftest import assert_rejected

CASES = [
    ("two-server-zones", lambda d: d["nomad"]["servers"].update(zones=["europe-west4-a", "europe-west4-b"]), "nomad.servers.zones",
     "losing one zone can take the quorum; set nomad.servers.zones to 3 zones"),
    ("servers-default-to-the-pool-zones", lambda d: d["nomad"].pop("servers"), "gcp.zones", "or write why not in nomad.servers.fewer_zones_reason"),
    ("server-zone-outside-region", lambda d: d["nomad"]["servers"]["zones"].__setitem__(2, "us-central1-c"), "nomad.servers.zones[2]",
     "is not in region 'europe-west4'"),
    ("autoscaled-pools-without-the-autoscaler", lambda d: d["nomad"].pop("autoscaler"), "nomad.autoscaler",
     "pools a100, l4 autoscale, which on Nomad needs the Nomad Autoscaler and its metrics; add nomad.autoscaler.prometheus_address"),
    ("existing-servers-scale-nothing", lambda d: d["nomad"].update(existing_servers=["10.50.0.10"]), "gpu_pools[1].min_nodes",
     "pool l4 autoscales, but on nomad.existing_servers gpufleet runs no Nomad Autoscaler: it would stay at 0 node(s); give it a fixed node_count"),
    ("autoscaler-without-a-scrape-path", lambda d: d["nomad"]["autoscaler"].pop("scrape_cidrs"), "nomad.autoscaler.scrape_cidrs", ""),
    ("nobody-reaches-the-api", lambda d: d["nomad"].pop("api_access"), "nomad.api_access",
     "the scheduler stack cannot be applied (the firewall admits only the subnet); add nomad.api_access.cidrs"),
]


@pytest.mark.parametrize(("mutate", "field", "fix"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_fails_when_servers_lose_quorum_with_a_zone_or_the_api_is_unreachable(write_cluster, mutate, field, fix):
    assert_rejected(write_cluster("prod-nomad", mutate), field, fix)


def test_fewer_zones_are_allowed_with_a_written_reason(write_cluster):
    def two_zones(d):
        d["nomad"]["servers"] = {"zones": ["europe-west4-a", "europe-west4-b"], "fewer_zones_reason": "staging: one zone down is acceptable"}

    config = clusters.load(write_cluster("prod-nomad", two_zones))
    assert [(g.zone, g.size) for g in derive_nomad_servers(config).groups] == [("europe-west4-a", 2), ("europe-west4-b", 1)]


def test_five_servers_spread_so_no_zone_holds_a_majority(write_cluster):
    config = clusters.load(write_cluster("prod-nomad", lambda d: d["nomad"]["servers"].update(count=5)))
    spec = derive_nomad_servers(config)
    assert [g.size for g in spec.groups] == [2, 2, 1]
    assert all(g.size <= (spec.count - 1) // 2 for g in spec.groups), "any one zone lost leaves a majority"
