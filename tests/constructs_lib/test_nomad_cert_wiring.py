"""A vault-pki cluster's agents issue their certificate from the PKI role at boot and renew it from
a timer, with the script tests/vault_policies/test_nomad_pki.py runs against a real OpenBao; they
no longer read agent certificates from Secret Manager (the secrets stay: protected resources)."""

from __future__ import annotations

import re
import subprocess

from clusters.derive.nomad import derive_nomad_pki, derive_nomad_secrets
from constructs_lib.nomad_cert_renewal import SCRIPT


def scripts(stack_json) -> dict[str, str]:
    templates = stack_json("prod-nomad")["resource"]["google_compute_instance_template"]
    return {name: t["metadata_startup_script"] for name, t in templates.items()}


def env_of(script: str) -> dict[str, str]:
    text = re.search(r"<<'GPUFLEET_CERT_ENV'\n(.*?)GPUFLEET_CERT_ENV", script, re.S).group(1)
    return dict(re.findall(r"^(\w+)='([^']*)'$", text, re.M))


def test_every_agent_issues_its_certificate_before_nomad_starts_and_renews_it(stack_json, tmp_path):
    for name, script in scripts(stack_json).items():
        installed = re.search(r"<<'GPUFLEET_CERT_SCRIPT'\n(.*?)GPUFLEET_CERT_SCRIPT", script, re.S).group(1)
        assert installed == SCRIPT, name
        assert script.index("gpufleet-nomad-cert --no-reload") < script.index("systemctl restart nomad"), name
        assert "systemctl enable --now gpufleet-nomad-cert.timer" in script and "OnUnitActiveSec=1h" in script
        assert not re.search(r"gpufleet_secret \S+-(ca-cert|server-cert|server-key|client-cert|client-key) ", script), name
        (tmp_path / f"{name}.sh").write_text(script)
        assert subprocess.run(["bash", "-n", str(tmp_path / f"{name}.sh")], check=False).returncode == 0


def test_servers_and_clients_ask_for_their_own_role_name_and_lifetime(stack_json, example_configs):
    spec = derive_nomad_pki({c.name: c for c in example_configs}["prod-nomad"])
    server = env_of(scripts(stack_json)["nomad_server_template"])
    assert (server["PKI_MOUNT"], server["PKI_ROLE"], server["COMMON_NAME"], server["TTL"]) == ("pki-nomad-prod-nomad", "server", "server.global.nomad", "72h")
    assert server["RENEW_BEFORE_SECONDS"] == str(24 * 3600) == str(spec.renew_before_seconds)
    assert server["OWNER"] == "nomad:nomad" and server["AUTH_ROLE"] == "nomad-prod-nomad-server"
    assert server["API_FORWARDING_RULE"] == "projects/ml-finetune-prod/regions/europe-west4/forwardingRules/prod-nomad-nomad-api"
    assert server["RELOAD"] == "systemctl kill --signal=HUP nomad; systemctl try-restart gpufleet-nomad-autoscaler"
    assert server["VAULT_ADDR"] == "https://vault.example.com:8200"
    client = env_of(scripts(stack_json)["nomad_client_template_l4"])
    assert (client["PKI_ROLE"], client["COMMON_NAME"], client["OWNER"], client["API_FORWARDING_RULE"]) == ("client", "client.global.nomad", "", "")


def test_login_roles_name_the_service_accounts_the_stack_creates(stack_json, example_configs):
    spec = derive_nomad_pki({c.name: c for c in example_configs}["prod-nomad"])
    accounts = {a["account_id"] for a in stack_json("prod-nomad")["resource"]["google_service_account"].values()}
    assert {r.service_account.split("@")[0] for r in spec.roles} <= accounts
    assert all(r.service_account.endswith("@ml-finetune-prod.iam.gserviceaccount.com") for r in spec.roles)


def test_the_agent_tls_secrets_stay_in_terraform(stack_json, example_configs):
    """Moving a fleet to vault-pki destroys nothing: the secrets remain, only unread."""
    config = {c.name: c for c in example_configs}["prod-nomad"]
    secrets = stack_json("prod-nomad")["resource"]["google_secret_manager_secret"]
    assert {s["secret_id"] for s in secrets.values()} == {s.secret_id for s in derive_nomad_secrets(config)}
    assert "prod-nomad-nomad-server-key" in {s["secret_id"] for s in secrets.values()}
