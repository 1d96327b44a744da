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


def test_nomad_cluster_record_and_no_dns_without_a_dns_section(stack_json):
    nomad = stack_json("prod-nomad")["resource"]["cloudflare_dns_record"]["dns_nomad_prod"]
    assert (nomad["type"], nomad["content"]) == ("A", "${google_compute_forwarding_rule.nomad_api.ip_address}"), "review C11: the API's internal address"
    assert "google_compute_address" not in stack_json("prod-nomad")["resource"], "no external address reserved for nothing"
    dev = stack_json("dev-gke")
    assert "cloudflare_dns_record" not in dev["resource"] and "cloudflare" not in dev["provider"]


@pytest.mark.parametrize("stack", ["prod-gke", "prod-nomad"])
def test_cloudflare_provider_carries_no_credentials(stack_json, stack):
    assert stack_json(stack)["provider"]["cloudflare"] == [{}]
    text = json.dumps(stack_json(stack))
    assert "api_token" not in text and "api_key" not in text
