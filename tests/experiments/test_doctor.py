"""Say what is wrong at start: /healthz and gpufleet_scheduler_up per bound scheduler, and
``gpufleet doctor`` finding each planted problem in a user's environment (against the real
service under uvicorn, the Nomad and Kubernetes doubles and the session's real OpenBao)."""

from __future__ import annotations

import socket
from typing import Any

import pytest

import clusters.repo
from gpufleet.cli import main


def test_healthz_and_the_metric_say_which_scheduler_does_not_answer(make_service, sqlite_url, nomad, k8s, fleet_runner):
    up = make_service(sqlite_url, fleet_runner)
    health = up.client.get("/healthz").json()
    assert health["status"] == "ok"
    assert health["schedulers"] == {"prod-nomad": {"scheduler": "nomad", "answers": True}, "prod-gke": {"scheduler": "gke", "answers": True}}
    nomad.stop()
    down = make_service(sqlite_url, fleet_runner)  # a fresh service: its probe is not cached
    health = down.client.get("/healthz")
    assert health.status_code == 200 and health.json()["status"] == "degraded"
    assert health.json()["schedulers"]["prod-nomad"] == {"scheduler": "nomad", "answers": False}  # the why is in the log only
    assert health.json()["schedulers"]["prod-gke"]["answers"] is True
    text = down.client.get("/metrics", headers=down.token(None, admin=True)).text
    assert 'gpufleet_scheduler_up{cluster="prod-nomad",scheduler="nomad"} 0.0' in text
    assert 'gpufleet_scheduler_up{cluster="prod-gke",scheduler="gke"} 1.0' in text


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def good_env(live: dict[str, Any], nomad: Any, k8s: Any, vault: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    for name in ("GPUFLEET_KUBE_CONTEXT", "KUBERNETES_SERVICE_HOST", "NOMAD_CACERT", "NOMAD_CLIENT_CERT", "NOMAD_CLIENT_KEY", "NOMAD_TLS_SERVER_NAME"):
        monkeypatch.delenv(name, raising=False)
    env = {"GPUFLEET_API": live["base"], "GPUFLEET_API_TOKEN": live["tokens"]["finetune"], "VAULT_ADDR": vault.addr,
           "NOMAD_ADDR": nomad.address, "NOMAD_TOKEN": nomad.acl_token, "KUBECONFIG": str(k8s.kubeconfig_path)}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


def test_doctor_passes_a_working_environment(good_env, capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr()
    assert out.err == "" and out.out.splitlines() == ["ok: control plane", "ok: vault", "ok: cluster files", "ok: nomad", "ok: kubernetes"]


def test_doctor_finds_each_planted_problem_with_its_fix(good_env, nomad, monkeypatch, capsys):
    monkeypatch.setenv("GPUFLEET_API_TOKEN", "gfx_not_a_token")
    monkeypatch.delenv("VAULT_ADDR")
    monkeypatch.setenv("NOMAD_ADDR", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.setenv("GPUFLEET_KUBE_CONTEXT", "no-such-context")
    nomad.stop()  # the service's own Nomad: it says so on /healthz
    assert main(["doctor"]) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 5, errors
    expected = ["the control plane cannot reach the nomad scheduler of cluster prod-nomad", "refused GPUFLEET_API_TOKEN (401)",
                "VAULT_ADDR is not set", "cannot reach Nomad at http://127.0.0.1:", "kube context 'no-such-context'"]
    for line, wanted in zip(errors, expected, strict=True):
        assert wanted in line and ";" in line, line  # each problem names its fix after the semicolon
    assert "gpufleet dev up starts a local one" in errors[2]  # a command that exists (there is no `make dev`)


def test_doctor_says_when_the_control_plane_is_unreachable(good_env, monkeypatch, capsys):
    monkeypatch.setenv("GPUFLEET_API", f"http://127.0.0.1:{_closed_port()}")
    assert main(["doctor"]) == 1
    err = capsys.readouterr().err
    assert "error: cannot reach the control plane at http://127.0.0.1:" in err and "start it with gpufleet serve" in err


def test_doctor_names_a_broken_cluster_file_and_still_runs_the_other_checks(good_env, tmp_path, capsys):
    import shutil

    from tests.conftest import REPO_ROOT
    from tests.gpufleet.test_cli_fleet import bad_clusters_dir

    shutil.copy(REPO_ROOT / "cdktf.json", tmp_path / "cdktf.json")
    bad_clusters_dir(tmp_path)  # tmp_path/clusters with a wrong gpus_per_node in prod-gke.yaml
    try:
        assert main(["--repo", str(tmp_path), "doctor"]) == 1
    finally:
        clusters.repo.use(None)  # --repo pins the process: the next tests read this checkout again
    out = capsys.readouterr()
    errors = [line for line in out.err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "prod-gke.yaml" in errors[0] and "gpus_per_node" in errors[0] and "run gpufleet check" in errors[0]
    assert out.out.splitlines() == ["ok: control plane", "ok: vault", "ok: nomad", "ok: kubernetes"]


@pytest.mark.parametrize("token, shown", [("not-the-token", "403: Permission denied"), (None, "404: ACL token not found")],
                         ids=["wrong token", "no token"])
def test_doctor_names_a_nomad_token_the_servers_refuse(good_env, monkeypatch, capsys, token, shown):
    """``GET /v1/acl/token/self`` against the double (answered as hashicorp/nomad's aclTokenSelf does):
    one line that names NOMAD_TOKEN, the status and the fix; the token itself is never printed."""
    if token is None:
        monkeypatch.delenv("NOMAD_TOKEN")
    else:
        monkeypatch.setenv("NOMAD_TOKEN", token)
    assert main(["doctor"]) == 1
    out = capsys.readouterr()
    errors = [line for line in out.err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, errors
    assert errors[0].startswith("error: NOMAD_TOKEN is not") and shown in errors[0] and "; set NOMAD_TOKEN to the SecretID" in errors[0]
    assert "not-the-token" not in out.err + out.out
    assert "ok: nomad" not in out.out and "ok: kubernetes" in out.out


def test_doctor_says_when_nomad_runs_without_acls(good_env, monkeypatch, capsys):
    from tests.jobs.conftest import a100_nodes
    from tests.jobs.nomad_double import NomadDouble

    open_nomad = NomadDouble(a100_nodes()).start()  # no acl_token: the servers answer "ACL support disabled"
    try:
        monkeypatch.setenv("NOMAD_ADDR", open_nomad.address)
        assert main(["doctor"]) == 0
        out = capsys.readouterr().out.splitlines()
        assert "ok: nomad" in out
        assert any(line.startswith("note: the Nomad servers at") and "run without ACLs" in line and "NOMAD_TOKEN is not checked" in line
                   for line in out), out
        assert any(r.path == "/v1/acl/token/self" for r in open_nomad.requests)
    finally:
        open_nomad.stop()
