"""The Nomad agents' certificate expiry reaches Prometheus as a metric, and alerts fire on it.

A blackbox exporter probes every agent's HTTPS API; what is checked here against upstream at pinned versions:

- prometheus/blackbox_exporter v0.28.0: module keys ``config/config.go:289-298`` (Module), ``:354-361``
  (TCPProbe), the probers ``prober/handler.go:37-44``, the ``hostname`` parameter that becomes the TCP
  prober's ``server_name`` when the module has none (``prober/handler.go:99-110``); it decodes with
  ``KnownFields(true)`` (``config/config.go:146``), so an unknown key refuses the whole file. TLS keys are
  prometheus/common v0.67.4's ``config.TLSConfig`` (``config/http_config.go:1201-1228``, the version its
  go.mod requires).
- prometheus/prometheus v3.14.0: relabel defaults ``model/relabel/relabel.go:35-39`` (replace, ``(.*)``
  anchored, ``$1``, separator ``;``); scrape ``params`` become ``__param_<name>`` labels before relabelling
  and those labels the scrape URL's query (``scrape/target.go:619-623, 225-246``); GCE discovery's
  ``__address__`` is ``<private ip>:<port>`` and its tags are wrapped in the separator
  (``discovery/gce/gce.go:203-204, 216``). The rule file: tests/constructs_lib/prometheus_rules.py.
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import promql_parser
import pytest
from ruamel.yaml import YAML

from constructs_lib.nomad_cert_expiry import render_tls_probe_config
from gpufleet.cli import main
from tests.conftest import FLEET_CLUSTERS, REPO_ROOT
from tests.constructs_lib.prometheus_rules import duration_ok, rule_file_errors

BLACKBOX = "blackbox.monitoring.internal:9115"
BLACKBOX_MODULE_KEYS = {"prober", "timeout", "http", "tcp", "icmp", "dns", "grpc", "unix"}
BLACKBOX_PROBERS = {"http", "tcp", "icmp", "dns", "grpc", "unix"}
BLACKBOX_TCP_KEYS = {"preferred_ip_protocol", "ip_protocol_fallback", "source_ip_address", "query_response", "tls", "tls_config"}
TLS_CONFIG_KEYS = {"ca", "cert", "key", "ca_file", "cert_file", "key_file", "ca_ref", "cert_ref", "key_ref", "server_name",
                   "insecure_skip_verify", "min_version", "max_version"}


def fleet_repo(tmp_path: Path, *, edit: tuple[str, str] | None = None, cluster: str = "prod-nomad") -> Path:
    """A repository (``--repo``) of one cluster file of the suite's fleet, optionally with one text edit."""
    (tmp_path / "clusters").mkdir()
    shutil.copy(REPO_ROOT / "cdktf.json", tmp_path / "cdktf.json")
    text = (FLEET_CLUSTERS / f"{cluster}.yaml").read_text()
    if edit is not None:
        assert edit[0] in text
        text = text.replace(*edit)
    (tmp_path / "clusters" / f"{cluster}.yaml").write_text(text)
    return tmp_path


def run_yaml(capsys, *args: str) -> object:
    assert main(list(args)) == 0, capsys.readouterr().err
    return YAML(typ="safe").load(capsys.readouterr().out)


def relabel(labels: dict[str, str], configs: list[dict]) -> dict[str, str] | None:
    """Prometheus' relabelling for the two actions the jobs use (keep, replace), with its defaults."""
    out = dict(labels)
    for cfg in configs:
        value = cfg.get("separator", ";").join(out.get(name, "") for name in cfg.get("source_labels", []))
        match = re.fullmatch(cfg.get("regex", "(.*)"), value)
        action = cfg.get("action", "replace")
        if action == "keep":
            if match is None:
                return None
        elif action == "replace":
            if match is not None:
                out[cfg["target_label"]] = match.expand(cfg.get("replacement", "$1").replace("$1", r"\1"))
        else:
            raise AssertionError(f"unexpected action {action}")
    return out


def discovered(job: dict, ip: str, tags: str, name: str) -> dict[str, str]:
    """The labels GCE discovery and the job's params give one VM before relabelling."""
    labels = {"__address__": f"{ip}:{job['gce_sd_configs'][0]['port']}", "__meta_gce_tags": tags, "__meta_gce_instance_name": name,
              "__metrics_path__": job["metrics_path"], "__scheme__": job.get("scheme", "http"), "job": job["job_name"]}
    labels.update({f"__param_{k}": v[0] for k, v in job["params"].items()})
    return labels


def test_every_server_and_client_is_probed_through_the_blackbox_exporter(tmp_path, capsys):
    config = run_yaml(capsys, "--repo", str(fleet_repo(tmp_path)), "nomad", "scrape-config", "prod-nomad", "--blackbox", BLACKBOX)
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    servers, clients = jobs["nomad-tls-servers-prod-nomad"], jobs["nomad-tls-clients-prod-nomad"]
    assert [z["zone"] for z in servers["gce_sd_configs"]] == ["europe-west4-a", "europe-west4-b", "europe-west4-c"]
    assert [z["zone"] for z in clients["gce_sd_configs"]] == ["europe-west4-a", "europe-west4-b"]
    for job, kind, tag in ((servers, "server", ",prod-nomad-nomad-server,"), (clients, "client", ",prod-nomad-nomad-client,")):
        assert job["metrics_path"] == "/probe" and job["params"]["module"] == ["nomad_tls"]
        target = relabel(discovered(job, "10.50.0.7", tag, f"prod-nomad-{kind}-x1"), job["relabel_configs"])
        assert target is not None
        assert target["__address__"] == BLACKBOX and target["__param_target"] == "10.50.0.7:4646"
        assert target["__param_module"] == "nomad_tls" and target["__param_hostname"] == f"{kind}.global.nomad"
        assert target["instance"] == f"prod-nomad-{kind}-x1"
    other = relabel(discovered(clients, "10.50.0.8", ",prod-nomad-nomad-server,", "s"), clients["relabel_configs"])
    assert other is None, "the clients' job probes no server (each kind's certificate has its own name)"


def test_scrape_config_without_blackbox_is_unchanged_and_a_bad_address_is_refused(tmp_path, capsys):
    repo = str(fleet_repo(tmp_path))
    config = run_yaml(capsys, "--repo", repo, "nomad", "scrape-config", "prod-nomad")
    assert [j["job_name"] for j in config["scrape_configs"]] == ["nomad-servers-prod-nomad", "nomad-gpu-clients-prod-nomad"]
    assert main(["--repo", repo, "nomad", "scrape-config", "prod-nomad", "--blackbox", "http://blackbox:9115/probe"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --blackbox 'http://blackbox:9115/probe': not a host:port") and err.count("\n") == 1


def test_blackbox_module_uses_only_fields_the_exporter_knows(tmp_path, capsys):
    config = run_yaml(capsys, "--repo", str(fleet_repo(tmp_path)), "nomad", "blackbox-module", "prod-nomad")
    assert set(config) == {"modules"} and set(config["modules"]) == {"nomad_tls"}
    module = config["modules"]["nomad_tls"]
    assert set(module) <= BLACKBOX_MODULE_KEYS and module["prober"] in BLACKBOX_PROBERS and module["prober"] == "tcp"
    assert re.fullmatch(r"[0-9]+s", module["timeout"])
    assert set(module["tcp"]) <= BLACKBOX_TCP_KEYS and module["tcp"]["tls"] is True
    tls = module["tcp"]["tls_config"]
    assert set(tls) <= TLS_CONFIG_KEYS
    assert {"ca_file", "cert_file", "key_file"} <= set(tls), "Nomad's API requires a client certificate (verify_https_client)"
    assert "server_name" not in tls, "the job's hostname parameter sets it only when the module leaves it empty"
    assert not tls.get("insecure_skip_verify"), "an unverified probe would report any certificate"


def test_probe_job_keeps_only_its_own_tag():
    job = render_tls_probe_config(cluster="c", kind="client", project="p", zones=("z",), tag="c-nomad-client", nomad_region="eu",
                                  blackbox=BLACKBOX)
    assert relabel(discovered(job, "10.0.0.1", ",c-nomad-client-old,", "x"), job["relabel_configs"]) is None
    assert relabel(discovered(job, "10.0.0.1", ",a,c-nomad-client,b,", "x"), job["relabel_configs"])["__param_hostname"] == "client.eu.nomad"


def test_firewall_lets_the_scrape_range_reach_the_clients_api_for_the_probe(stack_json):
    rules = stack_json("prod-nomad")["resource"]["google_compute_firewall"]
    probe = rules["fw_allow_nomad_tls_probe"]
    assert probe["name"] == "prod-nomad-allow-nomad-tls-probe" and probe["direction"] == "INGRESS"
    assert probe["source_ranges"] == ["10.30.0.0/24"] and probe["target_tags"] == ["prod-nomad-nomad-client"]
    assert probe["allow"] == [{"protocol": "tcp", "ports": ["4646"]}]
    servers = rules["fw_allow_nomad_metrics"]
    assert servers["source_ranges"] == ["10.30.0.0/24"] and servers["allow"] == [{"protocol": "tcp", "ports": ["4646"]}]


# -- the rule file -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "ok"), [("15m", True), ("1h30m", True), ("0", True), ("1y2w3d4h5m6s7ms", True),
                                          ("30m1h", False), ("15 minutes", False), ("1.5h", False), ("", False),
                                          ("1h1h", False), ("-5m", False), ("5", False)])
def test_duration_rule_matches_prometheus(text, ok):
    assert duration_ok(text) is ok


def test_rule_validator_refuses_what_prometheus_refuses():
    good = {"alert": "A", "expr": "up == 0", "for": "5m", "labels": {"severity": "warning"}, "annotations": {"summary": "{{ $labels.x }}"}}
    assert rule_file_errors({"groups": [{"name": "g", "rules": [good]}]}) == []
    bad = [
        {"groups": [{"name": "g", "rules": [{**good, "severity": "x"}]}]},
        {"groups": [{"name": "g", "rules": [{**good, "record": "r"}]}]},
        {"groups": [{"name": "g", "rules": [{k: v for k, v in good.items() if k != "expr"}]}]},
        {"groups": [{"name": "g", "rules": [{**good, "expr": "(up - time() < 3"}]}]},
        {"groups": [{"name": "g", "rules": [{**good, "for": "15 minutes"}]}]},
        {"groups": [{"name": "g", "rules": [{**good, "labels": {"bad-name": "x"}}]}]},
        {"groups": [{"name": "g", "rules": [{**good, "annotations": {"summary": "{{ $labels.x }"}}]}]},
        {"groups": [{"name": "g", "rules": [good]}, {"name": "g", "rules": [good]}]},
        {"groups": [{"name": "", "rules": [good]}]},
        {"groups": [{"name": "g", "rules": [good]}], "extra": 1},
    ]
    for data in bad:
        assert rule_file_errors(data), data


class Vector(dict):
    """An instant vector: label set (without the metric name) -> value."""


def evaluate(node: object, series: dict[tuple[str, frozenset], float], now: float) -> Vector | float:
    """PromQL's instant evaluation for what the alerts use: selectors, ``time()``, ``-``, comparison filters, ``and``."""
    if isinstance(node, promql_parser.ParenExpr):
        return evaluate(node.expr, series, now)
    if isinstance(node, promql_parser.NumberLiteral):
        return node.val
    if isinstance(node, promql_parser.Call):
        assert node.func.name == "time" and not node.args
        return now
    if isinstance(node, promql_parser.VectorSelector):
        ops = {"MatchOp.Equal": lambda v, m: v == m, "MatchOp.NotEqual": lambda v, m: v != m,
               "MatchOp.Re": lambda v, m: re.fullmatch(m, v) is not None, "MatchOp.NotRe": lambda v, m: re.fullmatch(m, v) is None}
        return Vector({labels: value for (name, labels), value in series.items() if name == node.name
                       and all(ops[str(m.op)](dict(labels).get(m.name, ""), m.value) for m in node.matchers.matchers)})
    assert isinstance(node, promql_parser.BinaryExpr), node
    assert node.modifier is None or (node.modifier.matching is None and not node.modifier.return_bool), "no on/ignoring/bool"
    op, lhs, rhs = str(node.op), evaluate(node.lhs, series, now), evaluate(node.rhs, series, now)
    if op == "and":
        return Vector({k: v for k, v in lhs.items() if k in rhs})
    assert isinstance(lhs, Vector) and not isinstance(rhs, Vector), "the alerts compare a vector with a scalar"
    if op in ("-", "+"):
        return Vector({k: v - rhs if op == "-" else v + rhs for k, v in lhs.items()})
    compare = {"<": float.__lt__, ">": float.__gt__, "==": float.__eq__}[op]
    return Vector({k: v for k, v in lhs.items() if compare(float(v), float(rhs))})


def firing(rules: dict, name: str, series: dict) -> set[str]:
    """The instances for which alert ``name`` holds now (its ``for`` aside)."""
    rule = next(r for r in rules["groups"][0]["rules"] if r["alert"] == name)
    return {dict(labels)["instance"] for labels in evaluate(promql_parser.parse(rule["expr"]), series, NOW)}


NOW = time.time()


def probe(kind: str, instance: str, *, left_hours: float | None = None, success: bool = True, cluster: str = "prod-nomad") -> dict:
    labels = frozenset({"job": f"nomad-tls-{kind}s-{cluster}", "instance": instance}.items())
    out = {("probe_success", labels): 1.0 if success else 0.0}
    if left_hours is not None:
        out[("probe_ssl_earliest_cert_expiry", labels)] = NOW + left_hours * 3600
    return out


def test_alert_rules_load_and_a_renewing_cluster_alerts_when_renewal_stopped(tmp_path, capsys):
    rules = run_yaml(capsys, "--repo", str(fleet_repo(tmp_path)), "nomad", "alert-rules", "prod-nomad")
    assert rule_file_errors(rules) == []
    assert [r["alert"] for r in rules["groups"][0]["rules"]] == [
        "NomadCertificateExpiresSoon", "NomadCertificateExpiresIn30Days", "NomadCertificateProbeFailing"]
    series = {**probe("server", "renewed", left_hours=60), **probe("server", "renewal-due", left_hours=23),
              **probe("client", "failed-twice", left_hours=11), **probe("client", "bootstrap-cert", left_hours=20 * 24),
              **probe("client", "bootstrap-fresh", left_hours=300 * 24), **probe("client", "down", success=False),
              **probe("server", "other-cluster", left_hours=1, success=False, cluster="dev-nomad")}
    # prod-nomad: 72 h certificates, renewed with 24 h left by an hourly timer; under 12 h left, two renewals failed.
    assert firing(rules, "NomadCertificateExpiresSoon", series) == {"failed-twice"}
    assert firing(rules, "NomadCertificateExpiresIn30Days", series) == {"bootstrap-cert"}
    assert firing(rules, "NomadCertificateProbeFailing", series) == {"down"}
    failing = next(r for r in rules["groups"][0]["rules"] if r["alert"] == "NomadCertificateProbeFailing")
    assert failing["for"] == "15m" and failing["labels"]["cluster"] == "prod-nomad"


def test_the_renewal_alert_follows_the_certificate_lifetime(tmp_path, capsys):
    repo = fleet_repo(tmp_path, edit=("    certificates: vault-pki\n", "    certificates: vault-pki\n    agent_cert_ttl_hours: 24\n"))
    rules = run_yaml(capsys, "--repo", str(repo), "nomad", "alert-rules", "prod-nomad")
    assert rule_file_errors(rules) == []
    series = {**probe("server", "a", left_hours=5), **probe("server", "b", left_hours=3.5), **probe("client", "c", left_hours=40)}
    assert firing(rules, "NomadCertificateExpiresSoon", series) == {"b"}, "24 h certificates: alert under 4 h left"
    assert firing(rules, "NomadCertificateExpiresIn30Days", series) == {"c"}, "longer than any PKI certificate: a bootstrap one"


def test_a_static_cluster_alerts_30_days_ahead_and_has_no_renewal_alert(tmp_path, capsys):
    repo = fleet_repo(tmp_path, edit=("    certificates: vault-pki\n", "    certificates: static\n"))
    rules = run_yaml(capsys, "--repo", str(repo), "nomad", "alert-rules", "prod-nomad")
    assert rule_file_errors(rules) == []
    assert [r["alert"] for r in rules["groups"][0]["rules"]] == ["NomadCertificateExpiresIn30Days", "NomadCertificateProbeFailing"]
    series = {**probe("server", "ok", left_hours=31 * 24), **probe("client", "soon", left_hours=29 * 24), **probe("client", "hours", left_hours=2)}
    assert firing(rules, "NomadCertificateExpiresIn30Days", series) == {"soon", "hours"}


def test_alert_rules_refuse_a_cluster_without_a_scrape_path(tmp_path, capsys):
    assert main(["--repo", str(fleet_repo(tmp_path, cluster="prod-gke")), "nomad", "alert-rules", "prod-gke"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: 'prod-gke' is not a Nomad cluster") and err.count("\n") == 1
