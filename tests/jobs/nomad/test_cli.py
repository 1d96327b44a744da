"""``gpufleet jobs`` for a Nomad job end to end: bad arguments are one line and exit 2; dispatch
carries a real wrapped secret_id from OpenBao to the Nomad double; status --watch follows a run to
its end. (run-local, the local runner, is tested in tests/jobs/test_local.py.)"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from gpufleet.cli import main
from jobs.nomad.client import NomadClient
from jobs.loader import find, load
from tests.jobs.conftest import a100_nodes
from tests.jobs.nomad_double import NomadDouble
from tests.openbao_fixture import VaultHandle

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
META = ["--meta", "dataset_uri=hf://datasets/demo/tiny@v1", "--meta", "run_id=demo-1"]


@pytest.fixture
def nomad_env(monkeypatch: pytest.MonkeyPatch, nomad: NomadDouble) -> NomadDouble:
    for name in ("NOMAD_NAMESPACE", "NOMAD_REGION", "NOMAD_CACERT", "VAULT_ADDR", "VAULT_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NOMAD_ADDR", nomad.address)
    monkeypatch.setenv("NOMAD_TOKEN", nomad.acl_token or "")
    return nomad


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["jobs", "render", "finetune-lama"], r"no job 'finetune-lama' \(did you mean 'finetune-llama'\?\)"),
        (["jobs", "dispatch", "finetune-llama", "--meta", "run_id"], r"--meta 'run_id' is not key=value"),
        (["jobs", "dispatch", "finetune-llama", "--meta", "run_id=x"], r"needs --meta dataset_uri=\.\.\."),
        (["jobs", "dispatch", "finetune-llama", "--meta", "run_id=x", "--meta", "dataset_uri=hf://d/x"], r"names no version"),
        (["jobs", "dispatch", "finetune-llama", *META], r"not dispatching, nothing was minted: status: Nomad has no job 'finetune-llama' in namespace finetune \(404: [^)]*\); if the job is not registered yet: gpufleet jobs register finetune-llama$"),
        (["jobs", "run-local", "finetune-llama", *META], r"VAULT_ADDR and VAULT_TOKEN not set"),
        (["jobs", "status", "finetune-llama/dispatch-1-0"], r"status: Nomad has no job 'finetune-llama/dispatch-1-0' in namespace finetune \(404"),
    ],
)
def test_fails_when_cli_argument_is_bad(nomad_env: NomadDouble, capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert re.search(message, err[0]), err[0]


def test_fails_when_nomad_addr_is_not_a_url(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("NOMAD_ADDR", "localhost:4646")
    assert main(["jobs", "plan", "finetune-llama"]) == 2
    assert capsys.readouterr().err.strip() == "error: NOMAD_ADDR 'localhost:4646' is not an http(s) address; set it like https://nomad.example.com:4646"


def test_render_writes_the_golden_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["jobs", "render", "--out-dir", str(tmp_path)]) == 0
    for name in ("finetune-llama", "eval-judge"):
        assert (tmp_path / f"{name}.json").read_text() == (GOLDEN / f"{name}.json").read_text()


def test_register_then_dispatch_passes_a_real_wrapped_secret_id(nomad_env: NomadDouble, vault: VaultHandle, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("VAULT_ADDR", vault.addr)
    monkeypatch.setenv("VAULT_TOKEN", vault.orchestrator.token)
    assert main(["jobs", "plan", "finetune-llama"]) == 0
    assert main(["jobs", "register", "finetune-llama"]) == 0
    assert main(["jobs", "dispatch", "finetune-llama", *META, "--idempotency-token", "cli-token-1"]) == 0
    out = capsys.readouterr().out
    (child,) = nomad_env.dispatched("finetune-llama")
    assert f"dispatched {child}" in out and f"gpufleet jobs status {child} --watch" in out
    assert "expires in 375s (queue wait 5 min, from pool a100, min_nodes 1)" in out
    dispatch = nomad_env.calls("POST", "dispatch")[0]
    assert dispatch.query["idempotency_token"] == ["cli-token-1"]
    meta = dispatch.body["Meta"]
    assert meta["gpufleet_vault_role_id"] == vault.root.auth.approle.read_role_id("finetune")["data"]["role_id"]
    wrapping = meta["gpufleet_vault_wrapped_secret_id"]
    assert wrapping not in out
    assert vault.client(wrapping).sys.unwrap()["data"]["secret_id"]
    assert main(["jobs", "status", child]) == 0
    assert "pending" in capsys.readouterr().out


def test_register_refuses_an_unplaceable_job_unless_allowed(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """register plans first (jobs.nomad.dispatch.submit): a job no client can place now is refused and
    nothing is registered, unless --allow-unplaceable, which registers it and warns with the reason."""
    busy = NomadDouble(a100_nodes(count=3, used=2)).start()
    try:
        for name in ("NOMAD_NAMESPACE", "NOMAD_REGION", "NOMAD_CACERT", "NOMAD_TOKEN"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("NOMAD_ADDR", busy.address)
        reason = "no client in pool a100 has 1 free GPU with >= 40 GiB matching model 'A100' (3 clients busy); wait for running jobs to finish or ask for fewer GPUs"
        assert main(["jobs", "register", "finetune-llama"]) == 2
        assert capsys.readouterr().err.strip() == f"error: not registering finetune-llama: {reason}; pass --allow-unplaceable if the pool will scale up"
        assert busy.calls("POST", "register") == []
        assert main(["jobs", "register", "finetune-llama", "--allow-unplaceable"]) == 0
        captured = capsys.readouterr()
        assert captured.err.strip() == f"warning: {reason}"
        assert "registered finetune-llama in namespace finetune (job modify index" in captured.out
        assert len(busy.calls("POST", "register")) == 1
    finally:
        busy.stop()


def test_status_watch_refreshes_until_the_run_ends(nomad_env: NomadDouble, client_for: Callable[..., NomadClient], capsys: pytest.CaptureFixture[str]) -> None:
    spec = load(find("finetune-llama"))
    client = client_for(nomad_env)
    client.register(spec)
    child = client.dispatch(spec, {"dataset_uri": "hf://d/x@v1", "run_id": "w1"}, role_id="r", wrapping_token="w", idempotency_token="watch").dispatched_job_id
    nomad_env.finish(child, client_status="running")
    nomad_env.when_called("GET", "allocations", 3, lambda: nomad_env.finish(child, client_status="complete", events=[{"Type": "Terminated", "DisplayMessage": "Exit Code: 0"}]))
    assert main(["jobs", "status", child, "--watch", "--interval", "0.2"]) == 0
    assert len(nomad_env.calls("GET", "allocations")) == 3
    assert "complete" in capsys.readouterr().out


def test_jobs_submit_is_the_old_name_of_register(nomad_env: NomadDouble, capsys: pytest.CaptureFixture[str]) -> None:
    """One meaning per verb (issue 27): `submit` runs a job (`gpufleet exp submit`); registering the
    parameterized job, which runs nothing, is `jobs register`. Scripts that say `jobs submit` keep working."""
    assert main(["jobs", "submit", "finetune-llama"]) == 0
    captured = capsys.readouterr()
    assert "registered finetune-llama in namespace finetune" in captured.out
    assert captured.err.strip().splitlines() == ["note: `gpufleet jobs submit` is now `gpufleet jobs register` (it runs nothing;"
                                                 " `gpufleet exp submit` runs a job); `submit` still works for now"]
    assert main(["jobs", "--help"]) == 0
    listed = capsys.readouterr().out
    assert "register" in listed and " submit " not in listed
