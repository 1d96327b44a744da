"""Reviewed import: a manifest outside the repo, a digest that pins it, refusal of edited or stale
manifests, and a record from which synthesis emits import blocks the plan gate protects."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from clusters.errors import UserError
from gpufleet.cli import main
from safety import imports, plan_gate, terraform
from stacks import imported
from tests.conftest import REPO_ROOT

IDS = {"terraform_data.pool": "projects/p/locations/l/clusters/c/nodePools/h100", "terraform_data.ip": "projects/p/regions/r/addresses/ingress"}


def write_stack(path: Path, pool_input: str = "v1") -> Path:
    body = {"resource": {"terraform_data": {"pool": {"input": pool_input}, "ip": {"input": "10.0.0.1"}, "other": {"input": "x"}}}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body, indent=2))
    return path


@pytest.fixture
def stack_json(tmp_path: Path) -> Path:
    return write_stack(tmp_path / "out" / "stacks" / "demo" / "cdk.tf.json")


@pytest.fixture
def ids_file(tmp_path: Path) -> Path:
    path = tmp_path / "ids.json"
    path.write_text(json.dumps(IDS))
    return path


@pytest.fixture
def manifest(tmp_path: Path, stack_json: Path, ids_file: Path) -> tuple[Path, str]:
    out = tmp_path / "review" / "demo.import.json"
    ids, digest = imports.generate("demo", ids_file, stack_json, out, repo=tmp_path / "repo")
    assert ids == IDS
    return out, digest


def test_generate_writes_a_manifest_pinned_by_its_digest(manifest: tuple[Path, str]) -> None:
    path, digest = manifest
    content = json.loads(path.read_text())
    assert content["stack"] == "demo" and {a: e["id"] for a, e in content["imports"].items()} == IDS
    assert re.fullmatch(r"[0-9a-f]{64}", digest)


def test_apply_records_exactly_the_reviewed_addresses(manifest: tuple[Path, str], stack_json: Path, tmp_path: Path) -> None:
    path, digest = manifest
    ids = imports.verify("demo", path, digest, stack_json)
    record = imports.record("demo", ids, imported_dir=tmp_path / "imported")
    assert json.loads(record.read_text()) == IDS == imports.load_imports("demo", imported_dir=tmp_path / "imported")


def test_fails_when_manifest_is_written_inside_the_repo(stack_json: Path, ids_file: Path, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    with pytest.raises(UserError, match="is inside the repository"):
        imports.generate("demo", ids_file, stack_json, repo / "sub" / "m.json", repo=repo)
    assert not (repo / "sub").exists()


def test_fails_when_manifest_is_written_inside_this_checkout(stack_json: Path, ids_file: Path) -> None:
    with pytest.raises(UserError, match="is inside the repository"):
        imports.generate("demo", ids_file, stack_json, REPO_ROOT / "demo.import.json")


def test_fails_when_an_address_is_not_in_the_stack(stack_json: Path, tmp_path: Path) -> None:
    ids = tmp_path / "ids.json"
    ids.write_text(json.dumps({"terraform_data.pol": "x"}))
    with pytest.raises(UserError, match=r"terraform_data\.pol is not a resource of stack 'demo' \(did you mean 'terraform_data\.pool'\?\)"):
        imports.generate("demo", ids, stack_json, tmp_path / "m.json", repo=tmp_path / "repo")


def test_fails_when_manifest_was_edited(manifest: tuple[Path, str], stack_json: Path) -> None:
    path, digest = manifest
    path.write_text(path.read_text().replace("nodePools/h100", "nodePools/h200"))
    with pytest.raises(UserError, match="SHA-256 does not match --digest; the manifest was edited after review"):
        imports.verify("demo", path, digest, stack_json)


def test_fails_when_manifest_is_stale(manifest: tuple[Path, str], stack_json: Path) -> None:
    path, digest = manifest
    write_stack(stack_json, pool_input="v2")
    with pytest.raises(UserError, match="stale: stack 'demo' changed since the manifest was generated"):
        imports.verify("demo", path, digest, stack_json)


def test_fails_when_manifest_is_for_another_stack(manifest: tuple[Path, str], stack_json: Path) -> None:
    path, digest = manifest
    with pytest.raises(UserError, match="manifest is for stack 'demo', not 'prod'"):
        imports.verify("prod", path, digest, stack_json)


def test_fails_when_an_address_is_recorded_with_another_id(tmp_path: Path) -> None:
    imports.record("demo", {"terraform_data.pool": "a"}, imported_dir=tmp_path)
    with pytest.raises(UserError, match="already recorded with another id"):
        imports.record("demo", {"terraform_data.pool": "b"}, imported_dir=tmp_path)


def test_fails_when_ids_file_is_malformed(stack_json: Path, tmp_path: Path) -> None:
    ids = tmp_path / "ids.json"
    ids.write_text(json.dumps({"terraform_data.pool": ""}))
    with pytest.raises(UserError, match="non-empty provider id"):
        imports.generate("demo", ids, stack_json, tmp_path / "m.json", repo=tmp_path / "repo")


def _cdktf_stack(outdir: Path):
    from cdktf import App, DataResource, TerraformStack

    app = App(outdir=str(outdir))
    stack = TerraformStack(app, "demo")
    DataResource(stack, "pool", input={"size": "8"})
    DataResource(stack, "other", input={"size": "1"})
    return app, stack


def test_synthesis_emits_import_blocks_that_terraform_plans_and_the_gate_protects(tmp_path: Path) -> None:
    app, stack = _cdktf_stack(tmp_path / "cdktf.out")
    imported.apply_imports(stack, {"terraform_data.pool": "existing-pool"})
    app.synth()
    directory = terraform.stack_dir(tmp_path / "cdktf.out", "demo")
    synthesized = json.loads((directory / "cdk.tf.json").read_text())
    assert synthesized["import"] == [{"id": "existing-pool", "to": "terraform_data.pool"}]
    assert synthesized["resource"]["terraform_data"]["pool"]["lifecycle"] == {"prevent_destroy": True}
    plan_path = terraform.plan_json(directory)
    result = plan_gate.classify(plan_gate.load_plan(plan_path), path=plan_path, protected_addresses=frozenset({"terraform_data.pool"}))
    assert result.counts()["terraform_data"]["import"] == 1
    assert [c.address for c in result.changes if c.importing] == ["terraform_data.pool"]
    assert next(c for c in result.changes if c.address == "terraform_data.pool").protected


def test_fails_when_a_recorded_import_matches_no_resource(tmp_path: Path) -> None:
    _, stack = _cdktf_stack(tmp_path / "cdktf.out")
    with pytest.raises(UserError, match=r"recorded import terraform_data\.poool matches no resource of stack 'demo'"):
        imported.apply_imports(stack, {"terraform_data.poool": "x"})


def test_cli_generate_then_apply(stack_json: Path, ids_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI re-synthesizes the stack; here that synthesis is the hand-made stack file, so the test stays fast."""
    monkeypatch.setattr(imports, "synthesized_stack", lambda stack, clusters_dir, workdir: stack_json)
    monkeypatch.setattr(imported, "IMPORTED_DIR", tmp_path / "imported")
    out = tmp_path / "review" / "demo.json"
    assert main(["import", "generate", "demo", "--ids", str(ids_file), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    digest = re.search(r"sha256:\s+([0-9a-f]{64})", printed).group(1)
    assert "terraform_data" in printed and "2 resource(s)" in printed
    assert main(["import", "apply", "demo", "--manifest", str(out), "--digest", "0" * 64]) == 2
    assert "edited after review" in capsys.readouterr().err
    assert main(["import", "apply", "demo", "--manifest", str(out), "--digest", digest]) == 0
    assert imports.load_imports("demo") == IDS
