"""GKE logs: each rank's pod log through the official client (``read_namespaced_pod_log``) against
the Kubernetes API double, which answers as the API server and kubelet do (jobs/k8s/logs.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from jobs.k8s import logs as k8s_logs
from jobs.k8s.client import K8sError, K8sRunGone
from jobs.loader import find, load
from jobs.logs import LogsFilterRefused
from jobs.runner import GkeRunner, RunNotFound
from tests.jobs.k8s.test_client import META, Minter

NS = "research"


@pytest.fixture
def running(k8s: Any, k8s_client_for: Callable[..., Any], cluster_configs: Any, vault_view: Any) -> tuple[Any, str]:
    """A two-rank run of finetune-llama-gke, admitted, both ranks running: (client, Job name)."""
    spec = load(find("finetune-llama-gke"), cluster_configs=cluster_configs, vault=vault_view)
    client = k8s_client_for(k8s)
    run = client.dispatch(spec, META, dispatch_id="logs-1", mint=Minter()).run
    k8s.admit(NS, run, cluster_queue=NS, flavor="h100")
    k8s.pods_ready(NS, run, 2)
    return client, run


def test_ranks_are_the_completion_indexes_of_the_jobs_pods(k8s: Any, running) -> None:
    client, run = running
    pods = k8s_logs.rank_pods(client, NS, run)
    assert pods == k8s.pods(NS, run) and sorted(pods) == [0, 1]
    assert pods[1].startswith(f"{run}-1-")  # Indexed pods are named <job>-<index>-<suffix>
    listed = [r for r in k8s.requests if r.path == f"/api/v1/namespaces/{NS}/pods"][0]
    assert listed.query == {"labelSelector": [f"batch.kubernetes.io/job-name={run}"]}


def test_the_tail_asks_the_train_container_and_rank_picks_the_pod(k8s: Any, running) -> None:
    client, run = running
    k8s.write_pod_log(NS, run, 0, "rank zero\n")
    k8s.write_pod_log(NS, run, 1, "".join(f"r1 step {i}\n" for i in range(5)))
    pod = k8s.pods(NS, run)[1]
    assert k8s_logs.read_tail(client, NS, pod, tail_bytes=20, since_seconds=None) == b"\nr1 step 3\nr1 step 4\n"  # 20 and one more
    request = [r for r in k8s.requests if r.path.endswith("/log")][-1]
    assert request.path == f"/api/v1/namespaces/{NS}/pods/{pod}/log"
    assert request.query == {"container": ["train"], "follow": ["False"], "tailLines": [str(k8s_logs.TAIL_LINES_CAP)]}
    runner = GkeRunner(client, {})
    assert b"".join(runner.logs(f"gke:{NS}/{run}", rank=0)) == b"rank zero\n"
    with pytest.raises(LogsFilterRefused, match="ranks 0..1"):
        runner.logs(f"gke:{NS}/{run}", rank=2)
    with pytest.raises(LogsFilterRefused, match="one log"):
        runner.logs(f"gke:{NS}/{run}", stderr=True)


def test_a_container_not_in_the_pod_is_400_and_a_gone_pod_is_404(k8s: Any, running) -> None:
    client, run = running
    pod = k8s.pods(NS, run)[0]
    with pytest.raises(K8sError, match=f"400 BadRequest \\(container sidecar is not valid for pod {pod}\\)"):
        k8s_logs.read_tail(client, NS, pod, tail_bytes=10, since_seconds=None, container="sidecar")
    k8s.remove_job(NS, run)
    with pytest.raises(K8sRunGone):
        k8s_logs.read_tail(client, NS, pod, tail_bytes=10, since_seconds=None)
    with pytest.raises(RunNotFound):
        b"".join(GkeRunner(client, {}).logs(f"gke:{NS}/{run}"))


def test_a_waiting_container_has_no_output_yet(k8s: Any, k8s_client_for: Callable[..., Any], cluster_configs: Any, vault_view: Any) -> None:
    spec = load(find("finetune-llama-gke"), cluster_configs=cluster_configs, vault=vault_view)
    client = k8s_client_for(k8s)
    run = client.dispatch(spec, META, dispatch_id="logs-2", mint=Minter()).run
    k8s.admit(NS, run, cluster_queue=NS, flavor="h100")  # pods made, containers still creating
    assert k8s_logs.read_tail(client, NS, k8s.pods(NS, run)[0], tail_bytes=10, since_seconds=None) == b""


def test_follow_streams_until_the_container_exits(k8s: Any, running) -> None:
    client, run = running
    k8s.write_pod_log(NS, run, 1, "before\n")
    chunks = k8s_logs.follow(client, NS, k8s.pods(NS, run)[1], tail_lines=None, since_seconds=None, stop=threading.Event())
    assert next(chunks) == b"before\n"
    k8s.write_pod_log(NS, run, 1, "after\n")
    assert next(chunks) == b"after\n"
    k8s.succeed(NS, run)
    assert b"".join(chunks) == b""  # the API server closed the stream: the container exited
    request = [r for r in k8s.requests if r.path.endswith("/log")][-1]
    assert request.query["follow"] == ["True"] and request.query["container"] == ["train"]


def test_a_tail_window_that_begins_inside_a_credential_drops_that_piece(k8s: Any, running) -> None:
    import random

    from jobs.logs import read_logs
    from tests.safety.test_secret_matrix import NEW_FORMATS

    client, run = running
    planted = NEW_FORMATS(random.Random(13))["groq"]
    k8s.write_pod_log(NS, run, 0, f"GROQ_API_KEY={planted}\nstep 1\n")
    text = read_logs(GkeRunner(client, {}), f"gke:{NS}/{run}", tail_bytes=len(planted) - 4 + len("\nstep 1\n"))
    assert text == "step 1\n" and planted[-12:] not in text
