"""The Nomad agents' certificate expiry as a metric, and the alerts on it.

Prometheus cannot read a certificate's dates from Nomad's own metrics, so a blackbox exporter
(prometheus/blackbox_exporter v0.28.0) opens a TLS connection to every agent's HTTPS API (4646) and
reports ``probe_ssl_earliest_cert_expiry``: the earliest ``NotAfter`` of the certificates the agent
presents (``prober/tls.go:25-33``, set by the TCP prober in ``prober/query_response.go:98``). One
module, ``nomad_tls``, for servers and clients; the name each kind's certificate carries
(``server.<region>.nomad``, ``client.<region>.nomad``) goes in the probe's ``hostname`` parameter, which
the handler copies into the TCP prober's ``server_name`` (``prober/handler.go:99-110``). Nomad's API
requires a client certificate (``verify_https_client``), so the module presents Prometheus' one.

What an alert means depends on whether the agents renew (``nomad.tls.certificates``):

- ``vault-pki``: an agent renews with a third of ``agent_cert_ttl_hours`` left, from an hourly timer;
  less than a sixth left means two renewals in a row have failed (``NomadCertificateExpiresSoon``).
  A certificate with more than the TTL left cannot have come from the PKI mount: the agent still runs
  on its bootstrap certificate (a fleet moved to ``vault-pki`` keeps them until the VM is recreated),
  which does not renew, so it gets the static alert in its last 30 days.
- ``static``: nothing renews; ``NomadCertificateExpiresIn30Days`` matches ``gpufleet check``'s warning.

``NomadCertificateProbeFailing`` covers what leaves no expiry to judge: an expired or unverifiable
certificate fails the handshake, so the gauge disappears and only ``probe_success`` says so.
"""

from __future__ import annotations

from typing import Literal

from constructs_lib.nomad_agent_config import HTTP_PORT

BLACKBOX_MODULE = "nomad_tls"
AgentKind = Literal["server", "client"]
STATIC_WARN_DAYS = 30  # the same 30 days as gpufleet check's static_expires warning (clusters/derive/nomad.py)
PROBE_FAILING_FOR = "15m"


def probe_job_name(cluster: str, kind: AgentKind) -> str:
    return f"nomad-tls-{kind}s-{cluster}"


def render_tls_probe_config(*, cluster: str, kind: AgentKind, project: str, zones: tuple[str, ...], tag: str, nomad_region: str,
                            blackbox: str) -> dict[str, object]:
    """One Prometheus job that probes every ``kind`` agent (``server`` or ``client``) through the blackbox exporter.

    The same GCE discovery as the metrics jobs finds the agents (kept by their network tag); the
    discovered ``<ip>:4646`` becomes the probe's ``target`` parameter and the exporter's address the
    scrape address, the pattern blackbox_exporter's README documents for Prometheus."""
    return {"job_name": probe_job_name(cluster, kind), "metrics_path": "/probe",
            "params": {"module": [BLACKBOX_MODULE], "hostname": [f"{kind}.{nomad_region}.nomad"]},
            "gce_sd_configs": [{"project": project, "zone": zone, "port": HTTP_PORT} for zone in zones],
            "relabel_configs": [{"source_labels": ["__meta_gce_tags"], "regex": f".*,{tag},.*", "action": "keep"},
                                {"source_labels": ["__address__"], "target_label": "__param_target"},
                                {"source_labels": ["__meta_gce_instance_name"], "target_label": "instance"},
                                {"target_label": "__address__", "replacement": blackbox}]}


def render_blackbox_module(*, cert_dir: str = "/etc/prometheus/nomad") -> dict[str, object]:
    """The blackbox exporter's ``modules:`` entry the probe jobs name (v0.28.0 ``config/config.go:289-291``
    Module ``prober``/``timeout``/``tcp``, ``:354-360`` TCPProbe ``tls``/``tls_config``; CONFIGURATION.md
    ``<tls_config>`` ``ca_file``, ``cert_file``, ``key_file``, lines 419-436). No ``server_name``: the job's
    ``hostname`` parameter sets it per agent kind, and only when the module leaves it empty."""
    return {"modules": {BLACKBOX_MODULE: {
        "prober": "tcp", "timeout": "10s",
        "tcp": {"tls": True, "tls_config": {"ca_file": f"{cert_dir}/ca.pem", "cert_file": f"{cert_dir}/prometheus.pem",
                                            "key_file": f"{cert_dir}/prometheus-key.pem"}}}}}


def render_alert_rules(*, cluster: str, renews: bool, ttl_hours: int) -> dict[str, object]:
    """The Prometheus rule file (one group) for the cluster's probe jobs; ``renews`` is ``vault-pki``."""
    selector = f'{{job=~"{probe_job_name(cluster, "server")}|{probe_job_name(cluster, "client")}"}}'
    left = f"(probe_ssl_earliest_cert_expiry{selector} - time())"
    static_seconds = STATIC_WARN_DAYS * 86400
    labels = {"cluster": cluster}
    rules: list[dict[str, object]] = []
    if renews:
        soon = ttl_hours * 3600 // 6
        rules.append({
            "alert": "NomadCertificateExpiresSoon", "expr": f"{left} < {soon}", "for": "10m",
            "labels": {**labels, "severity": "critical"},
            "annotations": {"summary": "Nomad agent {{ $labels.instance }}: certificate renewal has stopped",
                            "description": f"Less than a sixth of the {ttl_hours} h certificate lifetime is left (renewal starts at a"
                                           " third): two renewals failed. Look at `journalctl -u gpufleet-nomad-cert` on the VM"
                                           " (OpenBao reachable? login role?) before the agent's TLS stops working."}})
        rules.append({
            "alert": "NomadCertificateExpiresIn30Days", "expr": f"{left} > {ttl_hours * 3600} and {left} < {static_seconds}",
            "for": "1h", "labels": {**labels, "severity": "warning"},
            "annotations": {"summary": "Nomad agent {{ $labels.instance }} still has its bootstrap certificate",
                            "description": "It lives longer than any certificate from the PKI mount, so it is the static one from"
                                           " the bootstrap script, which never renews. Recreate the VM: it then issues its own."}})
    else:
        rules.append({
            "alert": "NomadCertificateExpiresIn30Days", "expr": f"{left} < {static_seconds}", "for": "1h",
            "labels": {**labels, "severity": "warning"},
            "annotations": {"summary": "Nomad agent {{ $labels.instance }}: certificate expires within 30 days",
                            "description": "Static certificates never renew: rerun the bootstrap script's certificate part, record"
                                           " nomad.tls.static_expires, and recreate the VMs (or move to nomad.tls.certificates:"
                                           " vault-pki, docs/nomad.md)."}})
    rules.append({
        "alert": "NomadCertificateProbeFailing", "expr": f"probe_success{selector} == 0", "for": PROBE_FAILING_FOR,
        "labels": {**labels, "severity": "warning"},
        "annotations": {"summary": "Nomad agent {{ $labels.instance }}: TLS probe fails",
                        "description": "No expiry can be read: the certificate may have expired or not verify against the"
                                       " cluster CA, or the blackbox exporter cannot reach port 4646 (firewall, VM down)."}})
    return {"groups": [{"name": f"nomad-certificates-{cluster}", "rules": rules}]}
