"""The autoscaler's queue signal reaches it: a firewall path from the configured Prometheus ranges
to every server's HTTP port, and a scrape job with one target per server (only the Raft leader
publishes the job-summary gauges: hashicorp/nomad v1.10.5 nomad/leader.go:448 starts
publishJobSummaryMetrics in establishLeadership, leader.go:1223-1320 sets
nomad.nomad.job_summary.{queued,starting,running,...} labelled job, task_group, namespace).

Why Prometheus and not the autoscaler's own nomad-apm: its node query (v0.4.9
plugins/builtin/apm/nomad/plugin/node.go:165-198) knows only ``percentage-allocated`` of cpu or
memory, and with no node in the pool it errors ("no nodes identified within pool", node.go:99), so
a pool at 0 never gets a value to scale from; the table the test reads is the vendored extract."""

from __future__ import annotations

import re

from constructs_lib.nomad_autoscaler import render_scrape_config
from gpufleet.cli import main
from tests.constructs_lib.autoscaler_rules import RULES


def test_nomad_apm_cannot_scale_a_pool_from_zero_so_the_check_uses_prometheus(stack_json):
    node_query = RULES["nomad_apm_node_query"]
    assert node_query["operations"] == ["percentage-allocated"] and node_query["metrics"] == ["cpu", "memory"]
    assert node_query["empty_pool_error"] == "no nodes identified within pool"
    script = stack_json("prod-nomad")["resource"]["google_compute_instance_template"]["nomad_server_template"]["metadata_startup_script"]
    assert re.search(r'source = "prometheus"', script) and "nomad_nomad_job_summary_queued" in script


def test_firewall_admits_the_scrape_ranges_to_the_servers_http_port_only(stack_json):
    rules = stack_json("prod-nomad")["resource"]["google_compute_firewall"]
    metrics = rules["fw_allow_nomad_metrics"]
    assert metrics["source_ranges"] == ["10.30.0.0/24"] and metrics["target_tags"] == ["prod-nomad-nomad-server"]
    assert metrics["allow"] == [{"protocol": "tcp", "ports": ["4646"]}] and metrics["direction"] == "INGRESS"


def test_scrape_job_finds_every_server_by_tag_in_every_server_zone():
    job = render_scrape_config(cluster="c", project="p", zones=("z-a", "z-b"), server_tag="c-nomad-server", nomad_region="global")
    assert [(s["zone"], s["port"]) for s in job["gce_sd_configs"]] == [("z-a", 4646), ("z-b", 4646)]
    keep = job["relabel_configs"][0]
    assert keep["action"] == "keep" and re.fullmatch(keep["regex"], ",c-nomad-server,c-other,")
    assert not re.fullmatch(keep["regex"], ",c-nomad-server-old,"), "a tag that only starts with the server tag is not a server"
    assert job["params"] == {"format": ["prometheus"]} and job["metrics_path"] == "/v1/metrics" and job["scheme"] == "https"
    assert job["tls_config"]["server_name"] == "server.global.nomad", "every server certificate carries server.<region>.nomad"


def test_demand_query_counts_a_run_once_however_many_servers_still_hold_its_gauge(stack_json):
    assert re.search(r"sum\(max by \(job\) \(nomad_nomad_job_summary_queued\{", demand_query_for_l4(stack_json))


def demand_query_for_l4(stack_json) -> str:
    script = stack_json("prod-nomad")["resource"]["google_compute_instance_template"]["nomad_server_template"]["metadata_startup_script"]
    return re.search(r'query = "(ceil.*?gpu-l4-x1.*?)"\n', script).group(1).replace('\\"', '"')


def test_scrape_config_command_prints_the_job_and_refuses_clusters_without_an_autoscaler(capsys):
    assert main(["nomad", "scrape-config", "prod-nomad"]) == 0
    out = capsys.readouterr().out
    assert "job_name: nomad-servers-prod-nomad" in out and "zone: europe-west4-c" in out
    assert main(["nomad", "scrape-config", "prod-gke"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: 'prod-gke' is not a Nomad cluster") and err.count("\n") == 1
