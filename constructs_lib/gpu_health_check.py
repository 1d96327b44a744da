"""The GPU health checker the scheduler stack runs on every GPU node (constructs_lib/gpu_health.py ships this file in a ConfigMap).

Standard library only: it runs in a plain Python image. Every ``INTERVAL_SECONDS`` it asks the host's
``nvidia-smi`` for each GPU's uncorrected volatile ECC count and compares the number of GPUs with what
the node's pool has, the two checks of the GPU health gate in Google's cluster-toolkit
(examples/gke-consumption-options/dws-flex-start/nccl-jobset-example.yaml, init container
``gpu-healthcheck``: fewer GPUs than expected, an ECC count of ``[N/A]`` (the GPU is in an error state)
or above 0 fail the node), plus the node condition GKE's NVIDIA device plugin sets on a critical XID
(``XidCriticalError``, container-engine-accelerators pkg/gpu/nvidia/health_check/health_checker.go:41,
XIDs 48, 63, 64, 79, 119, 120, 123, 140 at :91 at commit 992db812): the scheduler ignores conditions, and
the plugin resets that one after it restarts (:129-157). A failing node gets the taint ``gpufleet.dev/gpu-unhealthy=true:NoSchedule``,
once, with the reason in an annotation: no run's pods tolerate it (they tolerate only their pool's
taints), so the next multi-node run is placed on other nodes. The taint is never removed here: a GPU
that fails and then passes is still suspect; GKE's repair replaces the node (a new node has no taint),
or an operator removes it (docs/large-runs.md).

The node is changed with a JSON merge patch carrying the ``resourceVersion`` it read, so a concurrent
writer of the node's taints makes the API server answer 409 and the next round re-reads, instead of
one writer dropping the other's taint (merge patch replaces the whole list).
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

TAINT_KEY = "gpufleet.dev/gpu-unhealthy"
TAINT_VALUE = "true"
TAINT_EFFECT = "NoSchedule"
REASON_ANNOTATION = "gpufleet.dev/gpu-unhealthy-reason"
POOL_LABEL = "gpufleet.dev/gpu-pool"
XID_CONDITION = "XidCriticalError"
QUERY = ("--query-gpu=index,ecc.errors.uncorrected.volatile.total", "--format=csv,noheader,nounits")
INTERVAL_SECONDS = 300
SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


def faults(csv_text: str, expected_gpus: int) -> list[str]:
    """What is wrong with a node from ``nvidia-smi`` CSV (index, uncorrected volatile ECC); empty when healthy."""
    rows = [[cell.strip() for cell in line.split(",")] for line in csv_text.strip().splitlines() if line.strip()]
    found = []
    if len(rows) < expected_gpus:
        found.append(f"{len(rows)} GPUs visible, the pool's machine has {expected_gpus}")
    for index, ecc in rows:
        if ecc == "[N/A]":
            found.append(f"GPU {index} reports its ECC count as [N/A] (an error state)")
        elif ecc.isdigit() and int(ecc) > 0:
            found.append(f"GPU {index} has {ecc} uncorrected ECC errors")
    return found


def condition_faults(node: dict[str, Any]) -> list[str]:
    """The device plugin's XID condition when it is True (its reason names the XIDs seen)."""
    conditions = (node.get("status") or {}).get("conditions") or []
    return [f"node condition {XID_CONDITION}: {c.get('reason') or 'critical XID'}" for c in conditions
            if c.get("type") == XID_CONDITION and c.get("status") == "True"]


def taint_patch(node: dict[str, Any], reason: str) -> dict[str, Any] | None:
    """The merge patch that adds the taint, or None when the node has it already (the taint stays as first written)."""
    taints = list((node.get("spec") or {}).get("taints") or [])
    if any(t.get("key") == TAINT_KEY for t in taints):
        return None
    taints.append({"key": TAINT_KEY, "value": TAINT_VALUE, "effect": TAINT_EFFECT})
    return {"metadata": {"resourceVersion": node["metadata"]["resourceVersion"], "annotations": {REASON_ANNOTATION: reason[:1000]}},
            "spec": {"taints": taints}}


class Api:
    """The few calls the checker makes: GET and merge-PATCH of its own Node, with the pod's service account."""

    def __init__(self, base_url: str, token: str, context: ssl.SSLContext | None) -> None:
        self.base_url, self.token, self.context = base_url.rstrip("/"), token, context

    @classmethod
    def in_cluster(cls) -> Api:
        host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
        with open(f"{SERVICE_ACCOUNT}/token", encoding="utf-8") as handle:
            return cls(f"https://{host}:{port}", handle.read().strip(), ssl.create_default_context(cafile=f"{SERVICE_ACCOUNT}/ca.crt"))

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        request = urllib.request.Request(f"{self.base_url}{path}", method=method, data=json.dumps(body).encode() if body is not None else None,
                                         headers={"Authorization": f"Bearer {self.token}", "Accept": "application/json",
                                                  **({"Content-Type": "application/merge-patch+json"} if body is not None else {})})
        with urllib.request.urlopen(request, timeout=30, context=self.context) as response:
            return json.loads(response.read())

    def node(self, name: str) -> dict[str, Any]:
        return self._call("GET", f"/api/v1/nodes/{name}")

    def patch_node(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self._call("PATCH", f"/api/v1/nodes/{name}", patch)


def check_once(api: Api, node_name: str, csv_text: str, expected: dict[str, int]) -> str:
    """One round: read the node, judge its GPUs, taint it when they fail. Returns what it did, for the log."""
    node = api.node(node_name)
    pool = ((node.get("metadata") or {}).get("labels") or {}).get(POOL_LABEL)
    if pool not in expected:
        return f"node {node_name} is in no checked pool ({pool!r}); nothing to do"
    found = condition_faults(node) + faults(csv_text, expected[pool])
    if not found:
        return f"node {node_name}: {expected[pool]} GPUs healthy"
    patch = taint_patch(node, "; ".join(found))
    if patch is None:
        return f"node {node_name} already tainted {TAINT_KEY}: {'; '.join(found)}"
    try:
        api.patch_node(node_name, patch)
    except urllib.error.HTTPError as exc:
        if exc.code == 409:
            return f"node {node_name} changed while tainting it (409); next round re-reads it"
        raise
    return f"tainted node {node_name} {TAINT_KEY}={TAINT_VALUE}:{TAINT_EFFECT}: {'; '.join(found)}"


def _nvidia_smi(binary: str) -> str:
    """The query's output; a failing nvidia-smi (driver gone, GPU fell off the bus) reads as no GPU visible."""
    result = subprocess.run([binary, *QUERY], capture_output=True, text=True, timeout=120, check=False)
    return result.stdout if result.returncode == 0 else ""


def main() -> int:
    expected = {pool: int(count) for pool, count in json.loads(os.environ["GPUFLEET_EXPECTED_GPUS"]).items()}
    node_name, binary = os.environ["NODE_NAME"], os.environ.get("NVIDIA_SMI", "/usr/local/nvidia/bin/nvidia-smi")
    api = Api.in_cluster()
    while True:
        try:
            print(check_once(api, node_name, _nvidia_smi(binary), expected), flush=True)
        except (OSError, urllib.error.URLError, ValueError, KeyError) as exc:
            print(f"check failed, retrying next round: {exc}", file=sys.stderr, flush=True)
        time.sleep(INTERVAL_SECONDS)


if __name__ == "__main__":
    raise SystemExit(main())
