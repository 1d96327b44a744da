"""Nomad Autoscaler: its agent config and one ``gce-mig`` cluster-scaling policy per GPU pool.

Rendered from the cluster file (pure functions; tests parse them back and check every key
against the autoscaler's own decode structs, hashicorp/nomad-autoscaler ``agent/config/config.go``,
``policy/file/parse.go`` and ``sdk/target.go``, vendored in tests/constructs_lib/vendor).

Why this shape:
- A pool follows its queue, not CPU: the check counts the GPUs its jobs hold or wait for from
  Nomad's job-summary metrics (queued + starting + running allocations), which exist with zero
  nodes in the pool, so a pool at ``min_nodes: 0`` grows when a run is queued. Those metrics
  carry the task group name, not the node pool, so gpufleet names task groups
  ``gpu-<pool>-x<gpus>`` (``clusters.derive.nomad.nomad_task_group_name``); the query sums per GPU count and the
  ``pass-through`` strategy asks for ceil(GPUs / GPUs per node) nodes, within the pool's min/max.
- Scale-in removes only empty nodes (``node_selector_strategy = "empty_ignore_system"``), after
  draining them: a node running a batch allocation is never chosen.
- The autoscaler runs on the servers (systemd, one per server, ``high_availability`` lock), never
  on a GPU pool it might scale to zero. It talks to the local agent over mTLS.
- Metrics come from a Prometheus that scrapes every server's ``/v1/metrics?format=prometheus`` (docs/nomad.md: why not nomad-apm)
  (``nomad.autoscaler.prometheus_address`` in the cluster file); the servers publish job
  summaries (``telemetry.publish_allocation_metrics`` is on).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from clusters.derive.nomad import nomad_task_group_name
from clusters.derive.pools import GpuPoolSpec
from constructs_lib.nomad_agent_config import HTTP_PORT

# v0.4.9: the release the policy keys were checked against (vendored extract).
AUTOSCALER_VERSION = "0.4.9"
CONFIG_DIR = "/etc/nomad-autoscaler.d"
POLICY_DIR = f"{CONFIG_DIR}/policies"
EVALUATION_INTERVAL = "1m"
COOLDOWN = "5m"
DRAIN_DEADLINE = "15m"
STATES = ("queued", "starting", "running")


def demand_query(pool: GpuPoolSpec) -> str:
    """Nodes the pool needs now: GPUs its runs hold or wait for, over GPUs per node, rounded up.
    ``or vector(0)`` keeps the sum defined when no run of a size exists."""
    terms = []
    for gpus in range(1, pool.gpus_per_node + 1):
        group = nomad_task_group_name(pool.name, gpus)
        # max by job: every server Prometheus scrapes may still hold the gauge; count each run once.
        allocs = " + ".join(f'(sum(max by (job) (nomad_nomad_job_summary_{state}{{task_group="{group}"}})) or vector(0))'
                            for state in STATES)
        terms.append(f"{gpus} * ({allocs})")
    return f"ceil(({' + '.join(terms)}) / {pool.gpus_per_node})"


def _hcl(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    raise TypeError(f"cannot render {value!r}")


def _block(lines: list[str], indent: int, header: str, body: Mapping[str, object]) -> None:
    pad = "  " * indent
    lines.append(f"{pad}{header} {{")
    for key, value in body.items():
        if isinstance(value, Mapping):
            _block(lines, indent + 1, key, value)
        else:
            lines.append(f"{pad}  {key} = {_hcl(value)}")
    lines.append(f"{pad}}}")


def mig_name(cluster: str, pool: str) -> str:
    return f"{cluster}-{pool}"


def render_policy(*, spec: GpuPoolSpec, cluster: str, project: str, region: str) -> str:
    """One file policy (``scaling`` block, type cluster) for the pool's regional MIG."""
    lines: list[str] = []
    _block(lines, 0, f'scaling "{cluster}-{spec.name}"', {
        "enabled": True,
        "type": "cluster",
        "min": spec.min_total_nodes,
        "max": spec.max_total_nodes,
        "policy": {
            "cooldown": COOLDOWN,
            "evaluation_interval": EVALUATION_INTERVAL,
            # sdk/policy.go v0.4.9 ScalingPolicy.Validate accepts only "fail" or "ignore" (a policy that fails
            # validation is skipped, so the pool never scales); "fail": no action on a failed query.
            "on_check_error": "fail",
            'check "gpu_demand"': {
                "source": "prometheus",
                "query": demand_query(spec),
                'strategy "pass-through"': {},
            },
            # Target config is a string map (``hcl:",remain"`` into map[string]string): strings only.
            'target "gce-mig"': {
                "project": project,
                "region": region,
                "mig_name": mig_name(cluster, spec.name),
                "node_pool": spec.name,
                "node_class": spec.name,
                "node_drain_deadline": DRAIN_DEADLINE,
                "node_drain_ignore_system_jobs": "true",
                "node_selector_strategy": "empty_ignore_system",
                "node_purge": "true",
            },
        },
    })
    return "\n".join(lines) + "\n"


def render_agent_config(*, nomad_region: str, prometheus_address: str, ca_file: str, cert_file: str, key_file: str,
                        prometheus_ca_file: str | None = None) -> str:
    """The autoscaler agent on a server: local Nomad API over mTLS with its own client certificate
    (``cert_file``/``key_file``, never the server's; token from NOMAD_TOKEN in its environment file,
    never here), HA lock, file policies, and the three plugins it uses; an https Prometheus is
    verified against ``prometheus_ca_file`` (the APM's ``ca_cert``)."""
    lines: list[str] = ["log_level = \"INFO\"", f'plugin_dir = "{CONFIG_DIR}/plugins"']
    _block(lines, 0, "nomad", {"address": "https://127.0.0.1:4646", "region": nomad_region, "ca_cert": ca_file,
                               "client_cert": cert_file, "client_key": key_file, "tls_server_name": f"server.{nomad_region}.nomad"})
    _block(lines, 0, "high_availability", {"enabled": True})
    _block(lines, 0, "policy", {"dir": POLICY_DIR, "default_evaluation_interval": EVALUATION_INTERVAL, "default_cooldown": COOLDOWN})
    # ``config`` is an attribute (map[string]string), not a block.
    apm = f"address = {_hcl(prometheus_address)}" + (f", ca_cert = {_hcl(prometheus_ca_file)}" if prometheus_ca_file else "")
    lines += ['apm "prometheus" {', '  driver = "prometheus"', f"  config = {{ {apm} }}", "}"]
    _block(lines, 0, 'target "gce-mig"', {"driver": "gce-mig"})
    _block(lines, 0, 'strategy "pass-through"', {"driver": "pass-through"})
    return "\n".join(lines) + "\n"


TOKEN_FILE = f"{CONFIG_DIR}/token.env"
UNIT = "gpufleet-nomad-autoscaler"
_UNIT_FILE = f"""[Unit]
Description=Nomad Autoscaler (gpufleet): GPU pools follow the queue
After=nomad.service
[Service]
EnvironmentFile={TOKEN_FILE}
ExecStart=/usr/bin/nomad-autoscaler agent -config {CONFIG_DIR}/config.hcl
Restart=on-failure
RestartSec=10
[Install]
WantedBy=multi-user.target
"""


def render_autoscaler_boot(*, config: str, policies: Mapping[str, str], token_secret: str) -> str:
    """Boot-script step on a server: install the pinned autoscaler, write its config, the pools'
    policies and its ACL token (from Secret Manager, checked to be a token id before it goes into
    the environment file), and run it. Expects ``gpufleet_secret`` from the secrets step."""
    lines = [
        f"if ! command -v nomad-autoscaler >/dev/null 2>&1; then apt-get install -yq nomad-autoscaler={AUTOSCALER_VERSION}-1; fi",
        f"mkdir -p {POLICY_DIR} {CONFIG_DIR}/plugins",
        f"rm -f {POLICY_DIR}/*.hcl",
        f"cat > {CONFIG_DIR}/config.hcl <<'GPUFLEET_AUTOSCALER_CONFIG'\n{config}GPUFLEET_AUTOSCALER_CONFIG",
    ]
    for name, text in sorted(policies.items()):
        lines.append(f"cat > {POLICY_DIR}/{name}.hcl <<'GPUFLEET_AUTOSCALER_POLICY'\n{text}GPUFLEET_AUTOSCALER_POLICY")
    lines += [
        "umask 077",
        f"gpufleet_secret {token_secret} {TOKEN_FILE}.raw",
        f"token=$(tr -d '\\n' < {TOKEN_FILE}.raw); rm -f {TOKEN_FILE}.raw",
        "if ! printf '%s' \"$token\" | grep -Eq '^[0-9a-f-]{36}$'; then echo \"gpufleet: the autoscaler token secret is not a Nomad token id\" >&2; exit 1; fi",
        f"printf 'NOMAD_TOKEN=%s\\n' \"$token\" > {TOKEN_FILE}; unset token",
        "umask 022",
        f"cat > /etc/systemd/system/{UNIT}.service <<'GPUFLEET_UNIT'\n{_UNIT_FILE}GPUFLEET_UNIT",
        "systemctl daemon-reload",
        f"systemctl enable {UNIT}",
        f"systemctl restart {UNIT}",
    ]
    return "\n".join(lines)


def render_scrape_config(*, cluster: str, project: str, zones: tuple[str, ...], server_tag: str, nomad_region: str,
                         cert_dir: str = "/etc/prometheus/nomad") -> dict[str, object]:
    """The Prometheus scrape job the autoscaler's queries need (``gpufleet nomad scrape-config``).

    One target per server, found by GCE service discovery (one ``gce_sd_configs`` entry per zone,
    as Prometheus requires) and kept by the servers' network tag: only the Raft leader publishes
    ``nomad_nomad_job_summary_*`` (nomad/leader.go:448, v1.10.5), and which server leads changes;
    ``demand_query`` takes ``max by (job)`` across them. HTTPS with the client certificate the
    bootstrap script issues for Prometheus (the API has ``verify_https_client``), the server name
    every server certificate carries."""
    return {"job_name": f"nomad-servers-{cluster}", "scheme": "https", "metrics_path": "/v1/metrics",
            "params": {"format": ["prometheus"]},
            "tls_config": {"ca_file": f"{cert_dir}/ca.pem", "cert_file": f"{cert_dir}/prometheus.pem",
                           "key_file": f"{cert_dir}/prometheus-key.pem", "server_name": f"server.{nomad_region}.nomad"},
            "gce_sd_configs": [{"project": project, "zone": zone, "port": HTTP_PORT} for zone in zones],
            "relabel_configs": [{"source_labels": ["__meta_gce_tags"], "regex": f".*,{server_tag},.*", "action": "keep"},
                                {"source_labels": ["__meta_gce_instance_name"], "target_label": "instance"}]}
