"""Nomad agent configuration and boot script for GCE VMs, rendered as pure functions of the specs.

Nothing here knows cdktf: tests parse the rendered HCL with pyhcl (the HCL1 dialect Nomad's
agent config parser reads) and check the fields a job depends on, ``node_class`` and
``node_pool`` above all, because ``jobs/`` constrains placement on ``${node.class}``.

Every agent talks mTLS (HTTP and RPC, ``verify_server_hostname``, ``verify_https_client``)
and servers encrypt gossip, as Nomad's security model requires (``tls`` block:
nomad/structs/config/tls.go; gossip: ``server.encrypt``, command/agent/config.go, v1.10.5).
The configs only name file paths: the boot script fetches the CA, the agent's certificate and
key, and (servers) the gossip key from Secret Manager with the VM's own service account, so no
key is in the rendered text, the synthesized JSON or Terraform state.

The boot script goes into ``metadata_startup_script``, a Terraform string: ``${`` and ``%{``
would start Terraform interpolation, so the renderers refuse them instead of escaping.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from clusters.derive.nomad import NOMAD_GOSSIP_FILE, NOMAD_TLS_DIR, NomadSecretSpec
from clusters.derive.pools import GpuPoolSpec

NOMAD_VERSION = "1.10.5"
NVIDIA_PLUGIN = "nomad-device-nvidia"
NVIDIA_PLUGIN_VERSION = "1.1.0"
CONFIG_PATH = "/etc/nomad.d/nomad.hcl"
DATA_DIR = "/opt/nomad/data"
PLUGIN_DIR = "/opt/nomad/plugins"
HTTP_PORT = 4646
CA_FILE = f"{NOMAD_TLS_DIR}/ca.pem"
CERT_FILE = f"{NOMAD_TLS_DIR}/agent.pem"
KEY_FILE = f"{NOMAD_TLS_DIR}/agent-key.pem"
SECRET_MANAGER = "https://secretmanager.googleapis.com/v1"
METADATA_TOKEN = "http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/token"
# Google's documented driver installer for GCE GPU VMs; it reboots once, and the startup
# script runs again on every boot, so the "nvidia-smi works" check makes it converge.
RELEASES = "https://releases.hashicorp.com"
# HashiCorp's release signing key (hashicorp.com/security; the key HashiCorp's own Vault and Consul
# images verify downloads with), fetched at boot and accepted only with this primary fingerprint.
HASHICORP_KEY_URL = "https://www.hashicorp.com/.well-known/pgp-key.txt"
HASHICORP_KEY_FINGERPRINT = "C874011F0AB405110D02105534365D9472D7468F"
CUDA_INSTALLER = "https://storage.googleapis.com/compute-gpu-installation-us/installer/latest/cuda_installer.pyz"
HCL = Mapping[str, object]
CLIENT_RESERVED = {"cpu": 1000, "memory": 2048, "disk": 10240}


@dataclass(frozen=True)
class AgentJoin:
    """How an agent finds the servers: explicit addresses, or GCE cloud auto-join by network tag."""

    retry_join: tuple[str, ...]

    @staticmethod
    def for_cluster(*, project: str, server_tag: str, existing_servers: Sequence[str]) -> AgentJoin:
        if existing_servers:
            return AgentJoin(tuple(existing_servers))
        return AgentJoin((f"provider=gce project_name={project} tag_value={server_tag}",))


def _value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"cannot render {value!r} as HCL")


def render_hcl(body: HCL, indent: int = 0) -> str:
    """Mappings become blocks (a key like ``plugin "x"`` carries its label); other values attributes."""
    pad = "  " * indent
    lines: list[str] = []
    for key, value in body.items():
        if isinstance(value, Mapping):
            lines.append(f"{pad}{key} {{")
            lines.append(render_hcl(value, indent + 1))
            lines.append(f"{pad}}}")
        else:
            lines.append(f"{pad}{key} = {_value(value)}")
    return "\n".join(line for line in lines if line)


def tls_block() -> dict[str, object]:
    """mTLS everywhere: servers require a CA-signed certificate on RPC (nomad/server.go verifies
    incoming), so a VM without the client certificate cannot register as a client; the HTTP API
    requires one too (``verify_https_client``), and hostnames are checked so a client
    certificate cannot act as a server (``server.<region>.nomad``)."""
    return {
        "http": True,
        "rpc": True,
        "ca_file": CA_FILE,
        "cert_file": CERT_FILE,
        "key_file": KEY_FILE,
        "verify_server_hostname": True,
        "verify_https_client": True,
        "tls_min_version": "tls12",
    }


def _common(*, datacenter: str, region: str) -> dict[str, object]:
    """No ``vault`` block: on Nomad >= 1.10 it means workload identity, which no gpufleet job uses
    (jobs log in with AppRole through gpufleet-exec)."""
    return {
        "region": region,
        "datacenter": datacenter,
        "data_dir": DATA_DIR,
        "bind_addr": "0.0.0.0",
        "acl": {"enabled": True},
        "tls": tls_block(),
        "telemetry": {"prometheus_metrics": True, "publish_node_metrics": True, "publish_allocation_metrics": True},
    }


def pool_meta(spec: GpuPoolSpec, cluster: str) -> dict[str, str]:
    """What a job author or the node pool can read about the hardware; Nomad meta values are strings."""
    return {
        "accelerator": spec.accelerator,
        "gpu_model": spec.gpu_model,
        "gpu_memory_gib": str(spec.gpu_memory_gib),
        "gpu_memory_mib": str(spec.nvml.memory_mib),
        "gpu_nvml_name": spec.nvml.nvml_name,
        "gpus_per_node": str(spec.gpus_per_node),
        "machine_type": spec.machine_type,
        "gpufleet_cluster": cluster,
        "gpufleet_pool": spec.name,
    }


def render_client_config(*, spec: GpuPoolSpec, cluster: str, datacenter: str, region: str, join: AgentJoin,
                         host_volumes: Mapping[str, Mapping[str, object]] | None = None) -> str:
    """The client agent of one GPU pool: its node class and node pool are the pool's name; ``host_volumes``
    are the client's ``host_volume "<name>"`` blocks (the local SSD volume of A3/A4 nodes)."""
    body = _common(datacenter=datacenter, region=region)
    body["plugin_dir"] = PLUGIN_DIR
    body["client"] = {
        "enabled": True,
        "node_class": spec.name,
        "node_pool": spec.name,
        # Kept back from jobs for the OS, Docker and the agent (command/agent/config.go Resources:
        # cpu MHz, memory MB, disk MB), so a fine-tune cannot starve the node's own services.
        "reserved": dict(CLIENT_RESERVED),
        "server_join": {"retry_join": list(join.retry_join), "retry_interval": "15s"},
        "meta": pool_meta(spec, cluster),
        **(host_volumes or {}),
    }
    body[f'plugin "{NVIDIA_PLUGIN}"'] = {"config": {"enabled": True, "fingerprint_period": "1m"}}
    body['plugin "docker"'] = {"config": {"allow_privileged": False}}
    return _checked(render_hcl(body) + "\n")


def render_server_config(*, count: int, datacenter: str, region: str, join: AgentJoin) -> str:
    """A server agent; ``bootstrap_expect`` equals the group size so the first election waits for quorum.

    The gossip key is not here: the boot script writes it to a second file of the config
    directory (``server { encrypt = ... }``), which Nomad merges with this one."""
    body = _common(datacenter=datacenter, region=region)
    body["server"] = {"enabled": True, "bootstrap_expect": count,
                      "server_join": {"retry_join": list(join.retry_join), "retry_interval": "15s"}}
    body["client"] = {"enabled": False}
    body["ui"] = {"enabled": True}
    return _checked(render_hcl(body) + "\n")


_INSTALL_NOMAD = f"""if ! command -v nomad >/dev/null 2>&1; then
  apt-get update -q && apt-get install -yq curl gnupg lsb-release unzip
  curl -fsSL https://apt.releases.hashicorp.com/gpg | gpg --dearmor --yes -o /usr/share/keyrings/hashicorp.gpg
  echo "deb [signed-by=/usr/share/keyrings/hashicorp.gpg] https://apt.releases.hashicorp.com $(lsb_release -cs) main" \\
    > /etc/apt/sources.list.d/hashicorp.list
  apt-get update -q && apt-get install -yq nomad={NOMAD_VERSION}-1
fi"""

_INSTALL_GPU = f"""if ! nvidia-smi >/dev/null 2>&1; then
  curl -fsSL -o /opt/cuda_installer.pyz {CUDA_INSTALLER}
  python3 /opt/cuda_installer.pyz install_driver --installation-mode=repo --installation-branch=prod
fi
# Docker on its own condition: an image may ship the container toolkit without Docker.
if ! command -v docker >/dev/null 2>&1; then
  apt-get update -q && apt-get install -yq docker.io
fi
if ! command -v nvidia-ctk >/dev/null 2>&1; then
  curl -fsSL https://nvidia.github.io/libnvidia-container/gpgkey | gpg --dearmor --yes -o /usr/share/keyrings/nvidia-container-toolkit.gpg
  curl -fsSL https://nvidia.github.io/libnvidia-container/stable/deb/nvidia-container-toolkit.list \\
    | sed 's#deb https://#deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit.gpg] https://#' \\
    > /etc/apt/sources.list.d/nvidia-container-toolkit.list
  apt-get update -q && apt-get install -yq nvidia-container-toolkit
fi
if ! grep -q '"nvidia"' /etc/docker/daemon.json 2>/dev/null; then
  nvidia-ctk runtime configure --runtime=docker && systemctl restart docker
fi
# Task containers must not reach the metadata server: it would hand them this VM's service
# account token, which reads the client certificate and key from Secret Manager.
iptables -C DOCKER-USER -d 169.254.169.254/32 -j REJECT 2>/dev/null || iptables -I DOCKER-USER -d 169.254.169.254/32 -j REJECT
mkdir -p {PLUGIN_DIR}
"""


def render_plugin_install(*, plugin_dir: str = PLUGIN_DIR, base_url: str = RELEASES, key_url: str = HASHICORP_KEY_URL,
                          fingerprint: str = HASHICORP_KEY_FINGERPRINT) -> str:
    """Install the NVIDIA device plugin only after its zip matches HashiCorp's SHA256SUMS and that
    file carries a good signature by HashiCorp's release key, identified by its pinned primary
    fingerprint (gpg's VALIDSIG status line names it), as HashiCorp documents release verification.
    Any failure stops the boot script before Nomad starts: no unverified binary runs as root."""
    name = f"{NVIDIA_PLUGIN}_{NVIDIA_PLUGIN_VERSION}"
    return f"""if [ ! -x {plugin_dir}/{NVIDIA_PLUGIN} ]; then
  dl=$(mktemp -d)
  mkdir -m 700 "$dl/gnupg"
  curl -fsSL -o "$dl/key.asc" {key_url}
  for f in {name}_SHA256SUMS {name}_SHA256SUMS.sig {name}_linux_amd64.zip; do
    curl -fsSL -o "$dl/$f" {base_url}/{NVIDIA_PLUGIN}/{NVIDIA_PLUGIN_VERSION}/$f
  done
  gpg --batch --quiet --homedir "$dl/gnupg" --import "$dl/key.asc"
  if ! gpg --batch --homedir "$dl/gnupg" --status-fd 1 --verify "$dl/{name}_SHA256SUMS.sig" "$dl/{name}_SHA256SUMS" 2>/dev/null \\
      | grep -E '^\\[GNUPG:\\] VALIDSIG .* {fingerprint}$' >/dev/null; then
    echo "gpufleet: {name}_SHA256SUMS is not signed by HashiCorp's release key {fingerprint}" >&2; exit 1
  fi
  if ! (cd "$dl" && grep ' {name}_linux_amd64.zip$' {name}_SHA256SUMS | sha256sum --check --strict --quiet -); then
    echo "gpufleet: {name}_linux_amd64.zip does not match HashiCorp's signed SHA256SUMS" >&2; exit 1
  fi
  unzip -o "$dl/{name}_linux_amd64.zip" -d {plugin_dir}
  rm -rf "$dl"
fi"""


_FETCH_SECRET = f"""# gpufleet_secret <secret id> <file>: the latest version from Secret Manager, read with this VM's
# service account; waits (and says so) until the Nomad bootstrap has added a version.
gpufleet_secret() {{
  local url="{SECRET_MANAGER}/projects/$GPUFLEET_PROJECT/secrets/$1/versions/latest:access"
  until token=$(curl -fsS -H 'Metadata-Flavor: Google' {METADATA_TOKEN} \\
          | python3 -c 'import json,sys; print(json.load(sys.stdin)["access_token"])') \\
      && curl -fsS -H "Authorization: Bearer $token" "$url" \\
          | python3 -c 'import base64,json,sys; sys.stdout.buffer.write(base64.b64decode(json.load(sys.stdin)["payload"]["data"]))' > "$2.tmp"; do
    echo "gpufleet: waiting for secret $1 in Secret Manager (run the Nomad bootstrap, see README)" >&2
    sleep 30
  done
  mv "$2.tmp" "$2"
}}"""

# The gossip key is checked to be base64 before it goes into HCL, so a bad secret cannot inject config.
_GOSSIP = f"""key=$(tr -d '\\n' < {NOMAD_GOSSIP_FILE}.key)
rm -f {NOMAD_GOSSIP_FILE}.key
if ! printf '%s' "$key" | grep -Eq '^[A-Za-z0-9+/]{{22,}}={{0,2}}$'; then echo "gpufleet: the gossip key secret is not base64" >&2; exit 1; fi
printf 'server {{\\n  encrypt = "%s"\\n}}\\n' "$key" > {NOMAD_GOSSIP_FILE}
unset key"""


def _secret_steps(project: str, secrets: tuple[NomadSecretSpec, ...]) -> str:
    lines = [f"GPUFLEET_PROJECT={project}", _FETCH_SECRET, "umask 077", f"mkdir -p {NOMAD_TLS_DIR}"]
    for secret in secrets:
        if not secret.path:
            continue  # not a file of the agent (the autoscaler token is written by its own step)
        target = f"{secret.path}.key" if secret.path == NOMAD_GOSSIP_FILE else secret.path
        lines.append(f"gpufleet_secret {secret.secret_id} {target}")
        if secret.path == NOMAD_GOSSIP_FILE:
            lines.append(_GOSSIP)
    lines.append("umask 022")
    return "\n".join(lines)


def _mount_data(device: str) -> str:
    """Format the stateful data disk once (never again: it holds Raft state) and mount it as the data dir.

    On a reboot systemd starts Nomad before this script runs, so the mount is also in fstab and
    Nomad requires it: a server must never start on an empty data dir and rejoin as a blank peer.
    """
    dev = f"/dev/disk/by-id/google-{device}"
    return (f"mkdir -p {DATA_DIR}\n"
            f"blkid {dev} >/dev/null 2>&1 || mkfs.ext4 -q -L {device} {dev}\n"
            f"grep -q '^LABEL={device} ' /etc/fstab || echo 'LABEL={device} {DATA_DIR} ext4 discard,defaults,nofail 0 2' >> /etc/fstab\n"
            f"mountpoint -q {DATA_DIR} || mount -o discard,defaults {dev} {DATA_DIR}\n"
            "mkdir -p /etc/systemd/system/nomad.service.d\n"
            f"printf '[Unit]\\nRequiresMountsFor={DATA_DIR}\\n' > /etc/systemd/system/nomad.service.d/gpufleet-data.conf\n"
            "systemctl daemon-reload")


def _run_as(user: str) -> str:
    """Servers run as the package's unprivileged user (its unit file says they should); clients stay
    root, which the docker driver and device plugins need."""
    return (f"chown -R {user}:{user} /etc/nomad.d {DATA_DIR}\n"
            "mkdir -p /etc/systemd/system/nomad.service.d\n"
            f"printf '[Service]\\nUser={user}\\nGroup={user}\\n' > /etc/systemd/system/nomad.service.d/gpufleet-user.conf\n"
            "systemctl daemon-reload")


def render_startup_script(*, agent_config: str, gpu: bool, project: str, secrets: tuple[NomadSecretSpec, ...],
                          data_device: str | None = None, extra: str | None = None, run_as: str | None = None,
                          certificates: str | None = None, gpu_setup: str | None = None) -> str:
    """Idempotent boot script: GPU driver and container toolkit (GPU nodes), Nomad, TLS material
    and gossip key from Secret Manager (or, with ``certificates``, the step that issues the agent's
    certificate from the cluster's PKI role: constructs_lib.nomad_cert_renewal), config, restart.

    ``gpu_setup``: the GPU node's own steps after the driver (Fabric Manager, local SSD, telemetry and
    health: constructs_lib.nomad_gpu_node), all before Nomad starts.

    It runs on every boot, so each step checks before it installs; the config is rewritten
    each time, so a new instance template version is the only way configuration changes.
    """
    if not secrets and certificates is None:
        raise ValueError("a Nomad agent needs its TLS material (CA, certificate, key) from secrets or a PKI step; neither was given")
    steps = ["#!/bin/bash", "# Rendered by gpufleet; edit the cluster file, not this script.", "set -euo pipefail", _INSTALL_NOMAD]
    if gpu:
        steps += [_INSTALL_GPU, render_plugin_install()]
    if gpu_setup is not None:
        steps.append(gpu_setup)
    steps.append(_secret_steps(project, secrets))
    if certificates is not None:
        steps.append(certificates)
    if data_device is not None:
        steps.append(_mount_data(data_device))
    steps.append(f"mkdir -p {DATA_DIR} /etc/nomad.d\ncat > {CONFIG_PATH} <<'GPUFLEET_NOMAD_CONFIG'\n{agent_config}GPUFLEET_NOMAD_CONFIG")
    if run_as is not None:
        steps.append(_run_as(run_as))
    steps.append("systemctl enable nomad\nsystemctl restart nomad")
    if extra is not None:
        steps.append(extra)
    return _checked("\n".join(steps) + "\n")


def _checked(text: str) -> str:
    for marker in ("${", "%{"):
        if marker in text:
            raise ValueError(f"rendered Nomad text contains {marker!r}, which Terraform would interpolate; remove it from the cluster file")
    return text
