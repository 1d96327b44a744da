"""GPU telemetry and health on Nomad: every client exports DCGM metrics that the autoscaler's Prometheus scrapes, and a
client whose GPUs report a critical XID, uncorrectable ECC errors or a row-remap failure marks itself ineligible and
drains, through the Nomad API double (tests/jobs/nomad_double.py, node endpoints as hashicorp/nomad v1.10.5 serves
them: NomadDouble._node_answer).

The exporter fixtures (fixtures/dcgm/*.txt) are 8-GPU expositions in the format NVIDIA/dcgm-exporter 4.2.3-4.1.3's
README.md:16-25 shows (HELP/TYPE, one sample per GPU labelled gpu and UUID), including its blank-value sentinel
9223372036854775794 (README.md:25, a memory temperature with no value).
"""

from __future__ import annotations

import urllib.error
from pathlib import Path

import hcl
import pytest

from constructs_lib import nomad_gpu_health_check as checker
from constructs_lib.nomad_gpu_node import (DCGM_COUNTERS, DCGM_EXPORTER_IMAGE, DCGM_EXPORTER_PORT, HEALTH_POLICY, checker_source,
                                           render_gpu_scrape_config)
from gpufleet.cli import main
from tests.jobs.nomad_double import FakeNode, NomadDouble

DCGM = Path(__file__).resolve().parent / "fixtures" / "dcgm"
UPSTREAM_COUNTERS = Path(__file__).resolve().parent / "vendor" / "dcgm-exporter-4.2.3-4.1.3-default-counters.csv"
TOKEN = "s3cr3t-health-token"


@pytest.fixture
def nomad():
    node = FakeNode("train-nomad-h100-x1z2", node_pool="h100", node_class="h100", gpu_model="NVIDIA H100 80GB HBM3",
                    gpu_memory_mib=81559, gpus=8)
    double = NomadDouble([node], acl_token=TOKEN).start()
    yield double, node
    double.stop()


def run(double: NomadDouble, node: FakeNode, fixture: str, token: str = TOKEN, text: str | None = None) -> tuple[str, list[str]]:
    """One checker run on ``fixture`` (or ``text``) of an 8-GPU machine; returns its log line and whether it asked for
    the API (token read)."""
    asked: list[str] = []

    def api_for() -> checker.NomadApi:
        asked.append("token")
        return checker.NomadApi(double.address, token)

    metrics = text if text is not None else (DCGM / fixture).read_text()
    return checker.check_once(metrics, node.node_id, api_for, expected_gpus=8), asked


def test_healthy_node_is_left_alone_and_its_token_never_read(nomad):
    double, node = nomad
    line, asked = run(double, node, "healthy.txt")
    assert line.endswith("GPUs healthy") and asked == [] and double.requests == []
    assert node.eligibility == "eligible" and node.drain_strategy is None


@pytest.mark.parametrize(("fixture", "reason"), [
    ("xid79.txt", "GPU 3 last XID 79"),
    ("ecc_dbe.txt", "GPU 6 has 2 uncorrectable (double-bit) volatile ECC errors"),
    ("row_remap_failure.txt", "GPU 1 failed to remap rows of its memory"),
])
def test_faulty_gpu_marks_the_node_ineligible_and_drains_it_with_the_reason(nomad, fixture, reason):
    double, node = nomad
    line, _ = run(double, node, fixture)
    assert "marked ineligible and draining" in line and reason in line
    eligibility = double.calls("PUT", "node-eligibility")
    drain = double.calls("PUT", "node-drain")
    assert [r.path for r in eligibility] == [f"/v1/node/{node.node_id}/eligibility"]
    assert eligibility[0].body == {"NodeID": node.node_id, "Eligibility": "ineligible"}
    assert drain[0].body == {"NodeID": node.node_id, "DrainSpec": {"Deadline": 3600 * 10**9, "IgnoreSystemJobs": True},
                             "MarkEligible": False, "Meta": {"gpufleet_gpu_health": reason, "checker": "gpufleet-gpu-health"}}
    assert double.requests.index(eligibility[0]) < double.requests.index(drain[0]), "ineligible first: nothing new lands meanwhile"
    assert all(r.headers.get("X-Nomad-Token") == TOKEN for r in double.requests)
    assert node.eligibility == "ineligible" and node.drain_strategy["Deadline"] == 3600 * 10**9
    assert node.last_drain["Meta"]["gpufleet_gpu_health"] == reason
    assert [e["Message"] for e in node.events] == ["Node marked as ineligible for scheduling", "Node drain strategy set"]


def test_a_drained_node_is_not_drained_again_on_the_next_run(nomad):
    double, node = nomad
    run(double, node, "xid79.txt")
    line, _ = run(double, node, "xid79.txt")
    assert "already ineligible and drained" in line
    assert len(double.calls("PUT", "node-drain")) == 1 and len(double.calls("GET", "node")) == 2


def test_someone_elses_drain_is_replaced_by_the_checkers_deadline_and_reason(nomad):
    """A node already draining for another reason (an operator's maintenance drain without deadline, ``nomad node drain
    -enable -no-deadline``, Deadline -1: DrainSpec at api/nodes.go) is not "taken out" by the checker: its jobs would
    keep running on the failed GPU for as long as that drain lets them. The checker sets its own drain, whose one-hour
    deadline and reason replace the other's (updating a drain replaces LastDrain.Meta when Meta is given: hashicorp/nomad
    v1.10.5 nomad/state/state_store.go, updateNodeDrainImpl, "if len(drainMeta) != 0")."""
    double, node = nomad
    api = checker.NomadApi(double.address, TOKEN)
    api._call("PUT", f"/v1/node/{node.node_id}/drain", {"NodeID": node.node_id, "DrainSpec": {"Deadline": -1, "IgnoreSystemJobs": False},
                                                        "Meta": {"message": "rack maintenance"}})
    line, _ = run(double, node, "xid79.txt")
    assert "marked ineligible and draining" in line, line
    assert node.drain_strategy["Deadline"] == 3600 * 10**9 and node.last_drain["Meta"]["gpufleet_gpu_health"] == "GPU 3 last XID 79"
    again, _ = run(double, node, "xid79.txt")
    assert "already ineligible and drained" in again and len(double.calls("PUT", "node-drain")) == 2


@pytest.mark.parametrize(("fixture", "note"), [("xid13.txt", "GPU 5 last XID 13"), ("xid_blank.txt", None)])
def test_application_xids_and_blank_values_do_not_drain(nomad, fixture, note):
    double, node = nomad
    line, asked = run(double, node, fixture)
    assert "GPUs healthy" in line and asked == [] and double.requests == []
    assert (note in line) if note else ("noted" not in line)


def test_a_gpu_missing_from_dcgm_takes_the_node_out(nomad):
    """A GPU that fell off the bus (XID 79) and did not come back after the reboot docs/nomad.md prescribes is not
    in DCGM's exposition at all: it has no XID, no ECC count, nothing to judge, and the node stayed eligible with 7
    GPUs. The checker compares the GPUs the exporter reports with the machine's count, as the toolkit's check that
    gpufleet's GKE checker follows does (constructs_lib/gpu_health_check.py, "fewer GPUs than expected")."""
    double, node = nomad
    seven = "".join(line for line in (DCGM / "healthy.txt").read_text().splitlines(keepends=True) if 'gpu="7"' not in line)
    line, _ = run(double, node, "", text=seven)
    assert "marked ineligible and draining" in line and "7 of the machine's 8 GPUs report to DCGM" in line, line
    assert node.last_drain["Meta"]["gpufleet_gpu_health"].startswith("7 of the machine's 8 GPUs")


def test_an_exposition_without_any_gpu_is_no_verdict(nomad):
    """No GPU at all in an answer is the exporter's state (starting, DCGM not attached), not proof of eight lost
    GPUs: no verdict, like no answer."""
    double, node = nomad
    line, asked = run(double, node, "", text="# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).\n")
    assert "not judged" in line and asked == [] and double.requests == []


def test_non_numbers_are_no_value_and_never_stop_the_judgement_of_the_other_gpus():
    """Prometheus text exposition allows NaN, +Inf and -Inf as sample values (Go's strconv.FormatFloat, as the
    exporter's client library writes them). None of them is a count: no fault from them, and one odd sample must not
    end the run (int(-inf) raised OverflowError, which main() does not catch: the checker died each minute and judged
    no GPU at all), so the critical XID of another GPU in the same exposition is still acted on."""
    text = ('DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="0",UUID="GPU-0"} NaN\n'
            'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="1",UUID="GPU-1"} +Inf\n'
            'DCGM_FI_DEV_ROW_REMAP_FAILURE{gpu="2",UUID="GPU-2"} -Inf\n'
            'DCGM_FI_DEV_XID_ERRORS{gpu="3",UUID="GPU-3"} 79\n')
    found, notes = checker.faults(checker.parse_metrics(text))
    assert found == ["GPU 3 last XID 79"] and notes == []


def test_a_token_nomad_refuses_changes_nothing_and_fails_the_run(nomad):
    double, node = nomad
    with pytest.raises(urllib.error.HTTPError) as err:
        run(double, node, "ecc_dbe.txt", token="not-the-token")
    assert err.value.code == 403 and node.eligibility == "eligible" and node.drain_strategy is None


def test_the_double_refuses_what_nomad_refuses(nomad):
    double, node = nomad
    api = checker.NomadApi(double.address, TOKEN)
    with pytest.raises(urllib.error.HTTPError) as err:
        api._call("PUT", f"/v1/node/{node.node_id}/eligibility", {"Eligibility": "drained"})
    assert err.value.code == 500 and "invalid scheduling eligibility" in err.value.read().decode()
    api.drain(node.node_id, "test")
    with pytest.raises(urllib.error.HTTPError) as err:
        api._call("PUT", f"/v1/node/{node.node_id}/eligibility", {"Eligibility": "eligible"})
    assert "while it is draining" in err.value.read().decode()
    with pytest.raises(urllib.error.HTTPError) as err:
        api._call("GET", f"/v1/node/{node.node_id}/drain")
    assert err.value.code == 405


def test_no_exporter_answer_is_no_verdict(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("GPUFLEET_DCGM_URL", "http://127.0.0.1:9/metrics")
    monkeypatch.setenv("GPUFLEET_NODE_ID_FILE", str(tmp_path / "absent"))
    assert checker.main() == 0
    assert "not judged this run" in capsys.readouterr().out


def test_counters_are_upstream_rows_plus_the_uncorrectable_ecc_count():
    upstream_active, upstream_all = {}, {}
    for line in UPSTREAM_COUNTERS.read_text().splitlines()[1:]:
        commented = line.startswith("#")
        cells = [c.strip() for c in line.lstrip("# ").split(",", 2)]
        if len(cells) == 3 and cells[0].startswith("DCGM_"):
            upstream_all[cells[0]] = cells[1]
            if not commented:
                upstream_active[cells[0]] = cells[1]
    ours = {field: kind for field, kind, _ in DCGM_COUNTERS}
    assert all(upstream_all.get(f) == k for f, k in ours.items()), "every field and type exists upstream at 4.2.3-4.1.3"
    assert set(ours) - set(upstream_active) == {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"} and set(upstream_active) <= set(ours)
    assert {checker.XID_FIELD, checker.ECC_DBE_FIELD, checker.ROW_REMAP_FAILURE_FIELD} <= set(ours)


def client_script(stack_json, pool: str = "l4") -> str:
    return stack_json("prod-nomad")["resource"]["google_compute_instance_template"][f"nomad_client_template_{pool}"]["metadata_startup_script"]


def test_every_client_runs_the_pinned_exporter_and_the_shipped_checker_before_nomad(stack_json):
    for pool in ("a100", "l4"):
        script = client_script(stack_json, pool)
        assert "--gpus all --cap-add SYS_ADMIN -p 9400:9400" in script and DCGM_EXPORTER_IMAGE in script
        assert DCGM_EXPORTER_IMAGE.endswith(":4.2.3-4.1.3-ubuntu22.04")
        shipped = script.split("<<'GPUFLEET_HEALTH_SCRIPT'\n", 1)[1].split("GPUFLEET_HEALTH_SCRIPT", 1)[0]
        assert shipped == checker_source()
        assert "OnUnitActiveSec=1min" in script and "GPUFLEET_HEALTH_SECRET_NAME=prod-nomad-nomad-gpu-health-token" in script
        assert "GPUFLEET_NODE_ID_FILE=/opt/nomad/data/client/client-id" in script
        assert f"GPUFLEET_EXPECTED_GPUS={ {'a100': 2, 'l4': 1}[pool] }" in script, "the machine's GPU count (clusters/machines.py)"  # nomad client/client.go:1489, StateDir/client-id
        assert script.index("systemctl restart gpufleet-dcgm-exporter.service") < script.index("systemctl restart nomad")
        assert TOKEN not in script and "hvs." not in script


def test_the_checker_token_may_only_write_nodes(stack_json):
    policy = stack_json("prod-nomad-scheduler")["resource"]["nomad_acl_policy"]["nomad_acl_gpu_health"]
    assert policy["name"] == HEALTH_POLICY and hcl.loads(policy["rules_hcl"]) == {"node": {"policy": "write"}}


def test_firewall_admits_the_scrape_ranges_to_the_clients_exporter_only(stack_json):
    rule = stack_json("prod-nomad")["resource"]["google_compute_firewall"]["fw_allow_gpu_metrics"]
    assert rule["source_ranges"] == ["10.30.0.0/24"] and rule["target_tags"] == ["prod-nomad-nomad-client"]
    assert rule["allow"] == [{"protocol": "tcp", "ports": [str(DCGM_EXPORTER_PORT)]}] and rule["direction"] == "INGRESS"


def test_scrape_config_has_a_job_for_every_clients_exporter(capsys):
    job = render_gpu_scrape_config(cluster="c", project="p", zones=("z-a",), client_tag="c-nomad-client")
    assert job["gce_sd_configs"] == [{"project": "p", "zone": "z-a", "port": 9400}] and job["metrics_path"] == "/metrics"
    keep = job["relabel_configs"][0]
    assert keep["action"] == "keep" and keep["regex"] == ".*,c-nomad-client,.*"
    assert main(["nomad", "scrape-config", "prod-nomad"]) == 0
    out = capsys.readouterr().out
    assert "job_name: nomad-gpu-clients-prod-nomad" in out and "port: 9400" in out and "prod-nomad-nomad-client" in out
