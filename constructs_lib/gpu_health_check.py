"""The GPU health checker the scheduler stack runs on every GPU node (constructs_lib/gpu_health.py ships this file in a ConfigMap).

Standard library only: it runs in a plain Python image. Every ``INTERVAL_SECONDS`` it asks the host's
``nvidia-smi`` for each GPU's ECC mode and uncorrected volatile ECC count and compares the number of GPUs
with what the node's pool has, the two checks of the GPU health gate in Google's cluster-toolkit v1.95.0
(examples/gke-consumption-options/dws-flex-start/nccl-jobset-example.yaml:96-111, init container
``gpu-healthcheck``: fewer GPUs than expected, an ECC count of ``[N/A]`` or above 0 fail the node), plus
the node condition GKE's NVIDIA device plugin sets on a critical XID (``XidCriticalError``,
container-engine-accelerators 992db812 pkg/gpu/nvidia/health_check/health_checker.go:41, XIDs 48, 63, 64,
79, 119, 120, 123, 140 at :91): the scheduler ignores conditions. Unlike the toolkit, an ECC count of
``[N/A]`` is a fault only on a GPU whose ``ecc.mode.current`` is ``Enabled``: with ECC off there is no
count to report.

A healthy node must never be tainted by accident, because the taint is sticky:

- a sample counts only once the node has advertised its full ``nvidia.com/gpu`` allocatable during this
  boot (a new node's driver installer and device plugin take minutes, and ``nvidia-smi`` sees no GPU
  before them);
- the node is tainted after ``FAILURES_TO_TAINT`` consecutive failing samples of one boot, not one;
- ``nvidia-smi`` that cannot run (missing, non-zero exit, timeout) says nothing about the GPUs: the
  round is logged and skipped, it is neither a pass nor a failure.

A failing node gets the taint ``gpufleet.dev/gpu-unhealthy=true:NoSchedule`` with the reason and the
node's boot ID (``status.nodeInfo.bootID``) in an annotation: no run's pods tolerate it (they tolerate
only their pool's taints), so the next multi-node run is placed on other nodes. A GPU that fails and then
passes within the same boot stays tainted (it is still suspect). The taint is removed only when the boot
ID differs from the recorded one and the node's checks pass: the node was rebooted or repaired. That is
the device plugin's own rule for its condition: resetXIDCondition (health_checker.go:126-143 at 992db812)
drops ``XidCriticalError`` only when the boot ID differs from the one recorded with it ("If the bootId
changes, consider the node fixed through auto-repair"); a plugin restart on the same boot keeps it.

The node is changed with a JSON merge patch carrying the ``resourceVersion`` it read, so a concurrent
writer of the node's taints makes the API server answer 409 and the next round re-reads, instead of
one writer dropping the other's taint (merge patch replaces the whole list).
"""

from __future__ import annotations

import json
import os
import re
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

TAINT_KEY = "gpufleet.dev/gpu-unhealthy"
TAINT_VALUE = "true"
TAINT_EFFECT = "NoSchedule"
REASON_ANNOTATION = "gpufleet.dev/gpu-unhealthy-reason"
POOL_LABEL = "gpufleet.dev/gpu-pool"
GPU_RESOURCE = "nvidia.com/gpu"
XID_CONDITION = "XidCriticalError"
# nvidia-smi --help-query-gpu: ecc.mode.current is "Enabled" or "Disabled" ([N/A] where ECC is unsupported).
QUERY = ("--query-gpu=index,ecc.mode.current,ecc.errors.uncorrected.volatile.total", "--format=csv,noheader,nounits")
ECC_ENABLED = "Enabled"
INTERVAL_SECONDS = 300
FAILURES_TO_TAINT = 3
SMI_TIMEOUT_SECONDS = 120
SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
# The reason annotation starts with the boot it was written in: "boot <bootID>: <faults>".
BOOT_PREFIX = re.compile(r"^boot (\S*): ")


class SmiUnavailable(Exception):
    """nvidia-smi could not run: no verdict on the GPUs either way."""


@dataclass
class NodeState:
    """What the checker remembers between rounds, for one boot of its node (a new boot starts afresh)."""

    boot_id: str = ""
    ready: bool = False  # allocatable nvidia.com/gpu reached the pool's count during this boot
    failing: int = 0  # consecutive failing samples


def faults(csv_text: str, expected_gpus: int) -> list[str]:
    """What is wrong with a node from ``nvidia-smi`` CSV (index, ECC mode, uncorrected volatile ECC); empty when healthy."""
    rows = [[cell.strip() for cell in line.split(",")] for line in csv_text.strip().splitlines() if line.strip()]
    rows = [row for row in rows if len(row) == 3]
    found = []
    if len(rows) < expected_gpus:
        found.append(f"{len(rows)} GPUs visible, the pool's machine has {expected_gpus}")
    for index, mode, ecc in rows:
        if ecc == "[N/A]" and mode == ECC_ENABLED:
            found.append(f"GPU {index} has ECC enabled and reports its ECC count as [N/A] (an error state)")
        elif ecc.isdigit() and int(ecc) > 0:
            found.append(f"GPU {index} has {ecc} uncorrected ECC errors")
    return found


def condition_faults(node: dict[str, Any]) -> list[str]:
    """The device plugin's XID condition when it is True (its reason names the XIDs seen)."""
    conditions = (node.get("status") or {}).get("conditions") or []
    return [f"node condition {XID_CONDITION}: {c.get('reason') or 'critical XID'}" for c in conditions
            if c.get("type") == XID_CONDITION and c.get("status") == "True"]


def boot_id(node: dict[str, Any]) -> str:
    return str(((node.get("status") or {}).get("nodeInfo") or {}).get("bootID") or "")


def allocatable_gpus(node: dict[str, Any]) -> int:
    value = str(((node.get("status") or {}).get("allocatable") or {}).get(GPU_RESOURCE) or "0")
    return int(value) if value.isdigit() else 0


def tainted_boot(node: dict[str, Any]) -> str | None:
    """The boot ID recorded with this checker's taint, "" when the taint has none, None when the node is not tainted."""
    if not any(t.get("key") == TAINT_KEY for t in (node.get("spec") or {}).get("taints") or []):
        return None
    match = BOOT_PREFIX.match(((node.get("metadata") or {}).get("annotations") or {}).get(REASON_ANNOTATION) or "")
    return match.group(1) if match else ""


def taint_patch(node: dict[str, Any], reason: str) -> dict[str, Any] | None:
    """The merge patch that adds the taint with the boot and reason, or re-dates the reason to this boot when the
    node is tainted from an earlier one; None when it is tainted in this boot already (the reason stays as first written)."""
    boot = boot_id(node)
    recorded = tainted_boot(node)
    if recorded == boot:
        return None
    taints = list((node.get("spec") or {}).get("taints") or [])
    if recorded is None:
        taints.append({"key": TAINT_KEY, "value": TAINT_VALUE, "effect": TAINT_EFFECT})
    return {"metadata": {"resourceVersion": node["metadata"]["resourceVersion"], "annotations": {REASON_ANNOTATION: f"boot {boot}: {reason}"[:1000]}},
            "spec": {"taints": taints}}


def untaint_patch(node: dict[str, Any]) -> dict[str, Any]:
    """The merge patch that removes this checker's taint and its reason (a null deletes a key, RFC 7386)."""
    taints = [t for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") != TAINT_KEY]
    return {"metadata": {"resourceVersion": node["metadata"]["resourceVersion"], "annotations": {REASON_ANNOTATION: None}},
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


def _patch(api: Api, node_name: str, patch: dict[str, Any], done: str) -> str:
    try:
        api.patch_node(node_name, patch)
    except urllib.error.HTTPError as exc:
        if exc.code == 409:
            return f"node {node_name} changed while patching it (409); next round re-reads it"
        raise
    return done


def check_once(api: Api, node_name: str, csv_text: str, expected: dict[str, int], state: NodeState) -> str:
    """One round on one sample: read the node, judge its GPUs, taint or untaint it. Returns what it did, for the log."""
    node = api.node(node_name)
    pool = ((node.get("metadata") or {}).get("labels") or {}).get(POOL_LABEL)
    if pool not in expected:
        return f"node {node_name} is in no checked pool ({pool!r}); nothing to do"
    boot, want = boot_id(node), expected[pool]
    if boot != state.boot_id:
        state.boot_id, state.ready, state.failing = boot, False, 0
    state.ready = state.ready or allocatable_gpus(node) == want
    found = condition_faults(node) + faults(csv_text, want)
    recorded = tainted_boot(node)
    if not found:
        state.failing = 0
        if recorded and boot and recorded != boot and state.ready:
            return _patch(api, node_name, untaint_patch(node),
                          f"untainted node {node_name}: boot {boot} differs from the tainted boot {recorded} and {want} GPUs pass")
        if recorded is None:
            return f"node {node_name}: {want} GPUs healthy"
        # A taint with no boot recorded (written before boot IDs were, or by hand) is never lifted here: nothing
        # shows the node was rebooted since.
        return f"node {node_name}: {want} GPUs healthy, still tainted {TAINT_KEY} from boot {recorded or '(not recorded)'}"
    if not state.ready:
        return (f"node {node_name}: not judged, {GPU_RESOURCE} allocatable {allocatable_gpus(node)} has not reached {want} "
                f"in this boot (driver or device plugin not up): {'; '.join(found)}")
    state.failing += 1
    if state.failing < FAILURES_TO_TAINT:
        return f"node {node_name}: failing sample {state.failing} of {FAILURES_TO_TAINT} before the taint: {'; '.join(found)}"
    patch = taint_patch(node, "; ".join(found))
    if patch is None:
        return f"node {node_name} already tainted {TAINT_KEY}: {'; '.join(found)}"
    return _patch(api, node_name, patch, f"tainted node {node_name} {TAINT_KEY}={TAINT_VALUE}:{TAINT_EFFECT}: {'; '.join(found)}")


def nvidia_smi(binary: str, timeout_seconds: float = SMI_TIMEOUT_SECONDS) -> str:
    """The query's output, or SmiUnavailable when nvidia-smi could not run: a missing binary, a non-zero exit
    or a hang is the checker's or the driver's state, not a count of zero GPUs."""
    try:
        result = subprocess.run([binary, *QUERY], capture_output=True, text=True, timeout=timeout_seconds, check=False)
    except subprocess.TimeoutExpired as exc:
        raise SmiUnavailable(f"{binary} did not answer within {timeout_seconds:g} s") from exc
    except OSError as exc:
        raise SmiUnavailable(f"{binary} could not start: {exc}") from exc
    if result.returncode != 0:
        raise SmiUnavailable(f"{binary} exited {result.returncode}: {(result.stderr or result.stdout).strip()[:200]}")
    return result.stdout


def run_round(api: Api, node_name: str, binary: str, expected: dict[str, int], state: NodeState,
              timeout_seconds: float = SMI_TIMEOUT_SECONDS) -> str:
    """Sample nvidia-smi and judge it; a sample that could not be taken leaves the node and the count as they are."""
    try:
        csv_text = nvidia_smi(binary, timeout_seconds)
    except SmiUnavailable as exc:
        return f"node {node_name}: not judged this round, nvidia-smi could not run: {exc}"
    return check_once(api, node_name, csv_text, expected, state)


def main() -> int:
    expected = {pool: int(count) for pool, count in json.loads(os.environ["GPUFLEET_EXPECTED_GPUS"]).items()}
    node_name, binary = os.environ["NODE_NAME"], os.environ.get("NVIDIA_SMI", "/usr/local/nvidia/bin/nvidia-smi")
    api, state = Api.in_cluster(), NodeState()
    while True:
        try:
            print(run_round(api, node_name, binary, expected, state), flush=True)
        except (OSError, urllib.error.URLError, ValueError, KeyError) as exc:
            print(f"check failed, retrying next round: {exc}", file=sys.stderr, flush=True)
        time.sleep(INTERVAL_SECONDS)


if __name__ == "__main__":
    raise SystemExit(main())
