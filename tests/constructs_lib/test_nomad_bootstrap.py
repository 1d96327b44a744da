"""The generated Nomad bootstrap script, run for real under bash.

No ``nomad`` or ``gcloud`` binary exists here, so both are small shims on PATH that do what
the real commands document (``nomad tls ca/cert create`` writes ``<region>-<role>-nomad.pem``
and ``-key.pem``, command/tls_cert_create.go v1.10.5; ``gcloud secrets versions add`` reads
``--data-file``) and log their arguments. ``openssl`` is the real one."""

from __future__ import annotations

import os
import re
import subprocess
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest

from clusters.derive.nomad import derive_nomad_secrets
from constructs_lib.nomad_bootstrap import render_bootstrap_script

NOMAD_SHIM = r"""#!/bin/bash
echo "nomad $*" >> "$SHIM_LOG"
case "$*" in
  "tls ca create") echo ca > nomad-agent-ca.pem; echo cakey > nomad-agent-ca-key.pem ;;
  *"cert create -server"*) echo s > global-server-nomad.pem; echo sk > global-server-nomad-key.pem ;;
  *"cert create -client"*) echo c > global-client-nomad.pem; echo ck > global-client-nomad-key.pem ;;
  *"cert create -cli"*) echo l > global-cli-nomad.pem; echo lk > global-cli-nomad-key.pem ;;
  *) exit 1 ;;
esac
"""
GPUFLEET_SHIM = r"""#!/bin/bash
echo "gpufleet $* VAULT_ADDR=$VAULT_ADDR${NOMAD_ADDR:+ NOMAD_ADDR=$NOMAD_ADDR}${NOMAD_CLIENT_KEY:+ key=$(test -s "$NOMAD_CLIENT_KEY" && echo present)}" >> "$SHIM_LOG"
"""
GCLOUD_SHIM = r"""#!/bin/bash
file=$(printf '%s\n' "$@" | sed -n 's/^--data-file=//p')
echo "gcloud $4 $(wc -c < "$file")" >> "$SHIM_LOG"
"""


@pytest.fixture(scope="module")
def prod_nomad(example_configs):
    return {c.name: c for c in example_configs}["prod-nomad"]


def run(script: str, tmp_path: Path, keep: Path) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("nomad", NOMAD_SHIM), ("gcloud", GCLOUD_SHIM), ("gpufleet", GPUFLEET_SHIM)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (tmp_path / "bootstrap.sh").write_text(script)
    (tmp_path / "prometheus-ca.pem").write_text("-----BEGIN CERTIFICATE-----\nprometheus-ca\n-----END CERTIFICATE-----\n")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("NOMAD_")}, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SHIM_LOG": str(tmp_path / "log"), "TMPDIR": str(tmp_path),
           "VAULT_ADDR": "https://vault.example.com:8200", "PROMETHEUS_CA": "prometheus-ca.pem"}
    return subprocess.run(["bash", str(tmp_path / "bootstrap.sh"), "10.50.0.9", str(keep)], env=env, capture_output=True, text=True,
                          check=False, cwd=tmp_path)


def test_bootstrap_stores_every_secret_and_keeps_only_the_ca_and_cli_cert(prod_nomad, tmp_path):
    script = render_bootstrap_script(cluster="prod-nomad", project="ml-finetune-prod", region="global", secrets=derive_nomad_secrets(prod_nomad))
    days = {datetime.now(UTC).date()}
    result = run(script, tmp_path, tmp_path / "offline")
    days.add(datetime.now(UTC).date())  # a run across 00:00 UTC: the script read one of the two days
    assert result.returncode == 0, result.stderr
    log = (tmp_path / "log").read_text().splitlines()
    assert "nomad tls cert create -server -region global -days 365 -additional-ipaddress 10.50.0.9" in log
    stored = [line.split()[1] for line in log if line.startswith("gcloud")]
    assert stored == [s.secret_id for s in derive_nomad_secrets(prod_nomad) if s.name not in ("autoscaler-token", "gpu-health-token")]
    assert "nomad acl token create -name autoscaler -policy gpufleet-autoscaler" in result.stdout, "made after the ACL bootstrap"
    assert "nomad acl token create -name gpu-health -policy gpufleet-gpu-health" in result.stdout, "made after the ACL bootstrap"
    gossip = next(line for line in log if line.startswith("gcloud prod-nomad-nomad-gossip-key"))
    assert gossip.endswith(" 45"), "32 random bytes, base64 with newline"
    assert sorted(p.name for p in (tmp_path / "offline").iterdir()) == [
        "global-cli-nomad-key.pem", "global-cli-nomad.pem", "nomad-agent-ca-key.pem", "nomad-agent-ca.pem", "prometheus-key.pem", "prometheus.pem"]
    assert "nomad tls cert create -cli -region global -days 365 -ca ../nomad-agent-ca.pem -key ../nomad-agent-ca-key.pem" in log, \
        "the autoscaler's Prometheus gets its own client certificate for the servers' verify_https_client"
    assert "scrape job: gpufleet nomad scrape-config prod-nomad" in result.stdout
    assert log.count("nomad tls cert create -cli -region global -days 365 -ca ../nomad-agent-ca.pem -key ../nomad-agent-ca-key.pem") == 2, \
        "Prometheus and the autoscaler each get their own client certificate, not the servers'"
    sizes = {line.split()[1]: line.split()[2] for line in log if line.startswith("gcloud")}
    assert sizes["prod-nomad-nomad-prometheus-ca"] == "68", "the https Prometheus' CA, from the file PROMETHEUS_CA names (relative to where it ran)"
    expires = re.search(r'record in clusters/prod-nomad.yaml: nomad.tls.static_expires: "(\d{4}-\d{2}-\d{2})"', result.stdout).group(1)
    assert date.fromisoformat(expires) in {day + timedelta(days=365) for day in days}, "what check warns about, 30 days ahead"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("tmp")], "the work dir with the agent keys is deleted"


def test_fails_when_the_offline_dir_is_inside_a_git_repository(prod_nomad, tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path / "repo")], check=True)
    script = render_bootstrap_script(cluster="prod-nomad", project="p", region="global", secrets=derive_nomad_secrets(prod_nomad))
    result = run(script, tmp_path, tmp_path / "repo" / "keys")
    assert result.returncode == 2 and "is inside a git repository" in result.stderr
    assert not (tmp_path / "log").exists(), "nothing was generated"


def test_a_vault_pki_cluster_imports_its_ca_into_the_pki_mount(prod_nomad, tmp_path):
    script = render_bootstrap_script(cluster="prod-nomad", project="p", region="global", secrets=derive_nomad_secrets(prod_nomad), pki=True)
    result = run(script, tmp_path, tmp_path / "offline")
    assert result.returncode == 0, result.stderr
    log = (tmp_path / "log").read_text().splitlines()
    assert ("gpufleet nomad pki-apply prod-nomad --ca-cert nomad-agent-ca.pem --ca-key nomad-agent-ca-key.pem"
            " VAULT_ADDR=https://vault.example.com:8200") in log
    assert log.index(next(x for x in log if x.startswith("gpufleet"))) > log.index("nomad tls ca create")
    static = render_bootstrap_script(cluster="prod-nomad", project="p", region="global", secrets=derive_nomad_secrets(prod_nomad))
    assert "pki-apply" not in static


def test_the_acl_bootstrap_runs_once_the_secrets_are_stored_with_the_cli_certificate(prod_nomad, tmp_path):
    """gpufleet nomad acl-bootstrap (tests/gpufleet/test_nomad_acl_bootstrap.py) reaches the API by the
    load balancer's address with the CLI certificate, after the agents' secrets exist (servers wait for them)."""
    script = render_bootstrap_script(cluster="prod-nomad", project="p", region="global", secrets=derive_nomad_secrets(prod_nomad))
    result = run(script, tmp_path, tmp_path / "offline")
    assert result.returncode == 0, result.stderr
    log = (tmp_path / "log").read_text().splitlines()
    call = "gpufleet nomad acl-bootstrap prod-nomad VAULT_ADDR=https://vault.example.com:8200 NOMAD_ADDR=https://10.50.0.9:4646 key=present"
    assert call in log
    assert log.index(call) > max(i for i, line in enumerate(log) if line.startswith("gcloud"))
    assert 'NOMAD_TOKEN="$(bao kv get -field=secret_id secret/gpufleet/nomad/prod-nomad/management-token)"' in result.stdout
    assert "bao" not in result.stderr, "the hint is printed, never run: the management token stays out of the terminal"
