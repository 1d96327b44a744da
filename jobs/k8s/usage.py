"""GPU utilization of GKE runs: DCGM metrics from the cluster's managed Prometheus, through the
Prometheus HTTP API (``POST <url>/api/v1/query``, form field ``query``; the answer is
``{"status": "success", "data": {"resultType": "vector", "result": [{"metric": {...},
"value": [<unix seconds>, "<number as a string>"]}]}}``, prometheus/docs/querying/api.md).

One query per pass for every GKE run the caller asks about: the raw per-GPU series of
``DCGM_FI_DEV_GPU_UTIL`` (percent) and ``DCGM_FI_DEV_FB_USED`` (MiB) in the runs' namespaces,
selected by ``__name__`` so both come back in one answer; they are summed up per run here
(mean utilization over all GPUs of all its pods, the most memory any one GPU held), because a
multi-node run is several pods and ``avg by (pod)`` would weigh ranks, not GPUs.

Which labels name the workload's pod: dcgm-exporter adds ``pod``/``namespace``/``container`` of
the pod holding the GPU; the scrape target's own ``pod``/``namespace`` (the exporter's pod) take
those names first, so with ``honor_labels: false`` (Prometheus' default, also managed
collection's) the exporter's are renamed ``exported_pod``/``exported_namespace`` — the reason
dcgm-exporter issue #27 saw the exporter's own pod name under ``pod``, and the labels the
OpenShift GPU console queries (rh-ecosystem-edge/console-plugin-nvidia-gpu
src/utils/project-overview.ts). Hence the defaults; a Prometheus that keeps the exporter's labels
(honor_labels) is configured with GPUFLEET_DCGM_POD_LABEL=pod, GPUFLEET_DCGM_NAMESPACE_LABEL=namespace.
"""

from __future__ import annotations

import math
import os
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from clusters.errors import UserError
from jobs.usage import Usage, UsageUnavailable, combine

GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
FB_USED = "DCGM_FI_DEV_FB_USED"
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass(frozen=True)
class PrometheusSettings:
    url: str
    pod_label: str = "exported_pod"
    namespace_label: str = "exported_namespace"
    timeout_seconds: float = 5.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> PrometheusSettings | None:
        """GPUFLEET_PROMETHEUS_URL (e.g. the managed Prometheus frontend in the cluster); None when unset."""
        url = (env.get("GPUFLEET_PROMETHEUS_URL") or "").rstrip("/")
        if not url:
            return None
        if not url.startswith(("http://", "https://")):
            raise UserError(f"GPUFLEET_PROMETHEUS_URL {url!r} has no scheme; set it like http://frontend.monitoring.svc:9090")
        labels = {name: env.get(name) or default for name, default in
                  (("GPUFLEET_DCGM_POD_LABEL", "exported_pod"), ("GPUFLEET_DCGM_NAMESPACE_LABEL", "exported_namespace"))}
        for name, value in labels.items():
            if not _LABEL.match(value):
                raise UserError(f"{name} {value!r} is not a Prometheus label name; allowed: [a-zA-Z_][a-zA-Z0-9_]* (e.g. exported_pod or pod)")
        return cls(url=url, pod_label=labels["GPUFLEET_DCGM_POD_LABEL"], namespace_label=labels["GPUFLEET_DCGM_NAMESPACE_LABEL"])


def query_for(settings: PrometheusSettings, namespaces: Sequence[str]) -> str:
    """Namespaces are DNS labels (``[a-z0-9]([-a-z0-9]*[a-z0-9])?``): nothing in them is a regex
    metacharacter, so they go in as they are. ``re.escape`` would write ``\\-``, an escape a PromQL
    string literal refuses (Go's string escapes), and the whole query would fail."""
    names = sorted(set(namespaces))
    if bad := [n for n in names if not _NAMESPACE.match(n)]:
        raise UsageUnavailable(f"not Kubernetes namespace names: {bad}")
    return f'{{__name__=~"{GPU_UTIL}|{FB_USED}",{settings.namespace_label}=~"{"|".join(names)}"}}'


def _run_of(pod: str, runs: Sequence[str]) -> str | None:
    """A Job's pods are named ``<job>-<suffix>`` (``<job>-<index>-<suffix>`` when Indexed): the
    longest run name the pod name starts with, followed by a dash."""
    best = None
    for run in runs:
        if pod.startswith(f"{run}-") and (best is None or len(run) > len(best)):
            best = run
    return best


def _value(series: Mapping[str, Any]) -> float | None:
    """A sample's value (a string in the API); NaN, ±Inf or unparsable is unknown, not 0."""
    try:
        value = float(series["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def parse(answer: Mapping[str, Any], settings: PrometheusSettings, runs: Mapping[str, Sequence[str]]) -> dict[tuple[str, str], Usage]:
    """The query's vector -> (namespace, run) -> sample over every GPU of every pod of the run."""
    if answer.get("status") != "success" or (answer.get("data") or {}).get("resultType") != "vector":
        raise UsageUnavailable(f"Prometheus answered {answer.get('status')!r} ({answer.get('error') or 'not a vector'})")
    gpus: dict[tuple[str, str], dict[tuple[str, str], dict[str, float | None]]] = defaultdict(dict)
    for series in answer["data"].get("result") or []:
        metric = series.get("metric") or {}
        namespace, pod = metric.get(settings.namespace_label, ""), metric.get(settings.pod_label, "")
        run = _run_of(pod, runs.get(namespace, ()))
        if run is not None:
            gpu = gpus[(namespace, run)].setdefault((pod, metric.get("UUID") or metric.get("gpu") or ""), {})
            gpu[metric.get("__name__", "")] = _value(series)
    out = {}
    for key, per_gpu in gpus.items():
        if (usage := combine((g.get(GPU_UTIL), g.get(FB_USED)) for g in per_gpu.values())) is not None:
            out[key] = usage
    return out


class PrometheusClient:
    def __init__(self, settings: PrometheusSettings) -> None:
        import httpx

        self.settings = settings
        self._http = httpx.Client(timeout=settings.timeout_seconds, headers={"User-Agent": "gpufleet-usage/0.1"})

    def query(self, promql: str) -> dict[str, Any]:
        import httpx

        try:
            response = self._http.post(f"{self.settings.url}/api/v1/query", data={"query": promql})
            answer = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise UsageUnavailable(f"cannot query Prometheus at {self.settings.url} ({type(exc).__name__}); check GPUFLEET_PROMETHEUS_URL") from None
        if response.status_code >= 400:
            raise UsageUnavailable(f"Prometheus at {self.settings.url} answered {response.status_code} ({str(answer.get('error', ''))[:200]})")
        return dict(answer)

    def close(self) -> None:
        self._http.close()


def sample(client: PrometheusClient, runs: Mapping[str, Sequence[str]]) -> dict[tuple[str, str], Usage]:
    """``runs``: namespace -> run (Job) names. One query for all of them."""
    if not runs:
        return {}
    return parse(client.query(query_for(client.settings, list(runs))), client.settings, runs)
