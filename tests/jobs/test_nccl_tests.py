"""The two-node NCCL bandwidth tests (jobs/nccl-test-<family>.yaml, jobs/tasks/nccl_perf.py), checked off the hardware.

The collectives need two GPU nodes and were not run here. What is checked: the figures the task
prints are nccl-tests' own (recomputed from rows upstream published), each job file targets its
family's GPUDirect pool in the example fleet, gates at most the bandwidth upstream documents and
at least what a TCP fallback cannot reach, and renders into pods the schemas and the tenant
privilege policy accept.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from clusters.families import GpuDirect, machine_family
from jobs.k8s.render import manifests
from jobs.k8s.schemas import errors
from jobs.loader import find, load
from jobs.tasks.nccl_perf import EXIT_KEY_MISSING, Row, main, memlock_limit, network_from_log, parse_size, sweep, verdict

# family job -> (transport, upstream all_gather busbw GB/s on 2 x 8 GPUs, at size B, the row upstream printed:
# time in us, algbw, busbw; source). Both rows are from cluster-toolkit v1.95.0 (1047080375afbb44).
UPSTREAM = {
    "nccl-test-a3high": (GpuDirect.TCPX, 536870912, 7098.6, 75.63, 70.90, "examples/gke-a3-highgpu/multi-node-test-plan.md:131"),
    "nccl-test-a3mega": (GpuDirect.TCPXO, 8589934592, 42668.7, 201.32, 188.73, "examples/gke-a3-megagpu/README.md:146"),
}
# eth0 is one gVNIC beside the GPU NICs (A3 High: 1,000 Gbps across its NICs, A3 Mega 1,600; Compute Engine
# "Networking and GPU machines", cloud.google.com/compute/docs/gpus/gpu-network-bandwidth): at 200 Gbps
# that is 25 GB/s, and busbw over one link cannot exceed it.
TCP_FALLBACK_CEILING_GBPS = 25


@pytest.mark.parametrize("job", sorted(UPSTREAM))
def test_bus_bandwidth_is_nccl_tests_own_figure(job):
    _transport, size, micros, algbw, busbw, _source = UPSTREAM[job]
    row = Row("all_gather", size, micros / 1e6, 16)
    assert round(row.algbw_gbps, 2) == algbw and round(row.busbw_gbps, 2) == busbw


def test_all_reduce_moves_twice_the_bus_traffic_of_all_gather():
    """nccl-tests doc/PERFORMANCE.md: all_reduce busbw = algbw * 2(n-1)/n, all_gather (n-1)/n."""
    gather, reduce = Row("all_gather", 1 << 30, 0.01, 16), Row("all_reduce", 1 << 30, 0.01, 16)
    assert reduce.busbw_gbps == pytest.approx(2 * gather.busbw_gbps) and gather.busbw_gbps == pytest.approx(gather.algbw_gbps * 15 / 16)


def test_the_sweep_is_upstreams():
    """Upstream's TCPX run (-b 1M -e 512M -f 2) printed ten sizes, 1048576 to 536870912."""
    sizes = sweep(parse_size("1M"), parse_size("512M"))
    assert sizes[0] == 1048576 and sizes[-1] == 536870912 and len(sizes) == 10
    assert parse_size("8G") == 8589934592
    with pytest.raises(ValueError, match="write bytes with an optional K, M or G"):
        parse_size("8GB")


def test_verdict_passes_upstreams_figure_and_fails_a_tcp_fallback():
    good = [Row("all_gather", 536870912, 7098.6e-6, 16), Row("all_reduce", 536870912, 0.02, 16)]
    assert verdict(good, 56)[0] is True
    slow = [Row("all_gather", 536870912, 536870912 / (TCP_FALLBACK_CEILING_GBPS * 1e9) * 15 / 16, 16)]
    ok, message = verdict(slow, 56)
    assert ok is False and "below the minimum 56 GB/s" in message
    assert verdict([Row("all_reduce", 1 << 20, 1e-3, 16)], 56)[0] is False


def test_the_network_nccl_chose_is_read_from_its_log():
    log = "host:1:1 [0] NCCL INFO NET/Plugin: Loaded\nhost:1:1 [0] NCCL INFO Using network Socket\n"
    assert network_from_log(log) == "Socket" and network_from_log("nothing") is None
    assert memlock_limit() == "unlimited" or memlock_limit().isdigit()


def test_a_missing_vault_key_stops_before_any_collective(monkeypatch, capsys):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    assert main(["--min-busbw-gbps", "56", "--require-env", "HF_TOKEN"]) == EXIT_KEY_MISSING
    assert "missing from Vault: HF_TOKEN" in capsys.readouterr().err


def _arg(spec: Any, flag: str) -> str:
    words = " ".join(spec.args).split()
    return words[words.index(flag) + 1]


@pytest.fixture(scope="module")
def specs(cluster_configs, vault_view) -> dict[str, Any]:
    return {job: load(find(job), cluster_configs=cluster_configs, vault=vault_view) for job in UPSTREAM}


@pytest.mark.parametrize("job", sorted(UPSTREAM))
def test_each_family_job_gates_between_a_fallback_and_upstreams_figure(specs, job):
    transport, size, _micros, _algbw, busbw, _source = UPSTREAM[job]
    spec = specs[job]
    assert machine_family(spec.pool.machine_type).gpudirect is transport and spec.pool.gpudirect is transport
    assert (spec.nodes, spec.gpu.count) == (2, 8)
    assert parse_size(_arg(spec, "--max-bytes")) == size
    minimum = float(_arg(spec, "--min-busbw-gbps"))
    assert TCP_FALLBACK_CEILING_GBPS < minimum <= busbw
    assert f"{busbw:.2f}" in find(job).read_text()
    # The pass mark is 80% of upstream's example output, rounded down, and the file says it is a heuristic.
    assert minimum == math.floor(0.8 * busbw) and "80% of upstream's figure, a heuristic" in find(job).read_text()


@pytest.mark.parametrize("job", sorted(UPSTREAM))
def test_the_nccl_jobs_keep_their_secret_to_prove_the_vault_flow_on_their_nodes(specs, job):
    """A job may omit secrets (issue 27), but these keep one on purpose and check that it arrived."""
    spec = specs[job]
    assert spec.vault_role == "finetune" and dict(spec.secrets) == {"HF_TOKEN": "ml-api-keys/huggingface#token"}
    assert "--require-env HF_TOKEN" in " ".join(spec.args).replace(", ", " ")


@pytest.mark.parametrize("job", sorted(UPSTREAM))
def test_each_family_job_renders_pods_the_schemas_and_the_privilege_policy_accept(specs, job):
    from constructs_lib.k8s_queue_policy import privilege_rule
    from tests.constructs_lib.test_queue_policy import JOB_OWNER, evaluate

    docs = manifests(specs[job], dispatch_id="d-1", meta={"run_id": "r"})
    assert [e for d in docs for e in errors(d)] == []
    template = next(d for d in docs if d["kind"] == "Job")["spec"]["template"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {**template["metadata"], "ownerReferences": [JOB_OWNER]}, "spec": template["spec"]}
    assert evaluate(privilege_rule(), pod) is True


def test_every_gpudirect_family_of_the_example_fleet_has_its_test(cluster_configs):
    """RDMA (A3 Ultra / A4) has no pool in the example fleet, so no job file yet (docs/large-runs.md)."""
    in_fleet = {machine_family(p.machine_type).gpudirect for c in cluster_configs for p in c.gpu_pools} - {GpuDirect.NONE}
    assert in_fleet == {t for t, *_ in UPSTREAM.values()}
