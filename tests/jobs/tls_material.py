"""A throwaway CA and certificates for the TLS tests, made with the openssl CLI at test time.

Shaped like the Nomad bootstrap's output (``nomad tls cert create``): a server certificate for
``server.global.nomad`` (plus ``localhost``), a CLI client certificate, and a second, foreign CA
to prove the client rejects servers it was not told to trust. Nothing here is a real secret.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TlsMaterial:
    ca: Path
    server_cert: Path
    server_key: Path
    cli_cert: Path
    cli_key: Path
    foreign_ca: Path

    def server_context(self, *, require_client_cert: bool = True) -> ssl.SSLContext:
        """What a Nomad agent with ``tls { http = true, verify_https_client = true }`` does."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.server_cert, self.server_key)
        context.load_verify_locations(self.ca)
        context.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_NONE
        return context


def _openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args[:2])} failed: {result.stderr.strip()}")


def _ca(directory: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", f"{name}-key.pem",
             "-out", f"{name}.pem", "-days", "2", "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=directory)


def _leaf(directory: Path, name: str, cn: str, sans: str, usage: str) -> None:
    (directory / f"{name}.ext").write_text(f"subjectAltName={sans}\nextendedKeyUsage={usage}\nbasicConstraints=CA:FALSE\n")
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", f"{name}-key.pem",
             "-out", f"{name}.csr", "-subj", f"/CN={cn}", cwd=directory)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem", "-CAcreateserial",
             "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=directory)


def make_tls_material(directory: Path) -> TlsMaterial:
    if shutil.which("openssl") is None:
        raise RuntimeError("the openssl CLI is not on PATH; the TLS tests need it to make a test CA (apt-get install openssl)")
    _ca(directory, "ca")
    _ca(directory, "foreign-ca")
    _leaf(directory, "server", "server.global.nomad", "DNS:server.global.nomad,DNS:localhost", "serverAuth,clientAuth")
    _leaf(directory, "cli", "cli.global.nomad", "DNS:cli.global.nomad", "clientAuth")
    return TlsMaterial(directory / "ca.pem", directory / "server.pem", directory / "server-key.pem",
                       directory / "cli.pem", directory / "cli-key.pem", directory / "foreign-ca.pem")
