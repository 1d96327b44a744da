"""``gpufleet doctor``: what in this environment stops gpufleet from working, one line per problem
with its fix (the project's ``error: <what>; <fix>`` style), exit 1 if any.

Checked: GPUFLEET_API answers and GPUFLEET_API_TOKEN is accepted there; the control plane's own
schedulers answer (its /healthz, per bound cluster); VAULT_ADDR is set, answers and is unsealed;
the cluster files load; for a fleet with Nomad clusters NOMAD_ADDR is set, the servers answer and accept NOMAD_TOKEN
(``GET /v1/acl/token/self``; servers without ACLs are noted, not counted as a problem);
for a fleet with GKE clusters the kubeconfig context loads and its API server answers. Each check has a short timeout
and no check stops the others.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Mapping

import typer

from clusters.errors import UserError

TIMEOUT_SECONDS = 5.0
NOTE = "note: "  # a check's line that informs and is no problem (printed on stdout, not counted)
Check = Callable[[Mapping[str, str]], list[str]]


def _api(env: Mapping[str, str]) -> list[str]:
    import httpx

    base = env.get("GPUFLEET_API", "http://127.0.0.1:8080").rstrip("/")
    if not base.startswith(("http://", "https://")):
        return [f"GPUFLEET_API {base!r} has no scheme; set it like http://{base} (or https://...)"]
    try:
        health = httpx.get(f"{base}/healthz", timeout=TIMEOUT_SECONDS)
    except httpx.HTTPError as exc:
        return [f"cannot reach the control plane at {base} ({type(exc).__name__}); start it with gpufleet serve or set GPUFLEET_API"]
    problems = []
    try:
        body = health.json()
    except ValueError:
        return [f"{base}/healthz answered {health.status_code} without JSON; is GPUFLEET_API the gpufleet control plane?"]
    if health.status_code >= 500:
        problems.append(f"the control plane at {base} is unhealthy (database {body.get('database')}, worker {body.get('worker')}); see its log")
    for cluster, state in sorted((body.get("schedulers") or {}).items()):
        if not state.get("answers"):
            fix = "NOMAD_ADDR, NOMAD_TOKEN and NOMAD_CACERT" if state.get("scheduler") == "nomad" else "kubeconfig context"
            problems.append(f"the control plane cannot reach the {state.get('scheduler')} scheduler of cluster {cluster} and runs there wait; "
                            f"its log says why: check the service's {fix}")
    token = env.get("GPUFLEET_API_TOKEN")
    if not token:
        problems.append("GPUFLEET_API_TOKEN is not set; create one with: gpufleet api token create --tenant <tenant>")
        return problems
    try:
        answer = httpx.get(f"{base}/api/v1/experiments", params={"limit": 1}, headers={"Authorization": f"Bearer {token}"}, timeout=TIMEOUT_SECONDS)
    except httpx.HTTPError as exc:
        return [*problems, f"cannot reach the control plane at {base} ({type(exc).__name__}); start it with gpufleet serve or set GPUFLEET_API"]
    if answer.status_code in (401, 403):
        problems.append(f"the control plane at {base} refused GPUFLEET_API_TOKEN ({answer.status_code}); "
                        "create a new one with: gpufleet api token create --tenant <tenant>")
    return problems


def _vault(env: Mapping[str, str]) -> list[str]:
    import httpx

    addr = (env.get("VAULT_ADDR") or "").rstrip("/")
    if not addr:
        return ["VAULT_ADDR is not set; set it to the Vault (OpenBao) address, e.g. https://vault.example.com:8200 (gpufleet dev up starts a local one)"]
    try:
        # Every status code answers here (standby, sealed...): 200 asked for, the JSON says which.
        answer = httpx.get(f"{addr}/v1/sys/health", params={"standbyok": "true", "sealedcode": "200", "uninitcode": "200"}, timeout=TIMEOUT_SECONDS)
        body = answer.json()
    except (httpx.HTTPError, ValueError) as exc:
        return [f"cannot reach Vault at VAULT_ADDR {addr} ({type(exc).__name__}); check the address and that the server is up"]
    if body.get("sealed"):
        return [f"Vault at {addr} is sealed; unseal it (bao operator unseal) before dispatching runs"]
    return []


@functools.cache
def _fleet_schedulers() -> set[str]:
    """The schedulers clusters/ uses (which of NOMAD_ADDR and the kube context matter here)."""
    from clusters import load_all

    return {config.scheduler.value for config in load_all()}


def _clusters(env: Mapping[str, str]) -> list[str]:
    from clusters.errors import ConfigError

    try:
        _fleet_schedulers()
    except ConfigError as exc:
        return [f"{problem} (run gpufleet check)" for problem in exc.problems]
    return []


def _uses(scheduler: str) -> bool:
    from clusters.errors import ConfigError

    try:
        return scheduler in _fleet_schedulers()
    except ConfigError:
        return False  # reported once, by the clusters check


def _nomad(env: Mapping[str, str]) -> list[str]:
    from dataclasses import replace

    from jobs.nomad.client import NomadClient, NomadSettings

    if not _uses("nomad"):
        return []
    if not env.get("NOMAD_ADDR"):
        return ["NOMAD_ADDR is not set but the fleet has Nomad clusters; set NOMAD_ADDR (with NOMAD_TOKEN, NOMAD_CACERT) to their servers"]
    try:
        client = NomadClient(replace(NomadSettings.from_env(env), timeout_seconds=TIMEOUT_SECONDS, retries=0))
        try:
            token = client.token_self()  # first: a refused token is named as such, not as a refused status call
            client.leader()
        finally:
            client.close()
    except UserError as exc:
        return [str(exc)]
    if token is None:
        return [f"{NOTE}the Nomad servers at {env['NOMAD_ADDR']} run without ACLs (GET /v1/acl/token/self: ACL support disabled), "
                "so NOMAD_TOKEN is not checked; production clusters should enable ACLs (acl { enabled = true })"]
    return []


def _kube(env: Mapping[str, str]) -> list[str]:
    from dataclasses import replace

    from jobs.k8s.client import K8sClient, K8sSettings

    if not _uses("gke"):
        return []
    try:
        client = K8sClient(replace(K8sSettings.from_env(env), timeout_seconds=TIMEOUT_SECONDS, retries=0))
        try:
            client.version()
        finally:
            client.close()
    except UserError as exc:
        context = env.get("GPUFLEET_KUBE_CONTEXT")
        return [f"kube context {context!r}: {exc}" if context else str(exc)]
    return []


CHECKS: tuple[tuple[str, Check], ...] = (("control plane", _api), ("vault", _vault), ("cluster files", _clusters), ("nomad", _nomad),
                                         ("kubernetes", _kube))


# The docstring is one line: typer keeps its line breaks in `gpufleet --help`'s command list.
def cmd_doctor() -> None:
    """Check this environment (GPUFLEET_API and token, VAULT_ADDR, NOMAD_ADDR, kube context, the control plane's clusters): one line per problem with its fix; exit 1 if any."""
    _fleet_schedulers.cache_clear()
    env = dict(os.environ)
    problems = 0
    for name, check in CHECKS:
        lines = check(env)
        found = [line for line in lines if not line.startswith(NOTE)]
        for line in found:
            print(f"error: {line}", file=sys.stderr)
        if not found:
            print(f"ok: {name}")
        for line in lines:
            if line.startswith(NOTE):
                print(line)
        problems += len(found)
    if problems:
        print(f"{problems} problem(s) found", file=sys.stderr)
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("doctor")(cmd_doctor)
