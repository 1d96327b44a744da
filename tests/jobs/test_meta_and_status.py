"""Dispatch parameters are checked before anything reaches Nomad; Nomad's answers become one
of five states with the reason a user can act on."""

from __future__ import annotations

import pytest

from clusters.errors import UserError
from jobs.loader import find, load
from jobs.meta import parse_pairs, validate_meta
from jobs.nomad.placement import explain
from jobs.spec import FinetuneSpec, GpuRequest
from jobs.nomad.status import RunState, summarize


@pytest.fixture(scope="module")
def llama() -> FinetuneSpec:
    return load(find("finetune-llama"))


GOOD = {"run_id": "demo-1"}


@pytest.mark.parametrize("uri", ["hf://datasets/demo/tiny@v1", "gs://acme-data/chat/v3/", "s3://acme/sets/version=2026-11/", "hf://datasets/acme/chat@4f2c9e1", "gs://b/x/v2.1"])
def test_dataset_uri_with_scheme_and_version_is_accepted(llama: FinetuneSpec, uri: str) -> None:
    assert validate_meta(llama, {**GOOD, "dataset_uri": uri}) == {"dataset_uri": uri, "run_id": "demo-1"}


@pytest.mark.parametrize(
    ("meta", "message"),
    [
        ({**GOOD, "dataset_uri": "ftp://mirror/tiny@v1"}, r"no allowed scheme; allowed: gs://, s3://, hf://"),
        ({**GOOD, "dataset_uri": "hf://datasets/demo/tiny"}, r"names no version, so the run is not reproducible; add '@v3'"),
        ({**GOOD, "dataset_uri": "gs://bucket with space/v1"}, r"printable characters without spaces"),
        ({"dataset_uri": "hf://d/x@v1", "run_id": "Demo 1"}, r"printable characters without spaces"),
        ({"dataset_uri": "hf://d/x@v1", "run_id": "Demo-1"}, r"run_id 'Demo-1' is not allowed; use 1-63 lowercase"),
        ({"dataset_uri": "hf://d/x@v1"}, r"job finetune-llama needs --meta run_id=\.\.\.; required: dataset_uri, run_id"),
        ({**GOOD, "dataset_uri": "hf://d/x@v1", "datset": "x"}, r"--meta datset is not declared by job finetune-llama \(did you mean 'dataset_uri'\?\); allowed: dataset_uri, run_id, base_model; add it to meta_optional"),
        ({**GOOD, "dataset_uri": "hf://d/x@v1", "base_model": "hf_" + "Q" * 30}, r"looks like a credential \(not shown\)"),
    ],
)
def test_fails_when_dispatch_meta_is_wrong(llama: FinetuneSpec, meta: dict[str, str], message: str) -> None:
    with pytest.raises(UserError, match=message) as caught:
        validate_meta(llama, meta)
    assert "Q" * 30 not in str(caught.value)


def test_fails_when_meta_pair_is_malformed() -> None:
    with pytest.raises(UserError, match=r"--meta 'dataset_uri' is not key=value"):
        parse_pairs(["dataset_uri"])
    with pytest.raises(UserError, match=r"--meta run_id is given twice"):
        parse_pairs(["run_id=a", "run_id=b"])


GPU2 = GpuRequest(count=2, min_memory_gib=40, prefer_memory_gib=None, model=None)


def _metric(**fields: object) -> dict[str, object]:
    return {"NodesEvaluated": 3, "NodesInPool": 3, "NodesFiltered": 0, "ConstraintFiltered": {}, "DimensionExhausted": {}, "ClassFiltered": {}, **fields}


def test_busy_gpus_read_like_the_request() -> None:
    failed = {"train": _metric(NodesExhausted=3, DimensionExhausted={"devices: no devices match request": 3})}
    assert explain(failed, pool="a100", gpu=GPU2) == "no client in pool a100 has 2 free GPUs with >= 40 GiB (3 clients busy); wait for running jobs to finish or ask for fewer GPUs"


def test_empty_pool_wrong_class_and_missing_devices_are_named() -> None:
    assert explain({"train": _metric(NodesEvaluated=0, NodesInPool=0)}, pool="l4", gpu=GPU2) == "no client in pool l4 is ready (0 nodes in node pool l4); start or scale up the pool's clients"
    mixed = _metric(ConstraintFiltered={"${node.class} = a100": 1, "missing devices": 2}, DimensionExhausted={"memory": 1})
    assert explain({"train": mixed}, pool="a100", gpu=GPU2) == (
        "1 client in pool a100 has another node_class (expected a100); fix the clients' node_class; "
        "2 clients in pool a100 cannot offer 2 GPUs with >= 40 GiB at all (missing, unhealthy or not matching); check the clients' GPUs or the job's gpu section; "
        "memory exhausted on 1 client; lower cpu_mhz/memory_mb/disk_mb or wait"
    )
    assert explain(None, pool="a100", gpu=GPU2) is None


def _alloc(status: str, **fields: object) -> dict[str, object]:
    return {"ID": "alloc-1", "NodeName": "a100-0", "ClientStatus": status, "DesiredStatus": "run", "CreateIndex": 10, **fields}


def test_failed_run_shows_the_failing_tasks_last_event() -> None:
    events = [{"Type": "Started", "DisplayMessage": "Task started by client"}, {"Type": "Terminated", "DisplayMessage": "Exit Code: 78"}]
    older = _alloc("complete", ID="alloc-0", CreateIndex=5)
    newest = _alloc("failed", TaskStates={"train": {"Failed": True, "Events": events}})
    status = summarize("j/dispatch-1", {}, [], [older, newest])
    assert (status.state, status.detail, status.alloc_id) == (RunState.FAILED, "task train: Terminated: Exit Code: 78", "alloc-1")


@pytest.mark.parametrize(("client_status", "state"), [("pending", RunState.PENDING), ("running", RunState.RUNNING), ("complete", RunState.COMPLETE), ("lost", RunState.LOST), ("unknown", RunState.LOST)])
def test_client_status_maps_to_five_states(client_status: str, state: RunState) -> None:
    assert summarize("j", {}, [], [_alloc(client_status)]).state == state


def test_unplaced_run_is_pending_with_the_placement_reason() -> None:
    failed = {"train": _metric(DimensionExhausted={"devices: no devices match request": 3})}
    evaluations = [{"ID": "e1", "Status": "complete", "FailedTGAllocs": failed, "CreateIndex": 1}, {"ID": "e2", "Status": "blocked", "CreateIndex": 2}]
    status = summarize("j", {}, evaluations, [], pool="a100", gpu=GPU2)
    assert status.state == RunState.PENDING
    assert status.detail.startswith("waiting for capacity: no client in pool a100 has 2 free GPUs with >= 40 GiB")


def test_failed_evaluation_and_stopped_job() -> None:
    assert summarize("j", {}, [{"ID": "e", "Status": "failed", "StatusDescription": "maximum attempts reached", "CreateIndex": 1}], []).detail == "evaluation failed: maximum attempts reached"
    assert summarize("j", {"Stop": True}, [], []).state == RunState.COMPLETE
    assert summarize("j", {}, [], [_alloc("complete", DesiredStatus="stop")]).detail == "stopped by request"
