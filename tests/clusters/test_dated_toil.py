"""No date someone must remember: renewed maintenance exclusions, the 30-day expiry warning,
cheap flow logs on the primary subnet and a closed IP endpoint beside the DNS endpoint.

A controlled clock throughout (explicit dates, or GPUFLEET_TODAY for `gpufleet check`). The
cluster is a fixture (tests/clusters/fixtures/dated-a3mega.yaml), not a user file.
Provider facts: google 6.50.0 maintenance_exclusion has start_time, end_time and
exclusion_options.scope only (tests/schemas/google-6.50.0.json), so a window needs both times;
the GKE API's Scope enum is NO_UPGRADES | NO_MINOR_UPGRADES | NO_MINOR_OR_NODE_UPGRADES
(container v1 MaintenanceExclusionOptions.Scope); the subnet's log_config values are the
provider's "Possible values" (asserted below from the generated bindings).
"""

from __future__ import annotations

import json
import re
from datetime import date, timedelta
from pathlib import Path

import pytest
import cdktf

from constructs_lib import providers
from clusters.derive.gke import derive_control_plane, derive_exclusion, exclusion_expiry
from clusters.errors import ConfigError
from clusters.loader import load
from clusters.schema import GcpConfig, UpgradeExclusion
from review.checks import expiry_warnings
from stacks.infra import ClusterStack

FIXTURES = Path(__file__).parent / "fixtures"
DATED = FIXTURES / "dated-a3mega.yaml"


@pytest.fixture(scope="module")
def dated():
    return load(DATED)


def _days(start: str, end: str) -> int:
    return (date.fromisoformat(end[:10]) - date.fromisoformat(start[:10])).days


def test_renewed_exclusion_covers_every_day_and_only_changes_at_a_quarter():
    policy = UpgradeExclusion()
    day, windows = date(2026, 1, 1), {}
    while day < date(2028, 1, 1):
        _, start, end, scope = derive_exclusion(policy, day)
        assert start[:10] <= day.isoformat() < end[:10] and scope == "NO_MINOR_OR_NODE_UPGRADES"
        assert _days(start, end) <= 140
        windows.setdefault((start, end), day)
        day += timedelta(days=1)
    assert len(windows) == 8  # one per quarter: plans stay empty inside a quarter
    ordered = sorted(windows)
    # Continuity: each window still runs 45 days after the next one starts, so an apply late in the renewal month keeps cover.
    assert all(_days(nxt[0], cur[1]) == 45 for cur, nxt in zip(ordered, ordered[1:]))


def test_dated_exclusion_is_the_files(dated):
    exclusion = dated.gke.upgrade_exclusion
    assert derive_exclusion(exclusion, date(2026, 12, 4))[1:3] == ("2026-12-01T00:00:00Z", "2027-06-01T00:00:00Z")


def test_scope_reaches_the_cluster(dated):
    config = dated.model_copy(update={"gke": dated.gke.model_copy(update={"upgrade_exclusion": UpgradeExclusion(scope="NO_MINOR_UPGRADES")})})
    stack = json.loads(cdktf.Testing.synth(ClusterStack(cdktf.Testing.app(), config)))
    (exclusion,) = stack["resource"]["google_container_cluster"]["gke"]["maintenance_policy"]["maintenance_exclusion"]
    assert exclusion["exclusion_options"] == {"scope": "NO_MINOR_UPGRADES"}


@pytest.mark.parametrize(("today", "warned"), [("2027-04-30", False), ("2027-05-02", True), ("2027-06-10", True)])
def test_check_warns_30_days_before_a_dated_exclusion_ends(dated, today, warned, monkeypatch):
    monkeypatch.setenv("GPUFLEET_TODAY", today)
    lines = expiry_warnings((dated,), FIXTURES)
    assert bool(lines) is warned
    if warned:
        (line,) = lines
        assert re.search(r"dated-a3mega\.yaml:\d+: gke\.upgrade_exclusion\.end_time: the maintenance exclusion (ends in|ended)", line), line
        assert "remove start_time and end_time" in line


def test_renewed_exclusion_never_warns(dated):
    renewed = dated.model_copy(update={"gke": dated.gke.model_copy(update={"upgrade_exclusion": UpgradeExclusion()})})
    assert all(exclusion_expiry(renewed, date(2026, 1, 1) + timedelta(days=d)) is None for d in range(0, 800, 7))


def test_half_a_dated_window_is_one_line_with_the_fix(tmp_path):
    text = DATED.read_text().replace('    end_time: "2027-06-01T00:00:00Z"\n', "")
    path = tmp_path / "dated-a3mega.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load(path)
    (line,) = [str(p) for p in err.value.problems]
    assert re.search(r"dated-a3mega\.yaml:\d+: gke\.upgrade_exclusion\.start_time: start_time without end_time", line), line
    assert "remove both" in line


def _possible(param: str) -> list[str]:
    doc = providers.google.compute_subnetwork.ComputeSubnetworkLogConfig.__init__.__doc__ or ""
    (values,) = re.findall(rf":param {param}:.*?Possible values: \[([^\]]*)\]", doc)
    return re.findall(r'"([A-Z0-9_]+)"', values)


def test_flow_log_values_are_the_providers():
    fields = GcpConfig.model_fields
    assert list(fields["flow_log_interval"].annotation.__args__) == _possible("aggregation_interval")
    assert set(fields["flow_log_metadata"].annotation.__args__) == set(_possible("metadata")) - {"CUSTOM_METADATA"}


def test_primary_subnet_logs_flows_cheaply_by_default(dated):
    stack = json.loads(cdktf.Testing.synth(ClusterStack(cdktf.Testing.app(), dated)))
    log = stack["resource"]["google_compute_subnetwork"]["subnet"]["log_config"]
    assert (log["aggregation_interval"], log["metadata"]) == ("INTERVAL_15_MIN", "EXCLUDE_ALL_METADATA")
    louder = dated.model_copy(update={"gcp": dated.gcp.model_copy(update={"flow_log_interval": "INTERVAL_5_SEC", "flow_log_metadata": "INCLUDE_ALL_METADATA"})})
    log = json.loads(cdktf.Testing.synth(ClusterStack(cdktf.Testing.app(), louder)))["resource"]["google_compute_subnetwork"]["subnet"]["log_config"]
    assert (log["aggregation_interval"], log["metadata"]) == ("INTERVAL_5_SEC", "INCLUDE_ALL_METADATA")


def test_new_cluster_closes_the_public_ip_endpoint_beside_the_dns_endpoint(dated):
    assert dated.gke.private_endpoint is None and dated.gke.dns_endpoint
    assert derive_control_plane(dated).private_endpoint is True
    stack = json.loads(cdktf.Testing.synth(ClusterStack(cdktf.Testing.app(), dated)))
    assert stack["resource"]["google_container_cluster"]["gke"]["private_cluster_config"]["enable_private_endpoint"] is True
    kept = dated.model_copy(update={"gke": dated.gke.model_copy(update={"private_endpoint": False})})
    assert derive_control_plane(kept).private_endpoint is False
    no_dns = dated.model_copy(update={"gke": dated.gke.model_copy(update={"dns_endpoint": False})})
    assert derive_control_plane(no_dns).private_endpoint is False
