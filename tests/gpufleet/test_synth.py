"""Synthesis is deterministic (byte-identical) and atomic (a failure leaves cdktf.out as it was)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

import stacks.fleet
from clusters import clock
from clusters.derive.gke import derive_exclusion
from clusters.errors import UserError
from stacks.synth import synthesize


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def test_two_syntheses_are_byte_identical(fleet_out, example_configs, tmp_path):
    again = tmp_path / "cdktf.out"
    synthesize(example_configs, again)
    assert tree_digest(again) == tree_digest(fleet_out)


def test_output_has_no_timestamps_or_absolute_paths(fleet_out, example_configs):
    """Only a GKE maintenance exclusion's times may appear (the file's, or the quarter's that
    clusters.derive.gke.derive_exclusion renews from the clock); synthesis adds no other."""
    stated = [t for c in example_configs if c.gke and c.gke.upgrade_exclusion
              for t in derive_exclusion(c.gke.upgrade_exclusion, clock.today())[1:3]]
    for path in (fleet_out / "stacks").rglob("*.json"):
        text = path.read_text()
        assert str(fleet_out) not in text and "/tmp/" not in text, path
        for t in stated:
            text = text.replace(f'"{t}"', "")
        assert "2026-" not in text and "T00:" not in text, path


def test_failed_synthesis_leaves_previous_output_untouched(fleet_out, example_configs, tmp_path, monkeypatch):
    out = tmp_path / "cdktf.out"
    synthesize(example_configs, out)
    before = tree_digest(out)

    def explode(app, configs, **_):
        raise RuntimeError("construct failed half-way")

    monkeypatch.setattr(stacks.fleet, "build_fleet", explode)
    with pytest.raises(RuntimeError, match="half-way"):
        synthesize(example_configs, out)
    assert tree_digest(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cdktf.out"], "temp dirs left behind"


def test_partial_synthesis_replaces_only_the_requested_stack(example_configs, tmp_path):
    out = tmp_path / "cdktf.out"
    synthesize(example_configs, out)
    before = tree_digest(out)
    (out / "stacks" / "dev-gke" / "cdk.tf.json").write_text("{}")
    assert synthesize(example_configs, out, only=("dev-gke",)) == ("dev-gke",)
    assert tree_digest(out) == before


@pytest.mark.parametrize("asked", [("prod-nomad-scheduler",), ("dev-gke", "tfc-workspaces")])
def test_partial_synthesis_into_a_new_directory_lists_only_the_stacks_it_wrote(example_configs, tmp_path, asked):
    """A reviewer's find: the synthesis builds whole clusters, and into a new ``--out`` the whole clusters'
    manifest was written, naming stacks (``prod-nomad``) whose directories were not; cdktf reads the manifest to
    find a stack. Each entry kept is the whole synthesis's."""
    whole = tmp_path / "whole"
    synthesize(example_configs, whole)
    out = tmp_path / "cdktf.out"
    assert synthesize(example_configs, out, only=asked) == tuple(sorted(asked))
    manifest, full = (json.loads((root / "manifest.json").read_text()) for root in (out, whole))
    assert sorted(manifest["stacks"]) == sorted(p.name for p in (out / "stacks").iterdir()) == sorted(asked)
    assert manifest == {**full, "stacks": {name: full["stacks"][name] for name in sorted(asked)}}


def test_partial_synthesis_adds_a_stack_to_the_manifest_in_cdktfs_layout(example_configs, tmp_path):
    """A second partial synthesis into the same ``--out`` adds its stack's entry; the manifest stays in the
    layout cdktf and a whole synthesis write (``manifest_json``), not ``json.dumps(indent=2)``."""
    from stacks.parallel import manifest_json

    whole = tmp_path / "whole"
    synthesize(example_configs, whole)
    full = json.loads((whole / "manifest.json").read_text())
    out = tmp_path / "cdktf.out"
    synthesize(example_configs, out, only=("prod-nomad-scheduler",))
    synthesize(example_configs, out, only=("dev-gke",))
    wanted = {**full, "stacks": {name: full["stacks"][name] for name in ("dev-gke", "prod-nomad-scheduler")}}
    assert (out / "manifest.json").read_text() == manifest_json(wanted)


def test_fails_when_an_unknown_stack_is_requested(example_configs, tmp_path):
    with pytest.raises(UserError, match=r"unknown stack 'prod-gkee'; known stacks: .*prod-gke"):
        synthesize(example_configs, tmp_path / "out", only=("prod-gkee",))
    assert not (tmp_path / "out").exists()


def test_recorded_imports_become_import_blocks_in_the_next_synthesis(example_configs, tmp_path, monkeypatch):
    from stacks import imported

    monkeypatch.setattr(imported, "IMPORTED_DIR", tmp_path / "imported")
    pool_id = "projects/ml-train-prod/locations/us-central1/clusters/prod-gke/nodePools/h100"
    imported.IMPORTED_DIR.mkdir()
    (imported.IMPORTED_DIR / "prod-gke.json").write_text(f'{{"google_container_node_pool.pool_h100": "{pool_id}"}}')
    out = tmp_path / "cdktf.out"
    synthesize(example_configs, out, only=("prod-gke",))
    stack = json.loads((out / "stacks" / "prod-gke" / "cdk.tf.json").read_text())
    assert stack["import"] == [{"to": "google_container_node_pool.pool_h100", "id": pool_id}]
    assert stack["resource"]["google_container_node_pool"]["pool_h100"]["lifecycle"]["prevent_destroy"] is True


@pytest.mark.parametrize("link", ["stacks", "stacks/dev-gke"])
def test_partial_synthesis_never_replaces_through_a_symlink(example_configs, tmp_path, link):
    """Red team: a marked cdktf.out whose stacks/ (or stacks/<stack>) is a symlink made
    `gpufleet synth dev-gke` delete the link target's files."""
    from clusters import outputs

    victim = tmp_path / "victim"
    (victim / "dev-gke").mkdir(parents=True)
    (victim / "dev-gke" / "notes.txt").write_text("mine")
    out = tmp_path / "cdktf.out"
    out.mkdir()
    outputs.mark(out)
    if link == "stacks":
        (out / "stacks").symlink_to(victim)
    else:
        (out / "stacks").mkdir()
        (out / "stacks" / "dev-gke").symlink_to(victim / "dev-gke")
    with pytest.raises(UserError, match="is a symlink"):
        synthesize(example_configs, out, only=("dev-gke",))
    assert (victim / "dev-gke" / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cdktf.out", "victim"], "temp dirs left behind"
