"""Nomad agent certificates issued and renewed by a real OpenBao PKI mount, through the very
script an agent runs (constructs_lib.nomad_cert_renewal.SCRIPT), its token holding only the
reviewed policy the cluster file renders.

Controlled clock: the role's TTL is one hour and the renewal window is set in the agent's
settings file; "due" is a window longer than what is left, so nothing here sleeps. The CA is the
kind `nomad tls ca create` makes (EC P-256, self-signed, openssl here), imported with
``config/ca`` as the bootstrap does: a renewed agent and one still on its bootstrap certificate
trust the same CA. Reload is a real SIGHUP to a process that counts them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from urllib.parse import parse_qs, urlparse
from datetime import UTC, datetime
from pathlib import Path

import hvac
import jwt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from clusters.derive.nomad import NomadPkiSpec, PkiRoleSpec
from constructs_lib.nomad_cert_renewal import SCRIPT, render_env
from vault_policies.nomad_pki import GOOGLE_ISSUER, PKI_POLICIES_DIR, apply_pki, import_ca, pki_problems, render_pki_files, render_pki_policy

SPEC = NomadPkiSpec(cluster="pki-test", mount="pki-nomad-pki-test", ttl_hours=1, roles=(
    PkiRoleSpec("server", "server.global.nomad", "nomad-pki-pki-test-server", "nomad-pki-test-server", "pki-test-nomad-srv@p.iam.gserviceaccount.com"),
    PkiRoleSpec("client", "client.global.nomad", "nomad-pki-pki-test-client", "nomad-pki-test-client", "pki-test-nodes@p.iam.gserviceaccount.com")))
SERVER, CLIENT = SPEC.roles
HUP_COUNTER = """
import os, signal, sys, time
counts = {"hups": 0, "syncs": 0}
def write():
    with open(sys.argv[1] + ".tmp", "w") as f:
        f.write(f"{counts['hups']} {counts['syncs']}")
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])
def hup(*_):
    counts["hups"] += 1
    write()
def sync(*_):
    counts["syncs"] += 1
    write()
signal.signal(signal.SIGHUP, hup)
signal.signal(signal.SIGUSR1, sync)
write()
while True:
    time.sleep(0.05)
"""


@pytest.fixture(scope="module")
def offline_ca(tmp_path_factory) -> Path:
    """What the bootstrap keeps offline: the cluster CA's certificate and key."""
    d = tmp_path_factory.mktemp("ca")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1825",
                    "-subj", "/CN=Nomad Agent CA", "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
                    "-keyout", str(d / "ca-key.pem"), "-out", str(d / "ca.pem")], check=True, capture_output=True)
    return d


@pytest.fixture(scope="module")
def google_key():
    """Stands in for Google's signing key: the JWT mount is given its public half instead of
    Google's OIDC discovery, everything else as in production."""
    return ec.generate_private_key(ec.SECP256R1())


@pytest.fixture(scope="module")
def root(openbao, offline_ca, google_key) -> hvac.Client:
    client = hvac.Client(url=openbao.addr, token=openbao.root_token)
    public = google_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    apply_pki(client, SPEC, jwt_config={"jwt_validation_pubkeys": [public], "bound_issuer": GOOGLE_ISSUER})
    import_ca(client, SPEC, ca_cert_pem=(offline_ca / "ca.pem").read_text(), ca_key_pem=(offline_ca / "ca-key.pem").read_text())
    return client


@pytest.fixture
def metadata(google_key):
    """The metadata server's identity endpoint: a token like GCE's format=full one, for the
    service account and audience asked (``?audience=``), signed with the stand-in key."""
    state = {"email": SERVER.service_account}

    class Identity(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            audience = parse_qs(urlparse(self.path).query)["audience"][0]
            now = int(time.time())
            token = jwt.encode({"iss": GOOGLE_ISSUER, "aud": audience, "sub": "112233", "email": state["email"], "email_verified": True,
                                "iat": now, "exp": now + 3600, "google": {"compute_engine": {"project_id": "p"}}}, google_key, algorithm="ES256")
            self.send_response(200)
            self.end_headers()
            self.wfile.write(token.encode())

        def log_message(self, *_: object) -> None:
            return

    server = HTTPServer(("127.0.0.1", 0), Identity)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/identity", state
    server.shutdown()


def token(root: hvac.Client, role: PkiRoleSpec) -> str:
    return root.auth.token.create(policies=[role.policy], no_default_policy=True, ttl="10m")["auth"]["client_token"]


@pytest.fixture
def agent(tmp_path, openbao):
    """A TLS directory, a process that counts SIGHUPs, and a runner for the agent's script."""
    counter_file = tmp_path / "hups"
    proc = subprocess.Popen([sys.executable, "-c", HUP_COUNTER, str(counter_file)])
    while not counter_file.exists():
        time.sleep(0.02)
    (tmp_path / "gpufleet-nomad-cert").write_text(SCRIPT)

    def run(role: PkiRoleSpec, vault_token: str, *, renew_before: int | None = None, identity_url: str = "") -> subprocess.CompletedProcess[str]:
        env_text = render_env(spec=SPEC, role=role, vault_addr=openbao.addr, tls_dir=str(tmp_path / "tls"), reload=f"kill -HUP {proc.pid}",
                              identity_url=identity_url)
        if renew_before is not None:
            env_text = env_text.replace(f"RENEW_BEFORE_SECONDS='{SPEC.renew_before_seconds}'", f"RENEW_BEFORE_SECONDS='{renew_before}'")
        (tmp_path / "cert.env").write_text(env_text + "AGENT_IP='10.50.0.7'\n")
        env = {"PATH": os.environ["PATH"], "GPUFLEET_CERT_ENV": str(tmp_path / "cert.env")} | ({"VAULT_TOKEN": vault_token} if vault_token else {})
        return subprocess.run(["bash", str(tmp_path / "gpufleet-nomad-cert")], env=env, capture_output=True, text=True, check=False, timeout=60)

    def counts() -> tuple[int, int]:
        hup_count, sync_count = counter_file.read_text().split()
        return int(hup_count), int(sync_count)

    def hups() -> int:
        """The SIGHUPs the process has handled: a SIGUSR1 sent now is handled after any SIGHUP already sent
        to it (pending signals are delivered, and Python runs their handlers, lowest number first), so once
        the process counts it, every reload the script asked for is counted. No fixed sleep, which a loaded
        machine could outlast."""
        before = counts()[1]
        proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 30
        while (now := counts())[1] == before:
            assert time.monotonic() < deadline, "the signal counter stopped answering"
            time.sleep(0.01)
        return now[0]

    yield tmp_path / "tls", run, hups
    proc.send_signal(signal.SIGTERM)
    proc.wait()


def cert(tls: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate((tls / "agent.pem").read_bytes())


def test_agent_gets_a_short_lived_certificate_of_its_own_name_from_the_cluster_ca(root, agent, offline_ca):
    tls, run, hups = agent
    result = run(SERVER, token(root, SERVER))
    assert result.returncode == 0, result.stderr
    issued = cert(tls)
    assert issued.subject.rfc4514_string() == "CN=server.global.nomad"
    sans = issued.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sorted(sans.get_values_for_type(x509.DNSName)) == ["localhost", "server.global.nomad"]
    assert sorted(str(ip) for ip in sans.get_values_for_type(x509.IPAddress)) == ["10.50.0.7", "127.0.0.1"]
    lifetime = (issued.not_valid_after_utc - datetime.now(UTC)).total_seconds()
    assert 3500 < lifetime <= 3600, "the role's one-hour TTL, not a year"
    usages = issued.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert {u._name for u in usages} == {"serverAuth", "clientAuth"}
    verify = subprocess.run(["openssl", "verify", "-CAfile", str(offline_ca / "ca.pem"), str(tls / "agent.pem")], capture_output=True, text=True, check=False)
    assert verify.returncode == 0, "agents on the bootstrap CA's certificates trust it: " + verify.stderr
    assert (tls / "ca.pem").read_text() == (offline_ca / "ca.pem").read_text()
    assert oct((tls / "agent-key.pem").stat().st_mode & 0o777) == "0o600"
    assert hups() == 1, "nomad is told to reload its certificates"


def test_renewal_waits_while_enough_is_left_then_reissues_and_reloads(root, agent):
    tls, run, hups = agent
    vault_token = token(root, CLIENT)
    assert run(CLIENT, vault_token).returncode == 0
    first = cert(tls).serial_number
    assert hups() == 1
    fresh = run(CLIENT, vault_token)  # a third of an hour is the window; the certificate has ~60 minutes
    assert fresh.returncode == 0 and fresh.stdout == "" and cert(tls).serial_number == first and hups() == 1
    due = run(CLIENT, vault_token, renew_before=2 * 3600)  # less than the window left: renew
    assert due.returncode == 0, due.stderr
    assert cert(tls).serial_number != first and cert(tls).subject.rfc4514_string() == "CN=client.global.nomad"
    assert hups() == 2


def test_a_client_token_cannot_issue_a_server_certificate(root, agent):
    tls, run, hups = agent
    client_token = token(root, CLIENT)
    refused = run(SERVER, client_token)
    assert refused.returncode != 0 and not (tls / "agent.pem").exists() and hups() == 0
    forged = hvac.Client(url=root.url, token=client_token)
    with pytest.raises(hvac.exceptions.Forbidden):
        forged.write(f"{SPEC.mount}/issue/client", common_name="server.global.nomad")
    with pytest.raises(hvac.exceptions.Forbidden):
        forged.write(f"{SPEC.mount}/sign/client", csr="x", common_name="client.global.nomad")
    with pytest.raises(hvac.exceptions.InvalidRequest):  # the role itself: no other name, even through the policy
        root.write(f"{SPEC.mount}/issue/client", common_name="server.global.nomad")


def test_a_failed_issue_keeps_the_working_certificate(root, agent):
    tls, run, hups = agent
    assert run(SERVER, token(root, SERVER)).returncode == 0
    before = (tls / "agent.pem").read_bytes()
    failed = run(SERVER, "not-a-token", renew_before=2 * 3600)
    assert failed.returncode != 0 and (tls / "agent.pem").read_bytes() == before and hups() == 1
    assert not list(tls.glob(".renew.*")), "the half-written directory is removed"


def test_the_policy_grants_issue_on_its_role_only():
    text = render_pki_policy(SPEC, SERVER)
    assert 'path "pki-nomad-pki-test/issue/server"' in text and text.count('path "') == 1
    assert '"common_name" = ["server.global.nomad"]' in text


def test_an_agent_logs_in_with_its_vm_identity_and_only_as_its_own_service_account(root, agent, metadata):
    tls, run, hups = agent
    url, identity = metadata
    result = run(SERVER, "", identity_url=url)  # no VAULT_TOKEN: the VM's identity token through the JWT mount
    assert result.returncode == 0, result.stderr
    assert cert(tls).subject.rfc4514_string() == "CN=server.global.nomad" and hups() == 1
    identity["email"] = CLIENT.service_account  # a GPU node (tenant code runs there) asking for the server role
    refused = run(SERVER, "", identity_url=url, renew_before=2 * 3600)
    assert refused.returncode != 0 and hups() == 1
    assert run(CLIENT, "", identity_url=url, renew_before=2 * 3600).returncode == 0
    assert cert(tls).subject.rfc4514_string() == "CN=client.global.nomad"


def test_reviewed_policy_files_must_be_the_rendering_none_missing_stale_or_orphaned(tmp_path):
    assert [p.message.split(";")[0] for p in pki_problems(tmp_path, (SPEC,))] == ["missing: the cluster asks for vault-pki certificates"] * 2
    written = render_pki_files(tmp_path, (SPEC,))
    assert sorted(p.name for p in written) == ["nomad-pki-pki-test-client.hcl", "nomad-pki-pki-test-server.hcl"]
    assert pki_problems(tmp_path, (SPEC,)) == []
    server = tmp_path / PKI_POLICIES_DIR / "nomad-pki-pki-test-server.hcl"
    server.write_text(server.read_text().replace('"ttl" = []', '"ttl" = []\n    "format" = []'))
    (stale,) = pki_problems(tmp_path, (SPEC,))
    assert stale.file == str(server) and "hand-edited or stale" in stale.message
    assert [p.message.split(";")[0] for p in pki_problems(tmp_path, ())] == ["no cluster asks for this PKI policy"] * 2


def test_the_repos_pki_policies_are_current():
    from vault_policies.validate import check

    assert [p for p in check(Path(__file__).resolve().parents[2]) if "pki" in p.file] == []


def test_pki_apply_refuses_a_cluster_on_static_certificates_in_one_line(capsys, tmp_path):
    from gpufleet.cli import main

    (tmp_path / "ca.pem").write_text("x")
    assert main(["nomad", "pki-apply", "prod-gke", "--ca-cert", str(tmp_path / "ca.pem"), "--ca-key", str(tmp_path / "ca.pem")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: 'prod-gke' is not a Nomad cluster") and err.count("\n") == 1
