"""The gate on real terraform plans: destroying a protected resource is refused unless allowed by exact address."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clusters.errors import UserError
from gpufleet.cli import main
from safety.plan_gate import DEFAULT_PROTECTED_TYPES, Action, ExitCode, Status, classify, load_plan, protected_types

TD = frozenset({"terraform_data"})


def gate(path: Path, **kwargs: object):
    return classify(load_plan(path), path=path, protected=kwargs.pop("protected", TD), **kwargs)


def test_default_list_protects_gpu_pools_clusters_and_static_ips() -> None:
    assert {"google_container_node_pool", "google_container_cluster", "google_compute_address", "nomad_node_pool"} <= DEFAULT_PROTECTED_TYPES
    assert protected_types(["terraform_data"]) == DEFAULT_PROTECTED_TYPES | TD


def test_replace_of_protected_resource_is_blocked(plans: dict[str, Path]) -> None:
    result = gate(plans["replace"])
    assert [(c.address, c.action) for c in result.blocked] == [("terraform_data.pool", Action.REPLACE)]
    assert result.status is Status.BLOCKED and result.exit_code is ExitCode.BLOCKED
    assert result.counts()["terraform_data"]["replace"] == 1


def test_delete_of_protected_resource_is_blocked(plans: dict[str, Path]) -> None:
    result = gate(plans["delete"])
    assert [(c.address, c.action) for c in result.blocked] == [("terraform_data.ip", Action.DELETE)]
    assert result.blocked[0].reason == "delete_because_no_resource_config"


def test_allowed_address_passes(plans: dict[str, Path]) -> None:
    result = gate(plans["replace"], stack="demo", allow_destroy=["demo/terraform_data.pool"])
    assert result.blocked == () and result.status is Status.CHANGES and result.exit_code is ExitCode.CHANGES


def test_in_place_update_passes(plans: dict[str, Path]) -> None:
    result = gate(plans["update"])
    assert [(c.address, c.action) for c in result.changes if c.is_change] == [("terraform_data.pool", Action.UPDATE)]
    assert result.status is Status.CHANGES


def test_unchanged_plan_has_no_changes(plans: dict[str, Path]) -> None:
    result = gate(plans["noop"])
    assert result.status is Status.NO_CHANGES and result.exit_code is ExitCode.NO_CHANGES and result.counts() == {}


def test_unprotected_type_may_be_destroyed(plans: dict[str, Path]) -> None:
    assert gate(plans["replace"], protected=DEFAULT_PROTECTED_TYPES).status is Status.CHANGES


def test_reviewed_import_address_is_protected_whatever_its_type(plans: dict[str, Path]) -> None:
    result = gate(plans["delete"], protected=DEFAULT_PROTECTED_TYPES, protected_addresses=frozenset({"terraform_data.ip"}))
    assert result.status is Status.BLOCKED


def test_fails_when_allow_destroy_matches_nothing(plans: dict[str, Path]) -> None:
    with pytest.raises(UserError, match=r"--allow-destroy demo/terraform_data\.pol matches no .*did you mean 'demo/terraform_data\.pool'"):
        gate(plans["replace"], stack="demo", allow_destroy=["demo/terraform_data.pol"])


def test_fails_when_plan_is_missing(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"plan JSON not found; produce it with `terraform show -json"):
        load_plan(tmp_path / "nope.json")


def test_fails_when_plan_json_is_malformed(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"format_version": "1.2",\n "resource_changes": [')
    with pytest.raises(UserError, match=r"bad\.json:2: not valid JSON"):
        load_plan(bad)


def test_fails_when_json_is_state_not_plan(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"format_version": "1.0", "values": {"root_module": {}}}))
    with pytest.raises(UserError, match="this is state JSON, not a plan"):
        load_plan(state)


def test_fails_when_actions_are_unknown(plans: dict[str, Path], tmp_path: Path) -> None:
    plan = json.loads(plans["replace"].read_text())
    plan["resource_changes"][0]["change"]["actions"] = ["obliterate"]
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps(plan))
    with pytest.raises(UserError, match=r"has unknown actions \['obliterate'\]"):
        gate(odd)


def test_gate_cli_exit_codes_and_summary(plans: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    summary = tmp_path / "s.json"
    args = ["gate", str(plans["replace"]), "--protected-type", "terraform_data", "--stack", "demo", "--summary-out", str(summary)]
    assert main(args) == ExitCode.BLOCKED
    out = capsys.readouterr().out
    assert "blocked replace of protected terraform_data.pool" in out and "--allow-destroy demo/terraform_data.pool" in out
    data = json.loads(summary.read_text())
    assert data["stack"] == "demo" and data["status"] == "blocked" and data["blocked"] == ["terraform_data.pool"]
    assert main([*args, "--allow-destroy", "demo/terraform_data.pool"]) == ExitCode.CHANGES
    assert json.loads(summary.read_text())["status"] == "changes"
    assert main(["gate", str(plans["noop"]), "--protected-type", "terraform_data"]) == ExitCode.NO_CHANGES


def test_fails_when_gate_cli_gets_malformed_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    summary = tmp_path / "s.json"
    assert main(["gate", str(bad), "--summary-out", str(summary)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not valid JSON" in err[0]
    assert json.loads(summary.read_text())["status"] == "error"


def test_plan_cli_runs_terraform_and_gates(stack_out: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    summary = tmp_path / "demo.json"
    common = ["plan", "demo", "--out-dir", str(stack_out), "--protected-type", "terraform_data", "--summary-out", str(summary)]
    assert main(common) == ExitCode.BLOCKED
    assert json.loads(summary.read_text())["blocked"] == ["terraform_data.pool"]
    assert main([*common, "--allow-destroy", "demo/terraform_data.pool"]) == ExitCode.CHANGES
    assert "demo: " in capsys.readouterr().out


def test_fails_when_stack_is_unknown(stack_out: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    summary = tmp_path / "s.json"
    assert main(["plan", "dem", "--out-dir", str(stack_out), "--summary-out", str(summary)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: unknown stack 'dem' (did you mean 'demo'?); synthesized stacks in {stack_out / 'stacks'}: demo"
                   " (a cluster file added or renamed since: run `gpufleet synth` or `gpufleet check` first)"]
    assert json.loads(summary.read_text())["status"] == "error"


def test_fails_when_terraform_is_missing(stack_out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from safety import terraform

    monkeypatch.setenv("PATH", "")
    with pytest.raises(UserError, match="terraform not found on PATH"):
        terraform.plan_json(stack_out / "stacks" / "demo")


def test_terraform_failure_exits_1_with_error_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "stacks" / "broken"
    broken.mkdir(parents=True)
    (broken / "cdk.tf.json").write_text(json.dumps({"resource": {"terraform_data": {"x": {"no_such_argument": 1}}}}))
    summary = tmp_path / "s.json"
    assert main(["plan", "broken", "--out-dir", str(tmp_path), "--summary-out", str(summary)]) == ExitCode.TERRAFORM_FAILED
    assert "no_such_argument" in capsys.readouterr().err
    assert json.loads(summary.read_text())["error"] == "terraform plan failed: Error: Extraneous JSON object property"


def test_fails_when_allow_destroy_is_a_bare_address(stack_out: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 22: a bare address was accepted by `gpufleet plan`, so the same flags allowed that address in every
    stack they were used on. Now only <stack>/<address> of the planned stack passes; the refusal names the form."""
    summary = tmp_path / "s.json"
    common = ["plan", "demo", "--out-dir", str(stack_out), "--protected-type", "terraform_data", "--summary-out", str(summary)]
    assert main([*common, "--allow-destroy", "terraform_data.pool"]) == ExitCode.USER_ERROR
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: --allow-destroy terraform_data.pool: a bare address is refused (it would allow that address in every stack); "
        "name its stack: --allow-destroy demo/terraform_data.pool"]
    assert json.loads(summary.read_text())["status"] == "error"
    assert main([*common, "--allow-destroy", "prod-gke/terraform_data.pool"]) == ExitCode.USER_ERROR
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: --allow-destroy prod-gke/terraform_data.pool: names stack 'prod-gke', but this plan is of stack 'demo'; "
        "pass demo/terraform_data.pool if that is meant, or drop the entry"]


def test_fails_when_gate_allows_without_knowing_the_stack(plans: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    args = ["gate", str(plans["replace"]), "--protected-type", "terraform_data"]
    assert main([*args, "--allow-destroy", "terraform_data.pool"]) == ExitCode.USER_ERROR
    assert "a bare address is refused" in capsys.readouterr().err
    assert main([*args, "--allow-destroy", "demo/terraform_data.pool"]) == ExitCode.USER_ERROR
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: --allow-destroy demo/terraform_data.pool: the plan's stack is unknown; pass --stack demo so the gate can check "
        "the entry names this plan's stack"]
    assert main([*args, "--stack", "demo", "--allow-destroy", "demo/terraform_data.pool"]) == ExitCode.CHANGES


def test_bare_address_inside_an_index_key_is_not_read_as_a_stack() -> None:
    from safety.plan_gate import split_allow

    assert split_allow('google_compute_address.ip["a/b"]') is None
    assert split_allow('prod-gke/google_compute_address.ip["a/b"]') == ("prod-gke", 'google_compute_address.ip["a/b"]')
