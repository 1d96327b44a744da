"""The NVIDIA device plugin is installed only when HashiCorp's signed SHA256SUMS vouches for it.

The rendered install step runs for real under bash with real gpg, sha256sum and unzip, against a
local HTTP server standing in for releases.hashicorp.com and www.hashicorp.com: a release signed
by a test key whose fingerprint the step is rendered with. Production renders HashiCorp's key
fingerprint (the one HashiCorp's own Vault/Consul images pin); HashiCorp signs
``<product>_<version>_SHA256SUMS`` with a detached ``.sig`` beside it."""

from __future__ import annotations

import functools
import hashlib
import subprocess
import threading
import zipfile
from http.server import HTTPServer, SimpleHTTPRequestHandler
from pathlib import Path

import pytest

from constructs_lib.nomad_agent_config import HASHICORP_KEY_FINGERPRINT, render_plugin_install, render_startup_script

NAME = "nomad-device-nvidia_1.1.0"


def gpg(home: Path, *args: str) -> str:
    return subprocess.run(["gpg", "--batch", "--homedir", str(home), *args], check=True, capture_output=True, text=True).stdout


def new_key(home: Path) -> str:
    home.mkdir(mode=0o700)
    gpg(home, "--passphrase", "", "--quick-gen-key", "Release Test <release@example.com>", "ed25519", "sign", "never")
    return next(line.split(":")[9] for line in gpg(home, "--with-colons", "--fingerprint").splitlines() if line.startswith("fpr"))


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """A signed release tree, the signer's fingerprint, and a server for it."""
    root = tmp_path_factory.mktemp("release")
    fingerprint = new_key(root / "signer")
    (root / "key.asc").write_text(gpg(root / "signer", "--armor", "--export"))
    other = new_key(root / "other")
    (root / "other.asc").write_text(gpg(root / "other", "--armor", "--export"))
    assert other != fingerprint
    d = root / "nomad-device-nvidia" / "1.1.0"
    d.mkdir(parents=True)
    with zipfile.ZipFile(d / f"{NAME}_linux_amd64.zip", "w") as z:
        z.writestr("nomad-device-nvidia", "#!/bin/sh\necho plugin\n")
    digest = hashlib.sha256((d / f"{NAME}_linux_amd64.zip").read_bytes()).hexdigest()
    (d / f"{NAME}_SHA256SUMS").write_text(f"{'0' * 64}  {NAME}_darwin_arm64.zip\n{digest}  {NAME}_linux_amd64.zip\n")
    gpg(root / "signer", "--detach-sign", "--output", str(d / f"{NAME}_SHA256SUMS.sig"), str(d / f"{NAME}_SHA256SUMS"))
    # A mirror that re-signed everything with its own key and serves that key.
    evil = root / "evil" / "nomad-device-nvidia" / "1.1.0"
    evil.mkdir(parents=True)
    for f in (f"{NAME}_linux_amd64.zip", f"{NAME}_SHA256SUMS"):
        (evil / f).write_bytes((d / f).read_bytes())
    gpg(root / "other", "--detach-sign", "--output", str(evil / f"{NAME}_SHA256SUMS.sig"), str(evil / f"{NAME}_SHA256SUMS"))
    server = HTTPServer(("127.0.0.1", 0), functools.partial(SimpleHTTPRequestHandler, directory=str(root)))
    server.RequestHandlerClass.log_message = lambda *_: None
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield root, fingerprint, f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    for home in (root / "signer", root / "other"):
        stop_agent(home)


def stop_agent(home: Path) -> None:
    """gpg starts a gpg-agent per keyring directory and leaves it running: stopped, so no test leaves a daemon."""
    subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], capture_output=True, check=False)


@pytest.fixture(autouse=True)
def no_agent_left(tmp_path):
    """The install step's own keyring (``$dl/gnupg`` under this test's TMPDIR) is left behind when it refuses a
    release (it exits before its ``rm -rf``), and with it the agent gpg started for it."""
    yield
    for home in tmp_path.glob("tmp.*/gnupg"):
        stop_agent(home)


def install(tmp_path: Path, base: str, fingerprint: str, key: str = "key.asc") -> subprocess.CompletedProcess[str]:
    step = render_plugin_install(plugin_dir=str(tmp_path / "plugins"), base_url=base, key_url=f"{base}/{key}", fingerprint=fingerprint)
    (tmp_path / "step.sh").write_text("set -euo pipefail\n" + step + "\n")
    return subprocess.run(["bash", str(tmp_path / "step.sh")], capture_output=True, text=True, check=False, env={"PATH": "/usr/bin:/bin",
                          "TMPDIR": str(tmp_path)}, timeout=60)


def test_a_release_signed_by_the_pinned_key_is_installed(release, tmp_path):
    _, fingerprint, base = release
    result = install(tmp_path, base, fingerprint)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "plugins" / "nomad-device-nvidia").read_text().endswith("echo plugin\n")


def test_fails_when_the_zip_does_not_match_the_signed_checksums(release, tmp_path):
    root, fingerprint, base = release
    zip_path = root / "nomad-device-nvidia" / "1.1.0" / f"{NAME}_linux_amd64.zip"
    good = zip_path.read_bytes()
    try:
        zip_path.write_bytes(good + b"tampered")
        result = install(tmp_path, base, fingerprint)
    finally:
        zip_path.write_bytes(good)
    assert result.returncode == 1 and "does not match HashiCorp's signed SHA256SUMS" in result.stderr
    assert not (tmp_path / "plugins" / "nomad-device-nvidia").exists()


@pytest.mark.parametrize("where", ["key-swapped", "re-signed-mirror"])
def test_fails_when_the_signature_is_not_by_the_pinned_key(release, tmp_path, where):
    """Whoever controls the download also serves a key and may sign with it: only the pinned fingerprint counts."""
    _, fingerprint, base = release
    result = install(tmp_path, base if where == "key-swapped" else f"{base}/evil", fingerprint,
                     key="other.asc" if where == "key-swapped" else "../other.asc")
    assert result.returncode == 1 and "is not signed by HashiCorp's release key" in result.stderr
    assert not (tmp_path / "plugins" / "nomad-device-nvidia").exists()


def test_gpu_boot_scripts_pin_hashicorps_key():
    script = render_startup_script(agent_config="x = 1\n", gpu=True, project="p", secrets=(), certificates="true")
    assert render_plugin_install() in script and HASHICORP_KEY_FINGERPRINT == "C874011F0AB405110D02105534365D9472D7468F"
    assert "https://www.hashicorp.com/.well-known/pgp-key.txt" in script
