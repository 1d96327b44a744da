"""CI can reach what it plans (issue 23): ``nomad.planned_from`` decides where the Nomad scheduler stack
is planned, the workflows and the TFC workspace follow from it, the plan job gets the mTLS files from a
masked secret, and ``check`` refuses a Nomad API that GitHub-hosted runners cannot reach.

Field names checked against upstream at the pins: hashicorp/terraform-provider-tfe v0.71.0 (what
cdktf-cdktf-provider-tfe 12.5.1 binds) ``internal/provider/resource_tfe_workspace_settings.go:300-316``
(``execution_mode`` one of agent/local/remote; ``agent_pool_id``) and ``:109-115`` (agent needs the pool id,
other modes must not set it); hashicorp/terraform-provider-nomad v2.5.2 (cdktf-cdktf-provider-nomad 10.0.3)
``nomad/provider.go:44-75`` (``ca_file``/``cert_file``/``key_file`` default from ``NOMAD_CACERT``,
``NOMAD_CLIENT_CERT``, ``NOMAD_CLIENT_KEY``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from tests.conftest import FLEET_CLUSTERS, load_fleet
from tests.safety.test_workflows import load

GPUFLEET = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "gpufleet"


def gpufleet(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(GPUFLEET), *args], capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, **(env or {})}, cwd=cwd)


def fleet_with(tmp_path: Path, old: str, new: str) -> Path:
    """A copy of the suite's fleet with one edit in prod-nomad.yaml."""
    folder = tmp_path / "clusters"
    shutil.copytree(FLEET_CLUSTERS, folder)
    text = (folder / "prod-nomad.yaml").read_text()
    assert old in text
    (folder / "prod-nomad.yaml").write_text(text.replace(old, new))
    return folder


EXAMPLE = "  planned_from:\n    github_runner_labels: [self-hosted, gpufleet-vpc]\n"


@pytest.mark.parametrize(("replacement", "field", "words"), [
    ("", "nomad.planned_from", "GitHub-hosted runners cannot reach this cluster's Nomad API: its API is the Nomad servers' internal load balancer"),
    ("  planned_from:\n    github_runner_labels: [ubuntu-latest]\n", "nomad.planned_from.github_runner_labels", "select GitHub-hosted runners"),
    ("  planned_from:\n    github_runner_labels: [self-hosted]\n    tfc_agent_pool: vpc\n", "nomad.planned_from", "exactly one of"),
    ("  planned_from:\n    github_runner_labels: ['bad label']\n", "nomad.planned_from.github_runner_labels", "runner label"),
])
def test_fails_when_the_nomad_stack_is_planned_from_where_its_api_is_unreachable(tmp_path, replacement, field, words):
    folder = fleet_with(tmp_path, EXAMPLE, replacement)
    result = gpufleet("clusters", "--clusters-dir", str(folder))
    assert result.returncode == 2, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert re.match(rf"error: \S*prod-nomad\.yaml:\d+: {re.escape(field)}", lines[0]), lines[0]
    assert words in lines[0]
    if not replacement:
        assert "github_runner_labels: [self-hosted" in lines[0] and "tfc_agent_pool" in lines[0], "the fix names both ways out"


def test_fails_when_a_tfc_agent_pool_plans_a_stack_whose_state_is_not_in_terraform_cloud(tmp_path):
    folder = fleet_with(tmp_path, EXAMPLE, "  planned_from:\n    tfc_agent_pool: gpufleet-vpc\n")
    text = (folder / "prod-nomad.yaml").read_text().replace("  backend: tfc\n  organization: gpufleet\n", "  backend: local\n")
    (folder / "prod-nomad.yaml").write_text(text)
    result = gpufleet("clusters", "--clusters-dir", str(folder))
    assert result.returncode == 2
    assert "nomad.planned_from.tfc_agent_pool: " in result.stderr and "allowed with: state.backend tfc" in result.stderr


def test_existing_servers_on_a_public_address_may_be_planned_from_github_hosted_runners():
    """Only an API gpufleet knows to be internal is refused; a public address is reachable."""
    from clusters.plan_reach import planned_from

    nomad = {c.name: c for c in load_fleet()}["prod-nomad"]
    public = nomad.model_copy(update={"nomad": nomad.nomad.model_copy(update={"existing_servers": ("34.90.1.2:4647",), "planned_from": None})})
    private = nomad.model_copy(update={"nomad": nomad.nomad.model_copy(update={"existing_servers": ("10.0.0.2:4647",), "planned_from": None})})
    autojoin = nomad.model_copy(update={"nomad": nomad.nomad.model_copy(update={"existing_servers": ("provider=gce tag_value=nomad",), "planned_from": None})})
    assert list(planned_from(public)) == []
    assert [p for p, _ in planned_from(private)] == [("nomad", "planned_from")]
    assert [p for p, _ in planned_from(autojoin)] == [("nomad", "planned_from")]


@pytest.fixture(scope="module")
def matrix() -> list[dict]:
    """The plan matrix exactly as the workflow's stacks job builds it: `gpufleet stacks --json` piped through
    the jq program of its run block (read from the workflow, run with the real jq)."""
    step = next(s for s in load("plan.yml")["jobs"]["stacks"]["steps"] if s.get("id") == "stacks")
    program = re.search(r"jq -c '([^']+)' stacks.json", step["run"]).group(1)
    assert program == re.search(r"jq -c '([^']+)' stacks.json", next(
        s for s in load("drift.yml")["jobs"]["stacks"]["steps"] if s.get("id") == "stacks")["run"]).group(1), "drift builds the same matrix"
    stacks = gpufleet("stacks", "--json", "--clusters-dir", str(FLEET_CLUSTERS))
    assert stacks.returncode == 0, stacks.stderr
    done = subprocess.run(["jq", "-c", program], input=stacks.stdout, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def test_the_nomad_scheduler_plan_runs_on_the_files_self_hosted_runners_and_every_other_stack_on_github_hosted(matrix):
    by_stack = {row["stack"]: row for row in matrix}
    assert by_stack["prod-nomad-scheduler"] == {"stack": "prod-nomad-scheduler", "runs_on": ["self-hosted", "gpufleet-vpc"], "nomad_tls": True}
    others = {s: (r["runs_on"], r["nomad_tls"]) for s, r in by_stack.items() if s != "prod-nomad-scheduler"}
    assert others and set(map(str, others.values())) == {str((["ubuntu-latest"], False))}
    for name, job in (("plan.yml", "plan"), ("drift.yml", "drift")):
        body = load(name)["jobs"][job]
        assert body["runs-on"] == "${{ matrix.runs_on }}", f"{name}: {job} runs where the matrix entry says"
        assert body["strategy"]["matrix"] == {"include": "${{ fromJson(needs.stacks.outputs.matrix) }}"}


@pytest.mark.parametrize(("name", "job", "runs"), [("plan.yml", "plan", "gpufleet plan"), ("drift.yml", "drift", "terraform -chdir")])
def test_the_plan_job_writes_the_mtls_files_from_a_secret_before_planning_and_removes_them_after(name, job, runs):
    steps = load(name)["jobs"][job]["steps"]
    index = {s.get("name"): i for i, s in enumerate(steps)}
    write = steps[index["Nomad mTLS files from CI secrets"]]
    assert write["if"] == "matrix.nomad_tls"
    assert write["env"] == {"NOMAD_PLAN_TLS": "${{ secrets.NOMAD_PLAN_TLS }}"}, "from a CI secret, in that step only"
    assert write["run"] == 'gpufleet ci nomad-tls "$STACK" --dir "$RUNNER_TEMP/nomad-tls"'
    plan = next(i for i, s in enumerate(steps) if runs in s.get("run", ""))
    remove = steps[index["remove the Nomad mTLS files"]]
    assert index["Nomad mTLS files from CI secrets"] < plan < index["remove the Nomad mTLS files"]
    assert remove["if"] == "always() && matrix.nomad_tls" and remove["run"] == 'rm -rf "$RUNNER_TEMP/nomad-tls"'
    assert "NOMAD_PLAN_TLS" not in str(load(name)["jobs"][job].get("env", {})), "not in every step's environment"


def _pem(kind: str, body: str) -> str:
    lines = [body[i:i + 64] for i in range(0, len(body), 64)]
    return "\n".join([f"-----BEGIN {kind}-----", *lines, f"-----END {kind}-----"]) + "\n"


def test_nomad_tls_helper_masks_every_line_writes_0600_files_and_exports_their_paths(tmp_path):
    secret = {"prod-nomad": {"ca": _pem("CERTIFICATE", "Q" * 70 + "caline"), "cert": _pem("CERTIFICATE", "C" * 64 + "certline"),
                             "key": _pem("EC PRIVATE KEY", "K" * 64 + "keysecretline")}}
    github_env = tmp_path / "github_env"
    github_env.write_text("")
    target = tmp_path / "runner-temp" / "nomad-tls"
    result = gpufleet("ci", "nomad-tls", "prod-nomad-scheduler", "--dir", str(target), "--clusters-dir", str(FLEET_CLUSTERS),
                      env={"NOMAD_PLAN_TLS": json.dumps(secret), "GITHUB_ENV": str(github_env)})
    assert result.returncode == 0, result.stderr
    out = result.stdout.splitlines()
    masked = {line.removeprefix("::add-mask::") for line in out if line.startswith("::add-mask::")}
    body_lines = {line for pem in secret["prod-nomad"].values() for line in pem.splitlines() if line and not line.startswith("-----")}
    assert body_lines == masked, "every line of every PEM body is masked before anything else is printed"
    assert out.index(next(line for line in out if not line.startswith("::add-mask::"))) == len(masked)
    for line in out:
        if not line.startswith("::add-mask::"):
            assert not any(b in line for b in body_lines), line
    assert stat.S_IMODE(target.stat().st_mode) == 0o700
    files = {"NOMAD_CACERT": "ca", "NOMAD_CLIENT_CERT": "cert", "NOMAD_CLIENT_KEY": "key"}
    exported = dict(line.split("=", 1) for line in github_env.read_text().splitlines())
    assert set(exported) == set(files)
    for variable, key in files.items():
        path = Path(exported[variable])
        assert path.parent == target and stat.S_IMODE(path.stat().st_mode) == 0o600
        assert path.read_text() == secret["prod-nomad"][key]
    assert "keysecretline" not in github_env.read_text()


@pytest.mark.parametrize(("stack", "raw", "words"), [
    ("prod-nomad-scheduler", "", "NOMAD_PLAN_TLS has no ca, cert and key PEM for cluster 'prod-nomad'"),
    ("prod-nomad-scheduler", "{not json", "NOMAD_PLAN_TLS is not JSON"),
    ("prod-gke-scheduler", "{}", "is not a Nomad scheduler stack planned in CI; allowed: prod-nomad-scheduler"),
])
def test_fails_when_the_tls_secret_or_stack_is_wrong_with_one_line(tmp_path, stack, raw, words):
    result = gpufleet("ci", "nomad-tls", stack, "--dir", str(tmp_path / "tls"), "--clusters-dir", str(FLEET_CLUSTERS), env={"NOMAD_PLAN_TLS": raw})
    assert result.returncode == 2 and words in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "tls").exists()


def test_a_tfc_agent_pool_puts_the_nomad_workspace_in_agent_mode_with_its_pool_and_its_own_nomad_variables():
    from cdktf import Testing

    from clusters.schema import NomadPlannedFrom
    from constructs_lib.tfc_workspaces import tfc_workspaces_stack
    from stacks.layout import plan_stacks

    configs = load_fleet()
    moved = tuple(c.model_copy(update={"nomad": c.nomad.model_copy(update={"planned_from": NomadPlannedFrom(tfc_agent_pool="gpufleet-vpc")})})
                  if c.name == "prod-nomad" else c for c in configs)
    by_name = {c.name: c for c in moved}
    pairs = [(s.name, by_name[s.cluster]) for s in plan_stacks(moved) if s.cluster]
    assert {s.name: s.runs_on for s in plan_stacks(moved)}["prod-nomad-scheduler"] == ("ubuntu-latest",), \
        "CI only starts the run; terraform runs on the agent"
    synthesized = json.loads(Testing.synth(tfc_workspaces_stack(Testing.app(), pairs)))
    settings = synthesized["resource"]["tfe_workspace_settings"]
    assert settings["settings_prod_nomad_scheduler"]["execution_mode"] == "agent"
    assert settings["settings_prod_nomad_scheduler"]["agent_pool_id"] == "${data.tfe_agent_pool.agent_pool_gpufleet_gpufleet_vpc.id}"
    assert all("agent_pool_id" not in s for n, s in settings.items() if n != "settings_prod_nomad_scheduler"), \
        "tfe rejects agent_pool_id unless the mode is agent"
    assert synthesized["data"]["tfe_agent_pool"]["agent_pool_gpufleet_gpufleet_vpc"] == {"name": "gpufleet-vpc", "organization": "gpufleet"}
    variables = {v["key"]: v for v in synthesized["resource"]["tfe_variable"].values()
                 if v.get("workspace_id") == "${tfe_workspace.workspace_prod_nomad_scheduler.id}"}
    assert {k: v["value"] for k, v in variables.items() if k != "NOMAD_TOKEN"} == {
        "NOMAD_CACERT": "/etc/gpufleet/nomad/prod-nomad/ca.pem", "NOMAD_CLIENT_CERT": "/etc/gpufleet/nomad/prod-nomad/client.pem",
        "NOMAD_CLIENT_KEY": "/etc/gpufleet/nomad/prod-nomad/client-key.pem"}
    token = variables["NOMAD_TOKEN"]
    assert token["value"] == "" and token["sensitive"] is True and token["lifecycle"] == {"ignore_changes": ["value"]}
    assert all(v["category"] == "env" for v in variables.values())


def test_runner_labels_are_matched_without_case_as_github_does():
    """GitHub docs, "Using labels with self-hosted runners": labels are case-insensitive, so
    [Self-Hosted, gpufleet-vpc] selects the same runners as [self-hosted, gpufleet-vpc]."""
    from clusters.plan_reach import planned_from

    nomad = {c.name: c for c in load_fleet()}["prod-nomad"]
    planned = nomad.nomad.planned_from.model_copy(update={"github_runner_labels": ("Self-Hosted", "gpufleet-vpc")})
    assert list(planned_from(nomad.model_copy(update={"nomad": nomad.nomad.model_copy(update={"planned_from": planned})}))) == []
