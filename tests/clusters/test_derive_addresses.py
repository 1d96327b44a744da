"""clusters.derive.addresses: the stable names other systems key on, pure functions of the cluster file."""

from __future__ import annotations

import pytest

import clusters
from clusters.derive.addresses import dns_record_address, grant_address, iam_role_key, tfc_workspace
from tests.conftest import load_fleet


@pytest.fixture(scope="module")
def by_name():
    return {c.name: c for c in load_fleet()}


def test_dns_record_addresses_spell_out_apex_and_wildcard():
    assert dns_record_address("@") == "dns_apex"
    assert dns_record_address("*.prod") == dns_record_address("wildcard.prod") == "dns_wildcard_prod"
    assert dns_record_address("tensorboard-prod") == dns_record_address("tensorboard.prod") == "dns_tensorboard_prod"


def test_grant_address_keeps_the_members_domain():
    assert grant_address("roles/container.developer", "group:ml-platform@example.com") == "grant_container_developer_group_ml_platform_example_com"
    assert grant_address("roles/x.y", "group:ml@a.example.com") != grant_address("roles/x.y", "group:ml@b.example.com")
    assert iam_role_key("projects/p/roles/custom.role") == "custom_role"


def test_tfc_workspace_derives_from_the_stack_name(by_name):
    config = by_name["prod-nomad"]
    assert tfc_workspace(config, "prod-nomad") == "gpufleet-prod-nomad"
    assert tfc_workspace(config, "prod-nomad-scheduler") == "gpufleet-prod-nomad-scheduler"
    named = config.model_copy(update={"state": config.state.model_copy(update={"workspace": "nomad-eu"})})
    assert tfc_workspace(named, "prod-nomad") == "nomad-eu"
    assert tfc_workspace(named, "prod-nomad-scheduler") == "nomad-eu-scheduler"
