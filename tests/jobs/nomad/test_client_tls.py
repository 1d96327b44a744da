"""gpufleet's Nomad client over mTLS, against the API double serving real TLS (a double that
speaks Nomad's documented JSON; certificates from a CA made at test time with openssl).

The fleet's agents set ``tls { http = true, verify_https_client = true }``: the client must
verify the servers against the cluster CA (NOMAD_CACERT), present the CLI certificate
(NOMAD_CLIENT_CERT/KEY) and, when it reaches the API by load-balancer IP, check the name
Nomad's server certificates carry (NOMAD_TLS_SERVER_NAME=server.<region>.nomad)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from clusters.errors import UserError
from jobs.nomad.client import NomadClient, NomadError, NomadSettings
from jobs.loader import find, load
from jobs.spec import FinetuneSpec
from tests.jobs.conftest import a100_nodes
from tests.jobs.nomad_double import NomadDouble
from tests.jobs.tls_material import TlsMaterial, make_tls_material

TOKEN = "nomad-acl-test-token"


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsMaterial:
    return make_tls_material(tmp_path_factory.mktemp("nomad-tls"))


@pytest.fixture
def mtls_nomad(tls: TlsMaterial) -> Iterator[NomadDouble]:
    double = NomadDouble(a100_nodes(), acl_token=TOKEN, tls=tls.server_context()).start()
    yield double
    double.stop()


@pytest.fixture(scope="module")
def llama() -> FinetuneSpec:
    return load(find("finetune-llama"))


def env(tls: TlsMaterial, address: str, **overrides: str) -> dict[str, str]:
    base = {"NOMAD_ADDR": address, "NOMAD_TOKEN": TOKEN, "NOMAD_CACERT": str(tls.ca),
            "NOMAD_CLIENT_CERT": str(tls.cli_cert), "NOMAD_CLIENT_KEY": str(tls.cli_key)}
    return {k: v for k, v in {**base, **overrides}.items() if v}


def client(environ: dict[str, str]) -> NomadClient:
    settings = NomadSettings.from_env(environ)
    return NomadClient(NomadSettings(**{**settings.__dict__, "retries": 0, "timeout_seconds": 5.0}))


def test_client_verifies_the_ca_and_presents_the_cli_certificate(tls: TlsMaterial, mtls_nomad: NomadDouble, llama: FinetuneSpec) -> None:
    c = client(env(tls, f"https://localhost:{mtls_nomad.port}"))
    assert c.plan(llama).placeable
    c.register(llama)
    assert [r.path for r in mtls_nomad.requests] == ["/v1/job/finetune-llama/plan", "/v1/jobs"]


def test_load_balancer_ip_works_with_the_server_name(tls: TlsMaterial, mtls_nomad: NomadDouble, llama: FinetuneSpec) -> None:
    """The API is reached by IP; the certificate names server.global.nomad (not the IP)."""
    address = f"https://127.0.0.1:{mtls_nomad.port}"
    assert client(env(tls, address, NOMAD_TLS_SERVER_NAME="server.global.nomad")).plan(llama).placeable
    with pytest.raises(NomadError, match=r"certificate for another name; set NOMAD_TLS_SERVER_NAME=server.<region>.nomad"):
        client(env(tls, address)).plan(llama)


def test_fails_when_no_client_certificate_is_presented(tls: TlsMaterial, mtls_nomad: NomadDouble, llama: FinetuneSpec) -> None:
    with pytest.raises(NomadError, match=r"requires a client certificate \(mTLS\); set NOMAD_CLIENT_CERT and NOMAD_CLIENT_KEY"):
        client(env(tls, f"https://localhost:{mtls_nomad.port}", NOMAD_CLIENT_CERT="", NOMAD_CLIENT_KEY="")).plan(llama)
    assert mtls_nomad.requests == [], "the double never saw a request without a client certificate"


def test_fails_when_the_server_is_not_signed_by_nomad_cacert(tls: TlsMaterial, mtls_nomad: NomadDouble, llama: FinetuneSpec) -> None:
    with pytest.raises(NomadError, match=r"is not signed by NOMAD_CACERT '.*foreign-ca.pem'; set NOMAD_CACERT to the cluster's CA"):
        client(env(tls, f"https://localhost:{mtls_nomad.port}", NOMAD_CACERT=str(tls.foreign_ca))).plan(llama)
    assert mtls_nomad.requests == []


def test_fails_when_only_half_of_the_client_certificate_is_set(tls: TlsMaterial, tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"NOMAD_CLIENT_CERT is set but NOMAD_CLIENT_KEY is not; set both"):
        NomadSettings.from_env(env(tls, "https://localhost:1", NOMAD_CLIENT_KEY=""))
    with pytest.raises(UserError, match=r"NOMAD_CLIENT_KEY '.*missing.pem' is not a file"):
        NomadSettings.from_env(env(tls, "https://localhost:1", NOMAD_CLIENT_KEY=str(tmp_path / "missing.pem")))
