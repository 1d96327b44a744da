"""The GPU health checker every Nomad GPU client runs from a systemd timer (constructs_lib/nomad_gpu_node.py installs this file).

Standard library only: it runs with the client's system ``python3``. Each run reads the node's own DCGM
exporter (``http://127.0.0.1:9400/metrics``, the counters gpufleet configures: nomad_gpu_node.DCGM_COUNTERS) and
judges every GPU on three fields of NVIDIA/dcgm-exporter's counters at 4.2.3-4.1.3 (etc/default-counters.csv):

- ``DCGM_FI_DEV_XID_ERRORS`` (gauge, "Value of the last XID error encountered"): a fault when it is one of the
  critical XIDs GKE's NVIDIA device plugin marks a GPU unhealthy on (container-engine-accelerators 992db812
  pkg/gpu/nvidia/health_check/health_checker.go:91: 48, 63, 64, 79, 119, 120, 123, 140; the same list the GKE
  checker reads, constructs_lib/gpu_health_check.py). Other XIDs (13, 31, 43, 45: NVIDIA's XID catalog names
  them application errors, e.g. a kernel's illegal address) are logged, not acted on: one tenant's bad kernel
  must not drain a node for everyone.
- ``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL`` (double-bit, i.e. uncorrectable, volatile ECC errors since the driver
  loaded; commented out in upstream's defaults, enabled in gpufleet's counters): a fault above 0.
- ``DCGM_FI_DEV_ROW_REMAP_FAILURE`` (gauge, "Whether remapping of rows has failed"): a fault above 0; the
  GPU's memory can no longer hide its bad rows.

A GPU missing from the exposition (fewer GPUs than the machine type has: one that fell off the bus and did not
come back) is a fault too; an exposition without any GPU is no verdict.

DCGM reports a field it has no value for as a "blank" sentinel at the top of int64 (``DCGM_INT64_BLANK``
0x7ffffffffffffff0 and the values above it; the exporter's README shows 9223372036854775794 for a memory
temperature): those are no value, never a count.

A faulty node is marked ineligible (``PUT /v1/node/:node_id/eligibility`` ``{"Eligibility": "ineligible"}``,
hashicorp/nomad v1.10.5 command/agent/node_endpoint.go:150-172, api/nodes.go:399-403 and :23-24) so nothing
new lands on it, then drained (``PUT /v1/node/:node_id/drain`` with an ``api.NodeUpdateDrainRequest``,
node_endpoint.go:114-148, api/nodes.go:76-90: ``DrainSpec {Deadline, IgnoreSystemJobs}`` with the deadline
in nanoseconds as Go encodes ``time.Duration``, api/nodes.go:733-741, and ``Meta`` with the reason, which
Nomad keeps in the node's ``LastDrain``; the servers write the node event "Node drain strategy set"
themselves). Both need ``node:write`` (nomad/node_endpoint.go:674 UpdateDrain and :778 UpdateEligibility
check ``AllowNodeWrite``): the token is the ``gpufleet-gpu-health`` policy's, read from Secret Manager on each
run with the VM's service account and never written to disk.

What does not act:

- no exporter answer (not started yet, restarting): the run says so and changes nothing;
- a node that is already ineligible and draining (or was drained) with gpufleet's reason is left alone, so a
  timer firing every minute does not restart the drain's deadline (a drain of someone else's, which may have no
  deadline at all, is replaced by the checker's own);
- the checker never makes a node eligible again: a GPU that failed is suspect until an operator has looked
  (``nomad node eligibility -enable``) or the instance group has replaced the VM.
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
import ssl
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

XID_FIELD = "DCGM_FI_DEV_XID_ERRORS"
ECC_DBE_FIELD = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
ROW_REMAP_FAILURE_FIELD = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
CRITICAL_XIDS = frozenset({48, 63, 64, 79, 119, 120, 123, 140})
DCGM_INT64_BLANK = 0x7FFFFFFFFFFFFFF0
DRAIN_DEADLINE_NS = 3600 * 10**9
REASON_KEY = "gpufleet_gpu_health"
CHECKER = "gpufleet-gpu-health"
SAMPLE = re.compile(r'^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)')
LABEL = re.compile(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"')
SECRET_MANAGER_URL = "https://secretmanager.googleapis.com/v1"
METADATA_TOKEN_URL = "http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/token"


class ExporterUnavailable(Exception):
    """The exporter did not answer: no verdict on the GPUs either way."""


@dataclass(frozen=True)
class Sample:
    field: str
    gpu: str
    value: int | None  # None: DCGM's blank sentinel or not a number


def parse_metrics(text: str) -> list[Sample]:
    """The samples of the three judged fields from Prometheus text exposition (one per GPU each)."""
    samples = []
    for line in text.splitlines():
        match = SAMPLE.match(line.strip())
        if match is None or match.group("name") not in (XID_FIELD, ECC_DBE_FIELD, ROW_REMAP_FAILURE_FIELD):
            continue
        labels = dict(LABEL.findall(match.group("labels") or ""))
        try:
            number = float(match.group("value"))
        except ValueError:
            number = None
        # NaN and ±Inf (valid exposition values) are no count either, and int() of an infinity would raise.
        value = None if number is None or not math.isfinite(number) or number >= DCGM_INT64_BLANK else int(number)
        samples.append(Sample(match.group("name"), labels.get("gpu", "?"), value))
    return samples


def gpus_seen(text: str) -> set[str]:
    """The ``gpu`` label of every DCGM sample in the exposition: the GPUs DCGM sees, whatever their values."""
    seen = set()
    for line in text.splitlines():
        match = SAMPLE.match(line.strip())
        if match is not None and match.group("name").startswith("DCGM_FI_"):
            gpu = dict(LABEL.findall(match.group("labels") or "")).get("gpu")
            if gpu is not None:
                seen.add(gpu)
    return seen


def faults(samples: list[Sample]) -> tuple[list[str], list[str]]:
    """(faults that take the node out, notes that do not) from the judged samples."""
    found, notes = [], []
    for s in samples:
        if s.value is None or s.value <= 0:
            continue
        if s.field == XID_FIELD:
            (found if s.value in CRITICAL_XIDS else notes).append(f"GPU {s.gpu} last XID {s.value}")
        elif s.field == ECC_DBE_FIELD:
            found.append(f"GPU {s.gpu} has {s.value} uncorrectable (double-bit) volatile ECC errors")
        else:
            found.append(f"GPU {s.gpu} failed to remap rows of its memory")
    return found, notes


class NomadApi:
    """The node's own agent API (it forwards node writes to the servers), with mTLS and an ACL token."""

    def __init__(self, address: str, token: str, context: ssl.SSLContext | None = None) -> None:
        self.address, self.token, self.context = address.rstrip("/"), token, context

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        request = urllib.request.Request(f"{self.address}{path}", method=method,
                                         data=json.dumps(body).encode() if body is not None else None,
                                         headers={"X-Nomad-Token": self.token, "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30, context=self.context) as response:
            return json.loads(response.read() or b"null")

    def node(self, node_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/node/{node_id}")

    def set_ineligible(self, node_id: str) -> Any:
        return self._call("PUT", f"/v1/node/{node_id}/eligibility", {"NodeID": node_id, "Eligibility": "ineligible"})

    def drain(self, node_id: str, reason: str) -> Any:
        return self._call("PUT", f"/v1/node/{node_id}/drain", {
            "NodeID": node_id, "DrainSpec": {"Deadline": DRAIN_DEADLINE_NS, "IgnoreSystemJobs": True}, "MarkEligible": False,
            "Meta": {REASON_KEY: reason[:500], "checker": CHECKER}})


def already_taken_out(node: dict[str, Any]) -> bool:
    """Ineligible, and the last drain (running, done or cancelled) is this checker's: nothing left to do.

    Someone else's drain does not count: an operator's maintenance drain may have no deadline, so the jobs on
    the failed GPU would keep running; the checker's drain replaces its deadline and its reason (Nomad replaces
    ``LastDrain.Meta`` when a drain update carries Meta), after which this holds."""
    if node.get("SchedulingEligibility") != "ineligible":
        return False
    return REASON_KEY in ((node.get("LastDrain") or {}).get("Meta") or {})


def check_once(metrics_text: str, node_id: str, api_for: Callable[[], NomadApi], *, expected_gpus: int) -> str:
    """One run: judge the GPUs; on a fault take the node out. ``api_for()`` gives the NomadApi (it reads the
    token), called only when there is something to do. ``expected_gpus``: the machine type's GPU count; fewer
    GPUs in DCGM's answer is a fault (a GPU lost from the bus has no value left to judge), none at all is the
    exporter's state and no verdict. Returns what it did, for the journal."""
    seen = gpus_seen(metrics_text)
    if not seen:
        return f"node {node_id}: not judged this run, the DCGM exporter reported no GPU"
    found, notes = faults(parse_metrics(metrics_text))
    if len(seen) < expected_gpus:
        found.insert(0, f"{len(seen)} of the machine's {expected_gpus} GPUs report to DCGM")
    if not found:
        return f"node {node_id}: GPUs healthy" + (f" (noted, not acted on: {'; '.join(notes)})" if notes else "")
    reason = "; ".join(found)
    api = api_for()
    if already_taken_out(api.node(node_id)):
        return f"node {node_id}: already ineligible and drained by {CHECKER}: {reason}"
    api.set_ineligible(node_id)
    api.drain(node_id, reason)
    return f"node {node_id}: marked ineligible and draining (deadline {DRAIN_DEADLINE_NS // 10**9} s): {reason}"


def read_exporter(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=20) as response:
            return response.read().decode()
    except (OSError, urllib.error.URLError) as exc:
        raise ExporterUnavailable(f"{url}: {exc}") from exc


def secret_token(project: str, secret_id: str) -> str:
    """The latest version of the checker's ACL token secret, read with the VM's service account."""
    request = urllib.request.Request(METADATA_TOKEN_URL, headers={"Metadata-Flavor": "Google"})
    with urllib.request.urlopen(request, timeout=10) as response:
        access = json.loads(response.read())["access_token"]
    url = f"{SECRET_MANAGER_URL}/projects/{project}/secrets/{secret_id}/versions/latest:access"
    with urllib.request.urlopen(urllib.request.Request(url, headers={"Authorization": f"Bearer {access}"}), timeout=10) as response:
        return base64.b64decode(json.loads(response.read())["payload"]["data"]).decode().strip()


def main() -> int:
    env = os.environ
    try:
        metrics = read_exporter(env.get("GPUFLEET_DCGM_URL", "http://127.0.0.1:9400/metrics"))
    except ExporterUnavailable as exc:
        print(f"not judged this run, the DCGM exporter did not answer: {exc}", flush=True)
        return 0
    with open(env["GPUFLEET_NODE_ID_FILE"], encoding="utf-8") as handle:
        node_id = handle.read().strip()

    def api_for() -> NomadApi:
        context = ssl.create_default_context(cafile=env["GPUFLEET_NOMAD_CA_FILE"])
        context.load_cert_chain(env["GPUFLEET_NOMAD_CERT_FILE"], env["GPUFLEET_NOMAD_KEY_FILE"])
        return NomadApi(env["GPUFLEET_NOMAD_ADDR"], secret_token(env["GPUFLEET_PROJECT"], env["GPUFLEET_HEALTH_SECRET_NAME"]), context)

    try:
        print(check_once(metrics, node_id, api_for, expected_gpus=int(env["GPUFLEET_EXPECTED_GPUS"])), flush=True)
    except (OSError, urllib.error.URLError, ValueError, KeyError) as exc:
        print(f"{CHECKER}: could not take node {node_id} out, next run retries: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
