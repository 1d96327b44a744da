"""The rendered Nomad agent config is a pure function: parsed back with pyhcl (HCL1, as Nomad reads it).

Field names are checked against Nomad's own config structs (``tls`` keys: nomad/structs/config/tls.go
at v1.10.5, tags ``hcl:"http"``, ``"rpc"``, ``"ca_file"``, ...; agent keys: command/agent/config.go)."""

from __future__ import annotations

import dataclasses
import re
import subprocess

import hcl
import pytest

from clusters.derive.nomad import NOMAD_GOSSIP_FILE, NomadRole, derive_nomad_secrets, nomad_secrets_for
from clusters.derive.pools import derive_gpu_pools
from constructs_lib.nomad_agent_config import (
    CONFIG_PATH, NVIDIA_PLUGIN, AgentJoin, render_client_config, render_server_config, render_startup_script,
)

# The keys of Nomad's TLSConfig struct (nomad/structs/config/tls.go, tag v1.10.5): hcl tags.
NOMAD_TLS_KEYS = {"http", "rpc", "verify_server_hostname", "ca_file", "cert_file", "key_file", "rpc_upgrade_mode",
                  "verify_https_client", "tls_cipher_suites", "tls_min_version"}


@pytest.fixture(scope="module")
def nomad_config(example_configs):
    return {c.name: c for c in example_configs}["prod-nomad"]


@pytest.fixture(scope="module")
def a100(nomad_config):
    return {s.name: s for s in derive_gpu_pools(nomad_config)}["a100"]


AUTO_JOIN = AgentJoin.for_cluster(project="ml-finetune-prod", server_tag="prod-nomad-nomad-server", existing_servers=())


def client(spec, join=AUTO_JOIN, datacenter="europe-west4"):
    return render_client_config(spec=spec, cluster="prod-nomad", datacenter=datacenter, region="global", join=join)


@pytest.fixture(scope="module")
def secrets(nomad_config):
    return derive_nomad_secrets(nomad_config)


def script(config, secrets, role, **extra):
    return render_startup_script(agent_config=config, gpu=role == NomadRole.CLIENT, project="ml-finetune-prod",
                                 secrets=nomad_secrets_for(secrets, role), **extra)


def test_client_node_class_and_node_pool_are_the_pool_name(a100):
    parsed = hcl.loads(client(a100))
    assert parsed["client"]["enabled"] is True
    assert parsed["client"]["node_class"] == "a100"
    assert parsed["client"]["node_pool"] == "a100"
    assert parsed["datacenter"] == "europe-west4" and parsed["region"] == "global"
    assert "vault" not in parsed, "no job uses Nomad's Vault integration (workload identity on >= 1.10)"
    assert parsed["acl"] == {"enabled": True}
    assert parsed["plugin"][NVIDIA_PLUGIN]["config"]["enabled"] is True


def test_client_meta_describes_the_accelerator(a100):
    meta = hcl.loads(client(a100))["client"]["meta"]
    assert meta["accelerator"] == "nvidia-tesla-a100"
    assert meta["gpus_per_node"] == "2"
    assert meta["gpu_memory_gib"] == "40"
    assert hcl.loads(client(a100))["client"]["reserved"] == {"cpu": 1000, "memory": 2048, "disk": 10240}
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


def test_every_agent_requires_mutual_tls_on_http_and_rpc(a100):
    for text in (client(a100), render_server_config(count=3, datacenter="dc1", region="global", join=AUTO_JOIN)):
        tls = hcl.loads(text)["tls"]
        assert set(tls) <= NOMAD_TLS_KEYS, set(tls) - NOMAD_TLS_KEYS
        assert tls["http"] is tls["rpc"] is tls["verify_server_hostname"] is tls["verify_https_client"] is True
        assert (tls["ca_file"], tls["cert_file"], tls["key_file"]) == ("/etc/nomad.d/tls/ca.pem", "/etc/nomad.d/tls/agent.pem", "/etc/nomad.d/tls/agent-key.pem")
        assert "rpc_upgrade_mode" not in tls, "upgrade mode accepts plaintext RPC"


def test_server_config_expects_the_whole_group_before_electing(a100):
    parsed = hcl.loads(render_server_config(count=3, datacenter="dc1", region="global", join=AUTO_JOIN))
    assert parsed["server"]["enabled"] is True and parsed["server"]["bootstrap_expect"] == 3
    assert parsed["client"] == {"enabled": False}


def test_startup_script_installs_the_driver_and_writes_the_config(a100, secrets):
    config = client(a100)
    text = script(config, secrets, NomadRole.CLIENT)
    assert text.startswith("#!/bin/bash\n")
    assert "cuda_installer.pyz install_driver" in text and "if ! nvidia-smi" in text
    assert "if ! command -v docker" in text, "Docker is installed on its own condition"
    assert f"releases.hashicorp.com/{NVIDIA_PLUGIN}/" in text
    assert f"cat > {CONFIG_PATH} <<'GPUFLEET_NOMAD_CONFIG'\n{config}GPUFLEET_NOMAD_CONFIG" in text
    assert "nvidia" not in script("x = 1\n", secrets, NomadRole.SERVER)


def test_agents_fetch_their_own_tls_material_and_never_carry_it(a100, secrets):
    client_script = script(client(a100), secrets, NomadRole.CLIENT)
    server_script = script(render_server_config(count=3, datacenter="dc1", region="global", join=AUTO_JOIN), secrets, NomadRole.SERVER)
    fetched = lambda text: re.findall(r"^gpufleet_secret (\S+) (\S+)$", text, re.M)  # noqa: E731
    assert fetched(client_script) == [("prod-nomad-nomad-ca-cert", "/etc/nomad.d/tls/ca.pem"),
                                      ("prod-nomad-nomad-client-cert", "/etc/nomad.d/tls/agent.pem"),
                                      ("prod-nomad-nomad-client-key", "/etc/nomad.d/tls/agent-key.pem")]
    assert [s for s, _ in fetched(server_script)] == ["prod-nomad-nomad-ca-cert", "prod-nomad-nomad-server-cert",
                                                      "prod-nomad-nomad-server-key", "prod-nomad-nomad-gossip-key",
                                                      "prod-nomad-nomad-autoscaler-cert", "prod-nomad-nomad-autoscaler-key",
                                                      "prod-nomad-nomad-prometheus-ca"]
    assert "gossip" not in client_script and "server-key" not in client_script, "clients run tenant code: no server secrets"
    assert f"> {NOMAD_GOSSIP_FILE}" in server_script and "encrypt" not in render_server_config(
        count=3, datacenter="dc1", region="global", join=AUTO_JOIN), "the gossip key is written at boot, never rendered"
    assert "iptables -C DOCKER-USER -d 169.254.169.254/32 -j REJECT" in client_script, "tasks cannot borrow the VM's identity"
    server = script("x = 1\n", secrets, NomadRole.SERVER, data_device="nomad-data")
    assert server.count("mkfs.ext4") == 1
    assert "LABEL=nomad-data /opt/nomad/data ext4 discard,defaults,nofail 0 2" in server, "mounted at boot, before Nomad starts"
    assert "RequiresMountsFor=/opt/nomad/data" in server, "Nomad never starts on an empty data dir"
    assert server.index("RequiresMountsFor") < server.index("systemctl restart nomad")
    as_user = script("x = 1\n", secrets, NomadRole.SERVER, run_as="nomad")
    assert "User=nomad" in as_user and "chown -R nomad:nomad /etc/nomad.d /opt/nomad/data" in as_user
    assert as_user.index("gpufleet-user.conf") < as_user.index("systemctl restart nomad")
    assert "User=nomad" not in script(client(a100), secrets, NomadRole.CLIENT), "clients need root (docker, devices)"


def test_boot_script_runs_under_bash_syntax_check(a100, secrets, tmp_path):
    for text in (script(client(a100), secrets, NomadRole.CLIENT),
                 script(render_server_config(count=3, datacenter="dc1", region="global", join=AUTO_JOIN), secrets, NomadRole.SERVER,
                        data_device="nomad-data")):
        path = tmp_path / "boot.sh"
        path.write_text(text)
        result = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stderr


def test_gossip_step_refuses_a_key_that_is_not_base64(tmp_path):
    """Run the gossip step for real: a secret with a quote would otherwise inject HCL."""
    from constructs_lib import nomad_agent_config as agent

    for key, ok in (("4YwLQm6ZMwYgfldNBT5P76tAWMdcBmu+FPYRvCxvsHc=", True), ('x" } acl { enabled = false', False)):
        target = tmp_path / "gossip.hcl"
        (tmp_path / "gossip.hcl.key").write_text(key + "\n")
        step = agent._GOSSIP.replace(NOMAD_GOSSIP_FILE, str(target))
        result = subprocess.run(["bash", "-c", "set -euo pipefail\n" + step], capture_output=True, text=True, check=False)
        assert (result.returncode == 0) is ok, result.stderr
        if ok:
            assert hcl.loads(target.read_text()) == {"server": {"encrypt": key}}
        assert not (tmp_path / "gossip.hcl.key").exists(), "the raw key file is removed either way"


def test_fails_when_a_value_would_become_terraform_interpolation(a100, secrets):
    with pytest.raises(ValueError, match=r"contains '\$\{', which Terraform would interpolate"):
        client(a100, datacenter="${var.dc}")
    with pytest.raises(ValueError, match=r"'%\{'"):
        script('x = "%{ if }"\n', secrets, NomadRole.SERVER)
