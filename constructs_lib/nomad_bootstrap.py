"""The Nomad bootstrap script: creates the cluster's CA, agent certificates and gossip key on an
operator's machine and stores them as Secret Manager versions, where the agents' boot scripts
read them. Rendered by ``gpufleet nomad bootstrap-script <cluster>``; nothing it creates is
written to the repository, the synthesized JSON or Terraform state.

Order (README, "Nomad: bootstrap"): apply the infra stack (it creates the empty secrets and the
API load balancer; agents wait for the secrets), run this script with the API address from the
``nomad_address`` output (it bootstraps the ACLs too, ``gpufleet nomad acl-bootstrap``), then the scheduler stack.
"""

from __future__ import annotations

from clusters.derive.nomad import NomadSecretSpec, management_token_path
from constructs_lib.nomad_agent_config import HTTP_PORT
from vault_policies.layout import KV_MOUNT

# What `nomad tls ca create` / `nomad tls cert create` write (command/tls_*.go, v1.10.5).
CA_CERT = "nomad-agent-ca.pem"
CA_KEY = "nomad-agent-ca-key.pem"
CERT_DAYS = 365


def _files(region: str) -> dict[str, str]:
    return {
        "ca-cert": CA_CERT,
        "server-cert": f"{region}-server-nomad.pem",
        "server-key": f"{region}-server-nomad-key.pem",
        "client-cert": f"{region}-client-nomad.pem",
        "client-key": f"{region}-client-nomad-key.pem",
        "gossip-key": "gossip.key",
        "autoscaler-cert": "autoscaler/autoscaler.pem",
        "autoscaler-key": "autoscaler/autoscaler-key.pem",
        "prometheus-ca": "$PROMETHEUS_CA",
    }


def render_bootstrap_script(*, cluster: str, project: str, region: str, secrets: tuple[NomadSecretSpec, ...], pki: bool = False) -> str:
    """The script text; it refuses to keep the CA key inside a git work tree, and deletes every
    other generated file when it exits, so keys live only in Secret Manager and the offline dir."""
    files = _files(region)
    names = {s.name for s in secrets}
    lines = [
        "#!/bin/bash",
        f"# Nomad bootstrap for cluster {cluster}: CA, agent certificates, gossip key -> Secret Manager ({project}).",
        "# Usage: bash bootstrap.sh <API load balancer IP (nomad_address output)> <offline dir for the CA key and CLI cert>",
        "# Needs: nomad (CLI), gcloud authenticated as an operator who may add secret versions.",
        "set -euo pipefail",
        'API_IP="$1"',
        'KEEP="$2"',
        'mkdir -p "$KEEP"',
        'KEEP=$(cd "$KEEP" && pwd)',
        'if git -C "$KEEP" rev-parse --is-inside-work-tree >/dev/null 2>&1; then echo "refusing: $KEEP is inside a git repository" >&2; exit 2; fi',
        "umask 077",
        'work=$(mktemp -d)',
        'trap \'rm -rf "$work"\' EXIT',
        'cd "$work"',
    ]
    if "server-cert" not in names:
        # Existing servers: their CA signs the new client certificate; it is read, never stored.
        lines += [
            ': "${NOMAD_CA_DIR:?set NOMAD_CA_DIR to the directory holding the existing servers\' nomad-agent-ca.pem and -key.pem}"',
            f'cp "$NOMAD_CA_DIR/{CA_CERT}" "$NOMAD_CA_DIR/{CA_KEY}" .',
        ]
    else:
        lines += [
            "nomad tls ca create",
            f'nomad tls cert create -server -region {region} -days {CERT_DAYS} -additional-ipaddress "$API_IP"',
            # 32 random bytes: AES-256 gossip encryption (Nomad docs, "Enable gossip encryption").
            "openssl rand -base64 32 > gossip.key",
        ]
    lines += [
        f"nomad tls cert create -client -region {region} -days {CERT_DAYS}",
        f"nomad tls cert create -cli -region {region} -days {CERT_DAYS}",
    ]
    prometheus = "autoscaler-token" in names
    if prometheus:
        # The autoscaler's Prometheus scrapes every server's API, which demands a client certificate
        # (verify_https_client): its own -cli certificate, in a subdirectory because `nomad tls cert
        # create` refuses to overwrite the operator's.
        lines.append(f"(mkdir prometheus && cd prometheus && nomad tls cert create -cli -region {region} -days {CERT_DAYS}"
                     f" -ca ../{CA_CERT} -key ../{CA_KEY} && mv {region}-cli-nomad.pem prometheus.pem && mv {region}-cli-nomad-key.pem prometheus-key.pem)")
    if "autoscaler-cert" in names:
        # The Nomad Autoscaler's own client certificate: the servers' key is not lent to another program.
        lines.append(f"(mkdir autoscaler && cd autoscaler && nomad tls cert create -cli -region {region} -days {CERT_DAYS}"
                     f" -ca ../{CA_CERT} -key ../{CA_KEY} && mv {region}-cli-nomad.pem autoscaler.pem && mv {region}-cli-nomad-key.pem autoscaler-key.pem)")
    if "prometheus-ca" in names:
        at = lines.index("umask 077")
        lines[at:at] = [': "${PROMETHEUS_CA:?set PROMETHEUS_CA to the CA certificate file that signed the https Prometheus certificate}"',
                        'PROMETHEUS_CA="$(cd "$(dirname "$PROMETHEUS_CA")" && pwd)/$(basename "$PROMETHEUS_CA")"']
    for secret in secrets:
        if secret.name not in files:
            continue
        lines.append(f'gcloud secrets versions add {secret.secret_id} --project {project} --data-file="{files[secret.name]}"')
    if pki:
        # Agents issue and renew their certificates from OpenBao/Vault; the CA made (or read) above
        # becomes the PKI mount's issuer, so agents still on a bootstrap certificate keep trusting them.
        lines.append(f": \"${{VAULT_ADDR:?set VAULT_ADDR and VAULT_TOKEN (an operator token) for the PKI setup}}\"")
        lines.append(f"gpufleet nomad pki-apply {cluster} --ca-cert {CA_CERT} --ca-key {CA_KEY}")
    if "server-cert" in names:
        # ACLs: bootstrapped once by gpufleet itself, the management token going straight to OpenBao/Vault KV
        # (gpufleet/nomad_acl.py; safe to repeat). It waits for the servers, which boot once the secrets above exist.
        lines += [
            ': "${VAULT_ADDR:?set VAULT_ADDR and VAULT_TOKEN (an operator token): the Nomad management token is stored there}"',
            f'NOMAD_ADDR="https://$API_IP:{HTTP_PORT}" NOMAD_CACERT="$work/{CA_CERT}" NOMAD_CLIENT_CERT="$work/{region}-cli-nomad.pem"'
            f' NOMAD_CLIENT_KEY="$work/{region}-cli-nomad-key.pem" gpufleet nomad acl-bootstrap {cluster}',
        ]
    kept = ([CA_CERT, f"{region}-cli-nomad.pem", f"{region}-cli-nomad-key.pem"] + ([CA_KEY] if "server-cert" in names else [])
            + (["prometheus/prometheus.pem", "prometheus/prometheus-key.pem"] if prometheus else []))
    lines += [
        f'cp {" ".join(kept)} "$KEEP"/',
        f'echo "stored {", ".join(s.secret_id for s in secrets if s.name in files)} in Secret Manager; CA and CLI certificate in $KEEP (keep it offline)"',
        # Single quotes: printed for the operator, never run here (the token must not reach this terminal).
        *([f"echo 'after the scheduler stack is applied: NOMAD_TOKEN=\"$(bao kv get -field=secret_id {KV_MOUNT}/{management_token_path(cluster)})\""
           f" nomad acl token create -name autoscaler -policy gpufleet-autoscaler -t \"{{{{.SecretID}}}}\""
           f" | gcloud secrets versions add {s.secret_id} --project {project} --data-file=-'" for s in secrets if s.name == "autoscaler-token"]),
        *([f"echo 'after the scheduler stack is applied: NOMAD_TOKEN=\"$(bao kv get -field=secret_id {KV_MOUNT}/{management_token_path(cluster)})\""
           f" nomad acl token create -name gpu-health -policy gpufleet-gpu-health -t \"{{{{.SecretID}}}}\""
           f" | gcloud secrets versions add {s.secret_id} --project {project} --data-file=-'" for s in secrets if s.name == "gpu-health-token"]),
        *(['echo "Prometheus: install $KEEP/prometheus.pem, prometheus-key.pem and ' + CA_CERT + ' as /etc/prometheus/nomad/prometheus.pem,'
            f' prometheus-key.pem and ca.pem; scrape job: gpufleet nomad scrape-config {cluster}"'] if prometheus else []),
        # The certificates made here do not renew: check warns 30 days before the date the file records.
        f'echo "record in clusters/{cluster}.yaml: nomad.tls.static_expires: \\"$(date -u -d "+{CERT_DAYS} days" +%F)\\""',
        f'echo "API callers: NOMAD_ADDR=https://$API_IP:{HTTP_PORT} NOMAD_CACERT=$KEEP/' + CA_CERT + ' NOMAD_CLIENT_CERT=$KEEP/' + region + '-cli-nomad.pem NOMAD_CLIENT_KEY=$KEEP/' + region + '-cli-nomad-key.pem"',
    ]
    return "\n".join(lines) + "\n"
