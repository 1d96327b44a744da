"""Protected resources carry ``lifecycle.prevent_destroy``, so real terraform refuses their destroy at plan time.

The gate must report that as *blocked* (exit 4, with the addresses), and ``--allow-destroy`` must
plan a copy with prevent_destroy lifted for exactly the named addresses, so the reviewer sees the
real replace while every other protected destroy still blocks. All plans are real terraform runs
on ``terraform_data``, made once for the module.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from gpufleet.cli import main
from safety import terraform
from safety.plan_gate import ExitCode
from tests.safety.conftest import tf

LOCKED = {"lifecycle": {"prevent_destroy": True}}
BASE = {"pool": {"input": "v1", "triggers_replace": ["t1"]} | LOCKED, "ip": {"input": "10.0.0.1"} | LOCKED}
REPLACE_POOL = BASE | {"pool": {"input": "v1", "triggers_replace": ["t2"]} | LOCKED}


def _write(directory: Path, resources: dict) -> None:
    (directory / "cdk.tf.json").write_text(json.dumps({"resource": {"terraform_data": resources}}))


def _plan(out: Path, summary: Path, *extra: str) -> dict:
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(["plan", "demo", "--out-dir", str(out), "--summary-out", str(summary), *extra])
    return {"code": code, "out": stdout.getvalue(), "err": stderr.getvalue(), "summary": json.loads(summary.read_text())}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """Apply BASE once, then plan the replace of the prevent_destroy pool three ways."""
    out = tmp_path_factory.mktemp("pd-out")
    demo = out / "stacks" / "demo"
    demo.mkdir(parents=True)
    _write(demo, BASE)
    tf(demo, "init", "-input=false")
    tf(demo, "apply", "-auto-approve", "-input=false")
    _write(demo, REPLACE_POOL)
    sums = tmp_path_factory.mktemp("pd-summaries")
    results = {"plain": _plan(out, sums / "plain.json"), "allowed": _plan(out, sums / "allowed.json", "--allow-destroy", "demo/terraform_data.pool")}
    results["allowed"]["plan"] = json.loads((demo / terraform.PLAN_JSON).read_text())
    results["other"] = _plan(out, sums / "other.json", "--allow-destroy", "demo/terraform_data.ip")
    results["dir"] = {"demo": demo, "leftovers": sorted(p.name for p in (out / "stacks").iterdir())}
    return results


def test_replace_of_prevent_destroy_resource_is_blocked_not_a_terraform_error(runs: dict) -> None:
    plain = runs["plain"]
    assert plain["code"] == ExitCode.BLOCKED, plain["err"]
    assert plain["summary"]["status"] == "blocked" and plain["summary"]["blocked"] == ["terraform_data.pool"]
    assert plain["summary"]["changes"][0] | {"address": "terraform_data.pool", "action": "replace", "blocked": True} == plain["summary"]["changes"][0]
    assert "prevent_destroy" in plain["summary"]["note"]
    assert "blocked replace of protected terraform_data.pool" in plain["out"]
    assert "--allow-destroy demo/terraform_data.pool" in plain["out"]


def test_allow_destroy_plans_a_lifted_copy_and_shows_the_real_replace(runs: dict) -> None:
    allowed = runs["allowed"]
    assert allowed["code"] == ExitCode.CHANGES, allowed["err"]
    summary = allowed["summary"]
    assert summary["status"] == "changes" and summary["blocked"] == []
    assert [(c["address"], c["action"], c["allowed"]) for c in summary["changes"]] == [("terraform_data.pool", "replace", True)]
    assert "protected: false" in summary["note"] and "terraform_data.pool" in summary["note"]
    assert [rc["change"]["actions"] for rc in allowed["plan"]["resource_changes"] if rc["address"] == "terraform_data.pool"] == [["delete", "create"]]


def test_allow_destroy_leaves_the_synthesized_stack_protected_and_no_copy_behind(runs: dict) -> None:
    stack = json.loads((runs["dir"]["demo"] / "cdk.tf.json").read_text())
    assert stack["resource"]["terraform_data"]["pool"]["lifecycle"] == {"prevent_destroy": True}
    assert runs["dir"]["leftovers"] == ["demo"]


def test_allow_destroy_of_another_address_still_blocks(runs: dict) -> None:
    other = runs["other"]
    assert other["code"] == ExitCode.BLOCKED, other["err"]
    assert other["summary"]["blocked"] == ["terraform_data.pool"]
    assert "terraform_data.ip" in other["summary"]["note"]


def test_prevented_destroys_parses_every_address_and_its_action(runs: dict, tmp_path: Path) -> None:
    """On a fresh real run where two prevent_destroy resources are replaced (terraform wraps the text)."""
    work = tmp_path / "two"
    work.mkdir()
    _write(work, BASE)
    tf(work, "init", "-input=false")
    tf(work, "apply", "-auto-approve", "-input=false")
    _write(work, REPLACE_POOL | {"ip": {"input": "10.0.0.2", "triggers_replace": ["x"]} | LOCKED})
    with pytest.raises(terraform.DestroyPrevented, match=r"refused to destroy terraform_data\.ip, terraform_data\.pool"):
        terraform.plan_json(work)
    assert not (work / terraform.PLAN_JSON).exists()


def test_fails_when_another_error_accompanies_prevent_destroy() -> None:
    """Any other error means the stack is broken: that is a terraform failure (exit 1), never only 'blocked'."""
    stderr = (
        "Error: Instance cannot be destroyed\n\nResource terraform_data.pool has lifecycle.prevent_destroy set, but the plan\n"
        "calls for this resource to be destroyed.\n\nError: Invalid reference\n"
    )
    assert terraform.prevented_destroys(stderr) == ()
    assert [p.address for p in terraform.prevented_destroys(stderr.rsplit("\nError: Invalid", 1)[0])] == ["terraform_data.pool"]


def test_pr_comment_shows_a_prevented_destroy_as_blocked_with_the_note(runs: dict) -> None:
    from review.ci_comment import build_comment

    body = build_comment([runs["plain"]["summary"], runs["allowed"]["summary"] | {"stack": "demo-allowed"}])
    assert "| ⛔ | `demo` | destroy blocked: `terraform_data.pool` |" in body
    assert "_terraform stopped this plan because it would destroy resources that set lifecycle.prevent_destroy;" in body
    assert "| 🔄 | `demo-allowed` | changes |" in body and "`protected: false` in the cluster file" in body
