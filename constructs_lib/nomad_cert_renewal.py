"""Agent certificates that renew: a script every Nomad agent of a ``vault-pki`` cluster runs at
boot and from a systemd timer, which issues a fresh certificate from the cluster's OpenBao/Vault
PKI role when the current one has less than a third of its lifetime left, replaces the files and
sends nomad SIGHUP (Nomad reloads its TLS certificates on SIGHUP, command/agent/command.go
handleReload, v1.10.5).

The script is the same text everywhere; what differs (Vault address, mount, role, name, TTL,
renewal window, files, how to reload) is an environment file beside it, so the tests run the very
script an agent runs against a real OpenBao, with a TLS directory and a reload of their own.

Login: with ``VAULT_TOKEN`` set (an operator) the script uses it; on GCE it logs in with the
VM's identity token from the metadata server (audience ``http://vault/<role>``, ``format=full``)
through the cluster's JWT auth mount (vault_policies.nomad_pki), so no credential is stored on
the VM. Nothing it handles is written
outside the TLS directory, and the key never passes through a command line.
"""

from __future__ import annotations

from clusters.derive.nomad import NOMAD_TLS_DIR, NomadPkiSpec, PkiRoleSpec
from vault_policies.nomad_pki import JWT_MOUNT

SCRIPT_PATH = "/usr/local/bin/gpufleet-nomad-cert"
ENV_PATH = "/etc/gpufleet/nomad-cert.env"
UNIT = "gpufleet-nomad-cert"
RELOAD = "systemctl kill --signal=HUP nomad"
METADATA_IDENTITY = "http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/identity"
METADATA_TOKEN = "http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/token"
METADATA_IP = "http://metadata.google.internal/computeMetadata/v1/instance/network-interfaces/0/ip"

SCRIPT = r"""#!/bin/bash
# gpufleet-nomad-cert: renew this Nomad agent's certificate from the cluster's PKI role when less
# than RENEW_BEFORE_SECONDS of it is left; reload nomad when it did. Settings: the env file.
# (No brace expansions: the boot script is a Terraform string, where they would interpolate.)
set -eo pipefail
env_file=$(printenv GPUFLEET_CERT_ENV || echo /etc/gpufleet/nomad-cert.env)
. "$env_file"
cert="$TLS_DIR/agent.pem"
if [ -s "$cert" ] && [ -s "$TLS_DIR/agent-key.pem" ] && openssl x509 -checkend "$RENEW_BEFORE_SECONDS" -noout -in "$cert" >/dev/null 2>&1; then
  exit 0
fi
curl_vault() {
  if [ -n "$VAULT_CACERT" ]; then curl -fsS --cacert "$VAULT_CACERT" "$@"; else curl -fsS "$@"; fi
}
if [ -z "$VAULT_TOKEN" ]; then
  jwt=$(curl -fsS -H 'Metadata-Flavor: Google' "$IDENTITY_URL?audience=http://vault/$AUTH_ROLE&format=full")
  VAULT_TOKEN=$(printf '{"role":"%s","jwt":"%s"}' "$AUTH_ROLE" "$jwt" | curl_vault -X POST --data @- "$VAULT_ADDR/v1/auth/$AUTH_MOUNT/login" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["auth"]["client_token"])')
  unset jwt
fi
ip_sans="127.0.0.1"
if [ -n "$API_FORWARDING_RULE" ]; then
  # Servers: the API load balancer's address, which callers dial; read with this VM's own
  # compute.viewer grant (the template cannot name it: the balancer is built on the groups).
  access=$(curl -fsS -H 'Metadata-Flavor: Google' METADATA_TOKEN | python3 -c 'import json,sys; print(json.load(sys.stdin)["access_token"])')
  lb=$(printf 'Authorization: Bearer %s\n' "$access" | curl -fsS -H @- "https://compute.googleapis.com/compute/v1/$API_FORWARDING_RULE" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["IPAddress"])')
  unset access
  EXTRA_IP_SANS="$EXTRA_IP_SANS,$lb"
fi
if [ -z "$AGENT_IP" ]; then AGENT_IP=$(curl -fsS -m 2 -H 'Metadata-Flavor: Google' METADATA_IP 2>/dev/null || true); fi
for ip in $AGENT_IP $(echo "$EXTRA_IP_SANS" | tr ',' ' '); do ip_sans="$ip_sans,$ip"; done
body=$(printf '{"common_name":"%s","alt_names":"localhost","ip_sans":"%s","ttl":"%s"}' "$COMMON_NAME" "$ip_sans" "$TTL")
umask 077
mkdir -p "$TLS_DIR"
new=$(mktemp -d "$TLS_DIR/.renew.XXXXXX")
trap 'rm -rf "$new"' EXIT
printf 'X-Vault-Token: %s\n' "$VAULT_TOKEN" | curl_vault -X POST -H @- --data "$body" "$VAULT_ADDR/v1/$PKI_MOUNT/issue/$PKI_ROLE" \
  | python3 -c '
import json, sys
data = json.load(sys.stdin)["data"]
out = sys.argv[1]
chain = "".join(c + "\n" for c in data.get("ca_chain") or [] if c.strip() != data["issuing_ca"].strip())
open(out + "/agent.pem", "w").write(data["certificate"] + "\n" + chain)
open(out + "/agent-key.pem", "w").write(data["private_key"] + "\n")
open(out + "/ca.pem", "w").write(data["issuing_ca"] + "\n")
' "$new"
openssl x509 -noout -checkend 0 -in "$new/agent.pem" >/dev/null
if [ -n "$OWNER" ]; then chown "$OWNER" "$new"/*.pem; fi
mv -f "$new/ca.pem" "$TLS_DIR/ca.pem"
mv -f "$new/agent-key.pem" "$TLS_DIR/agent-key.pem"
mv -f "$new/agent.pem" "$TLS_DIR/agent.pem"
echo "gpufleet-nomad-cert: issued $COMMON_NAME until $(openssl x509 -noout -enddate -in "$cert" | cut -d= -f2)"
if [ -n "$RELOAD" ] && [ "$1" != "--no-reload" ]; then eval "$RELOAD"; fi
""".replace("METADATA_TOKEN", METADATA_TOKEN).replace("METADATA_IP", METADATA_IP)


def render_env(*, spec: NomadPkiSpec, role: PkiRoleSpec, vault_addr: str, tls_dir: str = NOMAD_TLS_DIR, reload: str = RELOAD,
               owner: str = "", auth_mount: str = JWT_MOUNT, api_forwarding_rule: str = "", identity_url: str = METADATA_IDENTITY) -> str:
    """The agent's settings for the script. Values are checked names and numbers from the
    cluster file (schema patterns), so plain shell assignments are safe."""
    values = {"VAULT_ADDR": vault_addr, "PKI_MOUNT": spec.mount, "PKI_ROLE": role.name, "COMMON_NAME": role.common_name,
              "TTL": f"{spec.ttl_hours}h", "RENEW_BEFORE_SECONDS": str(spec.renew_before_seconds), "TLS_DIR": tls_dir,
              "AUTH_MOUNT": auth_mount, "AUTH_ROLE": role.auth_role, "OWNER": owner, "RELOAD": reload,
              "API_FORWARDING_RULE": api_forwarding_rule, "IDENTITY_URL": identity_url}
    return "".join(f"{key}='{value}'\n" for key, value in values.items())


_TIMER = """[Unit]
Description=Renew the Nomad agent certificate (gpufleet) before a third of its lifetime is left
[Timer]
OnBootSec=15min
OnUnitActiveSec=1h
RandomizedDelaySec=5min
Persistent=true
[Install]
WantedBy=timers.target
"""
_SERVICE = f"""[Unit]
Description=Renew the Nomad agent certificate (gpufleet)
After=network-online.target
[Service]
Type=oneshot
ExecStart={SCRIPT_PATH}
"""


def render_renewal_boot(*, env: str) -> str:
    """Boot-script step: install the script, its settings and timer, and issue a certificate now
    (retrying until OpenBao answers) before nomad starts with it."""
    return "\n".join([
        "mkdir -p /etc/gpufleet",
        f"cat > {SCRIPT_PATH} <<'GPUFLEET_CERT_SCRIPT'\n{SCRIPT}GPUFLEET_CERT_SCRIPT",
        f"chmod 755 {SCRIPT_PATH}",
        f"cat > {ENV_PATH} <<'GPUFLEET_CERT_ENV'\n{env}GPUFLEET_CERT_ENV",
        f"until {SCRIPT_PATH} --no-reload; do echo 'gpufleet: waiting for a certificate from the PKI role (docs/nomad.md)' >&2; sleep 30; done",
        f"cat > /etc/systemd/system/{UNIT}.service <<'GPUFLEET_UNIT'\n{_SERVICE}GPUFLEET_UNIT",
        f"cat > /etc/systemd/system/{UNIT}.timer <<'GPUFLEET_UNIT'\n{_TIMER}GPUFLEET_UNIT",
        "systemctl daemon-reload",
        f"systemctl enable --now {UNIT}.timer",
    ])
