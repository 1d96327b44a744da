"""Cloudflare records: A to the named static IP's address, CNAME to the hostname; no token in the JSON."""

from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="module")
def records(stack_json):
    return stack_json("prod-gke")["resource"]["cloudflare_dns_record"]


def test_a_record_points_at_the_named_static_ip(records):
    a = records["dns_tensorboard_prod"]
    assert (a["type"], a["name"], a["content"]) == ("A", "tensorboard.prod.example.com", "${google_compute_global_address.ip_ingress.address}")
    assert a["zone_id"] == "0123456789abcdef0123456789abcdef"
    assert (a["proxied"], a["ttl"]) == (False, 1)
    assert a["comment"] == "gpufleet: clusters/prod-gke.yaml" and len("gpufleet: clusters/.yaml") + 40 <= 100


def test_cname_points_at_the_hostname_with_its_ttl(records):
    c = records["dns_dashboards_prod"]
    assert (c["type"], c["name"], c["content"], c["ttl"]) == ("CNAME", "dashboards.prod.example.com", "tensorboard.prod.example.com", 300)


def test_nomad_api_name_resolves_inside_the_vpc_only_and_never_in_the_public_zone(stack_json):
    """The internal load balancer's private address is not published in public Cloudflare DNS: a
    Cloud DNS private zone of exactly that name, visible to the cluster's VPC, holds it."""
    resources = stack_json("prod-nomad")["resource"]
    public = resources.get("cloudflare_dns_record", {})
    assert not [r for r in public.values() if "forwarding_rule" in r["content"]], "no private address in public DNS"
    (zone,) = resources["google_dns_managed_zone"].values()
    assert (zone["dns_name"], zone["visibility"]) == ("nomad.prod.example.com.", "private"), "the one name, not the whole domain"
    assert zone["private_visibility_config"]["networks"] == [{"network_url": "${google_compute_network.vpc.id}"}]
    (record,) = resources["google_dns_record_set"].values()
    assert (record["name"], record["type"], record["rrdatas"]) == ("nomad.prod.example.com.", "A", ["${google_compute_forwarding_rule.nomad_api.ip_address}"])
    assert record["managed_zone"] == "${google_dns_managed_zone.%s.name}" % next(iter(resources["google_dns_managed_zone"]))
    assert "google_compute_address" not in resources, "no external address reserved for nothing"
    dev = stack_json("dev-gke")
    assert "cloudflare_dns_record" not in dev["resource"] and "cloudflare" not in dev["provider"]


@pytest.mark.parametrize("stack", ["prod-gke", "prod-nomad"])
def test_cloudflare_provider_carries_no_credentials(stack_json, stack):
    assert stack_json(stack)["provider"]["cloudflare"] == [{}]
    text = json.dumps(stack_json(stack))
    assert "api_token" not in text and "api_key" not in text
