"""checkov (real, offline) over stack directories in parallel: failures attributed per stack, skips honoured."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from clusters.errors import UserError
from safety import checkov_scan

OPEN_SSH = {
    "resource": {
        "google_compute_firewall": {
            "ssh": {"name": "ssh", "network": "default", "allow": [{"protocol": "tcp", "ports": ["22"]}], "source_ranges": ["0.0.0.0/0"]}
        }
    }
}


@pytest.fixture(scope="module")
def stacks(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """A failing stack, a stack checkov has nothing to say about, and one it cannot parse."""
    root = tmp_path_factory.mktemp("stacks")
    bodies = {"open-ssh": json.dumps(OPEN_SSH, indent=2), "quiet": json.dumps({"resource": {"terraform_data": {"x": {"input": "y"}}}}), "broken": "{ not json"}
    for name, body in bodies.items():
        (root / name).mkdir()
        (root / name / "cdk.tf.json").write_text(body)
    return [root / name for name in bodies]


@pytest.fixture(scope="module")
def unskipped(stacks: list[Path]) -> checkov_scan.CheckovSummary:
    """Three stacks scanned together; results are split back per stack and merged into one summary."""
    return checkov_scan.run(stacks, skip_ids=(), workers=2)


def test_failures_are_attributed_to_their_stack(unskipped: checkov_scan.CheckovSummary) -> None:
    by_stack = {s.stack: s for s in unskipped.stacks}
    assert not unskipped.ok
    assert "CKV_GCP_2" in {f.check_id for f in by_stack["open-ssh"].failures}
    assert by_stack["quiet"].failures == () and by_stack["quiet"].error is None
    assert any(line.startswith("checkov: open-ssh: CKV_GCP_2 ") and "google_compute_firewall.ssh" in line for line in unskipped.failure_lines)
    assert unskipped.summary_line.startswith("3 stack(s): ") and "checkov errored on broken" in unskipped.summary_line
    assert by_stack["open-ssh"].passed > 0


def test_reviewed_skips_are_passed_to_checkov(stacks: list[Path], unskipped: checkov_scan.CheckovSummary) -> None:
    failing = sorted({f.check_id for s in unskipped.stacks for f in s.failures})
    result = checkov_scan.run(stacks[:2], skip_ids=failing, workers=1)
    assert result.ok, result.failure_lines
    assert result.summary_line.endswith(f"{len(failing)} check(s) skipped by .checkov-skips.yaml")


def test_unparseable_stack_is_an_error_not_a_pass(unskipped: checkov_scan.CheckovSummary) -> None:
    broken = next(s for s in unskipped.stacks if s.stack == "broken")
    assert broken.error == "checkov could not parse cdk.tf.json; a stack it cannot read is not a pass"
    assert f"checkov: broken: error: {broken.error}" in unskipped.failure_lines


def test_fails_when_checkov_is_missing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(UserError, match="checkov not found"):
        checkov_scan.checkov_binary()


def test_small_fleets_use_one_process_and_large_ones_spread_over_cores() -> None:
    assert checkov_scan.default_workers(6) == 1
    assert checkov_scan.default_workers(40) == min(checkov_scan.os.cpu_count() or 1, 5)


def test_required_findings_are_exempted_per_resource_not_per_check(example_configs, tmp_path: Path) -> None:
    """A held-out cluster shape (A3 Ultra pool + a DWS pool) failed `gpufleet check`: checkov wants
    auto-repair/upgrade on every pool (DWS forbids it) and a VPC firewall on every network (a RoCE
    VPC cannot have one). Exempted for exactly those resources, derived from the JSON; the same
    findings on any other resource still fail."""
    from cdktf import Testing

    from safety.checkov_exempt import exemptions
    from stacks.fleet import build_fleet

    prod = next(c for c in example_configs if c.name == "prod-gke")
    ultra = prod.gpu_pools[0].model_copy(update={"machine_type": "a3-ultragpu-8g"})
    dws = prod.gpu_pools[1].model_copy(update={"spot": False, "queued_provisioning": True})
    config = prod.model_copy(update={"gpu_pools": (ultra, dws)})
    infra = json.loads(Testing.synth(build_fleet(Testing.app(), (config,)).stacks["prod-gke"]))
    (tmp_path / "prod-gke").mkdir()
    (tmp_path / "prod-gke" / "cdk.tf.json").write_text(json.dumps(infra, indent=2))
    summary = checkov_scan.run([tmp_path / "prod-gke"], workers=1)
    assert summary.ok, summary.failure_lines
    exempted = sorted((f.check_id, f.resource) for s in summary.stacks for f in s.exempted)
    subnets = infra["resource"]["google_compute_subnetwork"]
    rdma = sorted(name for name, subnet in subnets.items() if subnet["network"] == "${google_compute_network.rdma.id}")
    assert len(rdma) == 8 and all("log_config" not in subnets[n] and "private_ip_google_access" not in subnets[n] for n in rdma)
    assert all(subnet.get("private_ip_google_access") is True for name, subnet in subnets.items() if name not in rdma)
    pool = f"google_container_node_pool.pool_{dws.name.replace('-', '_')}"
    assert exempted == sorted([("CKV2_GCP_18", "google_compute_network.rdma"), ("CKV_GCP_10", pool), ("CKV_GCP_9", pool),
                               ("CKV_GCP_62", "google_storage_bucket.checkpoint_bucket"),
                               *((check, f"google_compute_subnetwork.{n}") for n in rdma for check in ("CKV_GCP_26", "CKV_GCP_74"))]), exempted
    # The same settings on resources that do not require them are not exempted.
    plain = json.loads(json.dumps(infra))
    for pool in plain["resource"]["google_container_node_pool"].values():
        pool.pop("queued_provisioning", None)
    for network in plain["resource"]["google_compute_network"].values():
        network.pop("network_profile", None)
    for bucket in plain["resource"]["google_storage_bucket"].values():
        bucket["labels"].pop("gpufleet-purpose")  # a bucket that is not the checkpoint bucket
    assert "rdma" in plain["resource"]["google_compute_network"]
    assert list(exemptions(plain)) == []
    # Labels that are a reference, not a map, cannot show the checkpoint label: no exemption, and no traceback
    # (an AttributeError on str.get before)
    for bucket in plain["resource"]["google_storage_bucket"].values():
        bucket["labels"] = "${local.tags}"
    assert list(exemptions(plain)) == []


def test_a_prestarted_worker_scans_and_no_other_process_starts(stacks: list[Path], unskipped: checkov_scan.CheckovSummary,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """``gpufleet check`` starts one worker before synthesis (its imports overlap the synthesis); the scan then
    runs on it, with the same results as a scan that started its own, and starts no second process for one chunk."""
    monkeypatch.setenv("GPUFLEET_CHECKOV_CACHE", "off")
    warm = checkov_scan.prestart(skip_ids=())
    started: list[object] = []
    real_init = checkov_scan._Worker.__init__
    monkeypatch.setattr(checkov_scan._Worker, "__init__", lambda self, *a: (started.append(self), real_init(self, *a))[1])
    summary = checkov_scan.run(stacks, skip_ids=(), workers=1, warm=warm)
    assert started == [] and warm.ended and warm.process.returncode == 0
    assert summary == unskipped


def test_a_prestarted_worker_with_nothing_to_scan_is_ended_at_once(tmp_path: Path) -> None:
    """All stacks cached (or none): the worker is killed, not waited for through its imports, and never outlives
    the check, even when the check fails before the scan."""
    with checkov_scan.warmed(True) as warm:
        assert warm is not None
        checkov_scan.run([], skip_ids=(), warm=warm)
    assert warm.ended and warm.process.returncode is not None and warm.process.returncode < 0
    with pytest.raises(RuntimeError), checkov_scan.warmed(True) as failing:
        raise RuntimeError("synthesis failed")
    assert failing is not None and failing.ended and failing.process.returncode is not None


def test_a_prestarted_worker_from_another_environment_is_not_used(stacks: list[Path], unskipped: checkov_scan.CheckovSummary,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's environment is fixed when it starts; checkov reads options from it (CKV_SKIP_CHECK is
    ``--skip-check``'s env_var, checkov/common/util/ext_argument_parser.py:291 at 3.3.30) and the cache key
    hashes the environment of the run (safety/checkov_cache.py _checkov_settings). A worker prestarted with a
    check skipped by the environment, used after that variable is gone, would drop the finding and cache the
    drop under the new key: it is discarded and a worker with the scan's own environment scans."""
    monkeypatch.setenv("GPUFLEET_CHECKOV_CACHE", "off")
    monkeypatch.setenv("CKV_SKIP_CHECK", "CKV_GCP_2")
    warm = checkov_scan.prestart(skip_ids=())
    monkeypatch.delenv("CKV_SKIP_CHECK")
    summary = checkov_scan.run(stacks, skip_ids=(), workers=1, warm=warm)
    assert warm.ended
    assert summary == unskipped


HANGING_WORKER = r'''
import json, sys, time
for line in sys.stdin:
    if any("hang" in path for path in json.loads(line)):
        time.sleep(3600)  # a hung checkov: no answer, ever
    sys.stdout.write(json.dumps({"reports": []}) + "\n")
    sys.stdout.flush()
'''


def _stand_in_scan(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, names: tuple[str, ...]):
    """The stand-in worker (``HANGING_WORKER``) in checkov's place, one chunk per name (an empty stack each), and
    where the results land: (chunks, results by stack, the ``done`` callback for ``scan_chunks``)."""
    script = tmp_path / "worker.py"
    script.write_text(HANGING_WORKER)
    monkeypatch.setattr(checkov_scan, "WORKER", script)
    chunks = []
    for name in names:
        (tmp_path / name).mkdir()
        (tmp_path / name / "cdk.tf.json").write_text("{}")
        chunks.append((tmp_path / name,))
    results: dict[str, checkov_scan.StackResult] = {}
    return chunks, results, lambda chunk, scanned: results.update((r.stack, r) for r in scanned)


def test_a_worker_that_never_answers_is_stopped_and_the_rest_are_scanned(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A hung checkov made `gpufleet check` wait forever: the chunk's worker is now killed after
    GPUFLEET_CHECKOV_TIMEOUT_SECONDS, its stacks get that as their error (never cached: errors are not stored),
    and the next chunk gets a fresh worker. The worker here is a stand-in that hangs on a stack named "hang"
    and answers an empty report otherwise (fails on the code before the change: the scan never returns)."""
    import threading

    monkeypatch.setenv(checkov_scan.TIMEOUT_ENV, "1")
    chunks, results, done = _stand_in_scan(monkeypatch, tmp_path, ("hang", "fine"))
    scan = threading.Thread(target=checkov_scan.scan_chunks, args=(chunks, (), checkov_scan.checkov_binary(), 1, done), daemon=True)
    scan.start()
    scan.join(60)
    assert not scan.is_alive(), "the scan still waits on a worker that never answers"
    assert results["hang"].error == f"checkov gave no answer within 1 s ({checkov_scan.TIMEOUT_ENV}); its worker was stopped"
    assert results["fine"].error is None  # a fresh worker took the chunk after the stopped one


@pytest.mark.parametrize("raw", ["soon", "0", "-5", "inf", "nan"])
def test_a_bad_checkov_timeout_is_one_line(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv(checkov_scan.TIMEOUT_ENV, raw)
    with pytest.raises(UserError, match=rf"^{checkov_scan.TIMEOUT_ENV}=.*not a positive number of seconds; set it to"):
        checkov_scan.answer_timeout()


class _LateTimer:
    """A ``threading.Timer`` that fires just as it is cancelled: ``Timer.run`` checks ``finished`` and then calls the
    function, so a ``cancel`` between the two returns while the kill is still to come (CPython Lib/threading.py,
    class Timer, ``run``). The late kill lands when the next chunk's timer is made, unless ``join`` waited for it."""

    pending: list = []

    def __init__(self, interval: float, function) -> None:  # noqa: ANN001 - threading.Timer's signature
        while _LateTimer.pending:
            _LateTimer.pending.pop()()
        self.function, self.daemon = function, True

    def start(self) -> None:
        pass

    def cancel(self) -> None:
        _LateTimer.pending.append(self.function)

    def join(self, timeout: float | None = None) -> None:
        while _LateTimer.pending:
            _LateTimer.pending.pop()()


def test_a_timer_that_fires_as_the_answer_arrives_does_not_kill_the_next_chunk(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The answer came in time, but the timer fired as it was cancelled: the chunk's results stand, and the kill
    must not land on the same worker once it scans the next chunk (that chunk was reported as timed out, though it
    took no time at all). Fails on f84b0aa: the second chunk gets the timeout error."""
    chunks, results, done = _stand_in_scan(monkeypatch, tmp_path, ("first", "second"))
    monkeypatch.setattr(checkov_scan.threading, "Timer", _LateTimer)
    _LateTimer.pending.clear()
    checkov_scan.scan_chunks(chunks, (), checkov_scan.checkov_binary(), 1, done)
    assert results["first"].error is None
    assert results["second"].error is None
