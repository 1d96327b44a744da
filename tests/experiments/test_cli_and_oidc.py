"""``gpufleet exp`` against the service on a real socket, and OIDC JWTs from a local issuer
(its JWKS served over HTTP on 127.0.0.1, tokens signed with its RSA key by PyJWT)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from experiments.auth import OidcSettings
from gpufleet.cli import main
from tests.experiments.conftest import UnusedRunner

META = ["--meta", "dataset_uri=hf://datasets/acme/chat@v3", "--meta", "run_id=r1"]


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_exp_commands_submit_list_show_events_cancel(live, monkeypatch, capsys):
    monkeypatch.setenv("GPUFLEET_API", live["base"])
    monkeypatch.setenv("GPUFLEET_API_TOKEN", live["tokens"]["finetune"])
    code, out, _ = _run(capsys, "exp", "submit", "finetune-llama", *META, "--idempotency-key", "k1", "--json")
    assert code == 0
    exp = json.loads(out)
    assert exp["status"] == "pending"
    code, out, _ = _run(capsys, "exp", "submit", "finetune-llama", *META, "--idempotency-key", "k1", "--json")
    assert json.loads(out)["id"] == exp["id"]
    code, out, _ = _run(capsys, "exp", "list", "--json")
    assert [e["id"] for e in json.loads(out)["items"]] == [exp["id"]]
    code, out, _ = _run(capsys, "exp", "list")
    assert code == 0 and exp["id"][:8] in out and "pending" in out
    code, out, _ = _run(capsys, "exp", "show", exp["id"])
    assert code == 0 and "finetune / finetune-llama" in out
    code, out, _ = _run(capsys, "exp", "cancel", exp["id"])
    assert code == 0 and "cancelled" in out
    code, out, _ = _run(capsys, "exp", "events", exp["id"], "--json")
    assert [e["to"] for e in json.loads(out)["events"] if e["kind"] == "state"] == ["cancelled"]
    code, out, _ = _run(capsys, "exp", "watch", exp["id"])
    assert code == 1 and "cancelled" in out  # watch exits 1 unless the experiment succeeded


def test_exp_budget_shows_budget_spent_committed_and_left_of_your_tenants(live, monkeypatch, capsys):
    """prod-nomad's example file: finetune has $50,000 a month (stop), eval $20,000 (warn)."""
    monkeypatch.setenv("GPUFLEET_API", live["base"])
    monkeypatch.setenv("GPUFLEET_API_TOKEN", live["tokens"]["finetune"])
    assert _run(capsys, "exp", "submit", "finetune-llama", *META)[0] == 0
    code, out, _ = _run(capsys, "exp", "budget", "--json")
    assert code == 0 and json.loads(out) == [{"cluster": "prod-nomad", "tenant": "finetune", "month": "2026-12", "budget_usd_month": 50000.0,
                                              "policy": "stop", "spent_usd": 0.0, "committed_usd": 35.16, "left_usd": 49964.84, "live_runs": 1}]
    code, out, _ = _run(capsys, "exp", "budget")
    assert code == 0 and "prod-nomad/finetune" in out and "50,000.00" in out and "49,964.84" in out and "eval" not in out
    monkeypatch.setenv("GPUFLEET_API_TOKEN", live["tokens"]["research"])  # prod-gke's tenants have no budget
    code, out, _ = _run(capsys, "exp", "budget")
    assert code == 0 and "no budget set for your tenants" in out


def test_fails_with_one_line_and_exit_2_on_api_errors(live, monkeypatch, capsys):
    monkeypatch.setenv("GPUFLEET_API", live["base"])
    monkeypatch.setenv("GPUFLEET_API_TOKEN", live["tokens"]["finetune"])
    code, out, err = _run(capsys, "exp", "submit", "finetune-llama", *META, "--meta", "lr=3e-4")
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: 422: ") and "(meta.lr)" in err and "Traceback" not in err
    monkeypatch.setenv("GPUFLEET_API_TOKEN", "gfx_wrong")
    code, _, err = _run(capsys, "exp", "list")
    assert code == 2 and err.startswith("error: 401: ")
    monkeypatch.delenv("GPUFLEET_API_TOKEN")
    code, _, err = _run(capsys, "exp", "list")
    assert code == 2 and "gpufleet api token create" in err
    monkeypatch.setenv("GPUFLEET_API_TOKEN", "x")
    monkeypatch.setenv("GPUFLEET_API", "http://127.0.0.1:9")
    code, _, err = _run(capsys, "exp", "list")
    assert code == 2 and "cannot reach the control plane" in err
    monkeypatch.setenv("GPUFLEET_API", "127.0.0.1:8787")  # newcomer week: was "cannot reach" though the service ran
    code, _, err = _run(capsys, "exp", "list")
    assert code == 2 and "has no scheme; set it like http://127.0.0.1:8787" in err and len(err.strip().splitlines()) == 1


ISSUER = "https://ci.example.test"
AUDIENCE = "gpufleet"


@pytest.fixture(scope="module")
def issuer() -> Iterator[dict]:
    """A local OIDC issuer: an RSA key, its JWKS at http://127.0.0.1:<port>/jwks."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    body = json.dumps({"keys": [{**jwk, "kid": "ci-1", "use": "sig", "alg": "RS256"}]}).encode()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            return

        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/jwks" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield {"key": key, "jwks_url": f"http://127.0.0.1:{server.server_address[1]}/jwks"}
    server.shutdown()
    server.server_close()


def _token(key, **claims) -> str:
    now = int(time.time())
    payload = {"iss": ISSUER, "aud": AUDIENCE, "sub": "repo:acme/train:ref:refs/heads/main", "iat": now, "exp": now + 300, "repository_owner": "acme-finetune", **claims}
    return jwt.encode(payload, key, algorithm="RS256", headers={"kid": "ci-1"})


def test_oidc_tokens_map_a_claim_to_a_tenant_and_everything_else_is_refused(make_service, sqlite_url, issuer):
    oidc = OidcSettings(issuer=ISSUER, audience=AUDIENCE, jwks_url=issuer["jwks_url"], claim="repository_owner",
                        tenants=(("acme-finetune", "finetune"),), admin_values=("acme-platform",))
    svc = make_service(sqlite_url, UnusedRunner(), oidc=oidc)
    bearer = lambda token: {"Authorization": f"Bearer {token}"}  # noqa: E731
    created = svc.submit(bearer(_token(issuer["key"])))
    assert created.status_code == 202 and created.json()["submitted_by"] == "oidc:repo:acme/train:ref:refs/heads/main"
    assert svc.submit(bearer(_token(issuer["key"])), job="eval-judge").status_code == 403  # mapped to finetune only
    other_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    refused = {
        "wrong audience": _token(issuer["key"], aud="someone-else"),
        "wrong issuer": _token(issuer["key"], iss="https://evil.example"),
        "expired": _token(issuer["key"], exp=int(time.time()) - 60),
        "forged": _token(other_key),
    }
    for why, token in refused.items():
        answer = svc.client.get("/api/v1/experiments", headers=bearer(token))
        assert answer.status_code == 401, why
    unmapped = svc.client.get("/api/v1/experiments", headers=bearer(_token(issuer["key"], repository_owner="acme-other")))
    assert unmapped.status_code == 403 and "maps to no tenant" in unmapped.json()["error"]
    admin = svc.client.get("/api/v1/experiments", headers=bearer(_token(issuer["key"], repository_owner="acme-platform")))
    assert admin.status_code == 200 and admin.json()["total"] == 1


@pytest.mark.parametrize(
    ("url", "trusted"),
    [("https://token.actions.githubusercontent.com/.well-known/jwks", True), ("http://127.0.0.1:8123/jwks", True),
     ("http://127.0.0.1@jwks.attacker.example/keys", False), ("http://127.0.0.1.attacker.example/keys", False),
     ("http://jwks.example.com/keys", False), ("https://user:pw@jwks.example.com/keys", False), ("ftp://127.0.0.1/keys", False)],
)
def test_oidc_config_accepts_plain_http_jwks_only_on_loopback(tmp_path, url, trusted):
    """Red team: a prefix match on "http://127.0.0.1" accepted http://127.0.0.1@attacker.example/,
    whose host is attacker.example (keys over plain http could be swapped)."""
    from clusters.errors import UserError
    from experiments.oidc_settings import load_oidc_settings

    config = tmp_path / "oidc.yaml"
    config.write_text(f"issuer: https://issuer.example\naudience: gpufleet\njwks_url: '{url}'\nclaim: repository_owner\ntenants: {{acme: finetune}}\n")
    if trusted:
        assert load_oidc_settings(config).jwks_url == url
    else:
        with pytest.raises(UserError, match="must be https"):
            load_oidc_settings(config)
