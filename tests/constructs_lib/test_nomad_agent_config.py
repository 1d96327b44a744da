"""The rendered Nomad agent config is a pure function: parsed back with pyhcl (HCL1, as Nomad reads it)."""

from __future__ import annotations

import dataclasses

import hcl
import pytest

from clusters.derive import derive_gpu_pools
from constructs_lib.nomad_agent_config import (
    CONFIG_PATH, NVIDIA_PLUGIN, AgentJoin, render_client_config, render_server_config, render_startup_script,
)


@pytest.fixture(scope="module")
def nomad_config(example_configs):
    return {c.name: c for c in example_configs}["prod-nomad"]


@pytest.fixture(scope="module")
def a100(nomad_config):
    return {s.name: s for s in derive_gpu_pools(nomad_config)}["a100"]


AUTO_JOIN = AgentJoin.for_cluster(project="ml-finetune-prod", server_tag="prod-nomad-nomad-server", existing_servers=())


def client(spec, join=AUTO_JOIN, vault="https://vault.example.com:8200"):
    return render_client_config(spec=spec, cluster="prod-nomad", datacenter="europe-west4", region="global", vault_addr=vault, join=join)


def test_client_node_class_and_node_pool_are_the_pool_name(a100):
    parsed = hcl.loads(client(a100))
    assert parsed["client"]["enabled"] is True
    assert parsed["client"]["node_class"] == "a100"
    assert parsed["client"]["node_pool"] == "a100"
    assert parsed["datacenter"] == "europe-west4" and parsed["region"] == "global"
    assert parsed["vault"] == {"enabled": True, "address": "https://vault.example.com:8200"}
    assert parsed["acl"] == {"enabled": True}
    assert parsed["plugin"][NVIDIA_PLUGIN]["config"]["enabled"] is True


def test_client_meta_describes_the_accelerator(a100):
    meta = hcl.loads(client(a100))["client"]["meta"]
    assert meta["accelerator"] == "nvidia-tesla-a100"
    assert meta["gpus_per_node"] == "2"
    assert meta["gpu_memory_gib"] == "40"
    assert meta["gpufleet_pool"] == "a100"


def test_client_joins_servers_by_gce_tag_or_by_the_named_servers(a100):
    auto = hcl.loads(client(a100))["client"]["server_join"]["retry_join"]
    assert auto == ["provider=gce project_name=ml-finetune-prod tag_value=prod-nomad-nomad-server"]
    existing = AgentJoin.for_cluster(project="p", server_tag="t", existing_servers=("10.0.0.2", "10.0.0.3:4647"))
    assert hcl.loads(client(a100, existing))["client"]["server_join"]["retry_join"] == ["10.0.0.2", "10.0.0.3:4647"]


def test_each_pool_renders_its_own_class(nomad_config):
    classes = {s.name: hcl.loads(client(s))["client"]["node_class"] for s in derive_gpu_pools(nomad_config)}
    assert classes == {"a100": "a100", "l4": "l4"}


def test_rendering_is_deterministic(a100):
    assert client(a100) == client(dataclasses.replace(a100))


def test_server_config_expects_the_whole_group_before_electing(a100):
    parsed = hcl.loads(render_server_config(count=3, datacenter="dc1", region="global", vault_addr="https://v:8200", join=AUTO_JOIN))
    assert parsed["server"]["enabled"] is True and parsed["server"]["bootstrap_expect"] == 3
    assert parsed["client"] == {"enabled": False}


def test_startup_script_installs_the_driver_and_writes_the_config(a100):
    config = client(a100)
    script = render_startup_script(agent_config=config, gpu=True)
    assert script.startswith("#!/bin/bash\n")
    assert "cuda_installer.pyz install_driver" in script and "if ! nvidia-smi" in script
    assert f"releases.hashicorp.com/{NVIDIA_PLUGIN}/" in script
    assert f"cat > {CONFIG_PATH} <<'GPUFLEET_NOMAD_CONFIG'\n{config}GPUFLEET_NOMAD_CONFIG" in script
    assert "nvidia" not in render_startup_script(agent_config="x = 1\n", gpu=False)


def test_fails_when_a_value_would_become_terraform_interpolation(a100):
    with pytest.raises(ValueError, match=r"contains '\$\{', which Terraform would interpolate"):
        client(a100, vault="https://${var.vault}:8200")
    with pytest.raises(ValueError, match="'%{'"):
        render_startup_script(agent_config='x = "%{ if }"\n', gpu=False)
