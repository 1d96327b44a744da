"""The per-cluster synthesis cache: same bytes as a cold synthesis, and never an old result for a changed input."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import clusters
from stacks import parallel, synth_cache
from stacks.layout import plan_stacks
from stacks.synth import _units, synthesize
from tests.conftest import FLEET_CLUSTERS, REPO_ROOT


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "synth-cache"
    monkeypatch.setenv(synth_cache.CACHE_ENV, str(directory))
    return directory


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """The stack names each in-process synthesis built (jobs=1 synthesizes through ``synth_group``)."""
    calls: list[tuple[str, ...]] = []
    real = parallel.synth_group

    def recording(configs, names, outdir, imported_dir):
        calls.append(tuple(names))
        return real(configs, names, outdir, imported_dir)

    monkeypatch.setattr(parallel, "synth_group", recording)
    return calls


def _edited_fleet(tmp_path: Path) -> Path:
    """A copy of the example fleet with one value of dev-gke changed (its system pool's size)."""
    copy = tmp_path / "clusters"
    shutil.copytree(FLEET_CLUSTERS, copy)
    path = copy / "dev-gke.yaml"
    text = path.read_text()
    assert "    max_nodes: 2\n  vault_addr" in text
    path.write_text(text.replace("    max_nodes: 2\n  vault_addr", "    max_nodes: 3\n  vault_addr"))
    return copy


def test_cold_warm_and_partial_syntheses_are_byte_identical_to_an_uncached_one(
        fleet_out: Path, example_configs, cache: Path, built: list, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fleet_out is synthesized with the cache off (tests/conftest.py)."""
    first, second = tmp_path / "first", tmp_path / "second"
    synthesize(example_configs, first, jobs=1)
    assert _tree(first) == _tree(fleet_out)
    assert built == [tuple(s.name for s in plan_stacks(example_configs))]  # cold: every stack, once
    built.clear()
    synthesize(example_configs, second, jobs=1)
    assert _tree(second) == _tree(fleet_out)
    assert built == []  # warm: no synthesis at all

    edited = clusters.load_all(_edited_fleet(tmp_path))
    partial = tmp_path / "partial"
    synthesize(edited, partial, jobs=1)
    assert built == [("dev-gke", "dev-gke-scheduler")]  # only the edited cluster's stacks
    monkeypatch.setenv(synth_cache.CACHE_ENV, "off")
    cold = tmp_path / "cold"
    synthesize(edited, cold, jobs=1)
    assert _tree(partial) == _tree(cold)
    assert _tree(partial) != _tree(fleet_out)


def test_an_edited_clusters_stacks_are_told_before_the_cached_ones(fleet_out: Path, example_configs, cache: Path,
                                                                   tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``gpufleet check`` scans each stack as ``written`` hears of it: after a one-cluster edit the synthesized
    stacks come first (the checkov cache holds the rest), then every cached one, and the tree is the same."""
    synthesize(example_configs, tmp_path / "warm", jobs=1)
    told: list[str] = []
    edited = clusters.load_all(_edited_fleet(tmp_path))
    partial = tmp_path / "partial"
    synthesize(edited, partial, jobs=1, written=lambda stack_dir: told.append(stack_dir.name))
    assert told[:2] == ["dev-gke", "dev-gke-scheduler"]
    assert sorted(told) == sorted(s.name for s in plan_stacks(edited))
    monkeypatch.setenv(synth_cache.CACHE_ENV, "off")
    synthesize(edited, tmp_path / "cold", jobs=1)
    assert _tree(partial) == _tree(tmp_path / "cold")


def test_a_named_stack_and_workers_go_through_the_cache_too(fleet_out: Path, example_configs, cache: Path, tmp_path: Path) -> None:
    synthesize(example_configs, tmp_path / "warm", jobs=2)
    assert _tree(tmp_path / "warm") == _tree(fleet_out)
    one = tmp_path / "one"
    assert synthesize(example_configs, one, only=("prod-nomad",)) == ("prod-nomad",)
    assert (one / "stacks" / "prod-nomad" / "cdk.tf.json").read_bytes() == (fleet_out / "stacks" / "prod-nomad" / "cdk.tf.json").read_bytes()


def test_deleted_cache_dir_and_corrupted_entries_are_misses(fleet_out: Path, example_configs, cache: Path, built: list, tmp_path: Path) -> None:
    synthesize(example_configs, tmp_path / "a", jobs=1)
    shutil.rmtree(cache)
    built.clear()
    synthesize(example_configs, tmp_path / "b", jobs=1)
    assert _tree(tmp_path / "b") == _tree(fleet_out) and len(built) == 1 and cache.is_dir()

    entries = {json.loads(p.read_text())["stacks"].__iter__().__next__(): p for p in cache.rglob("*.json")}
    truncated = entries["dev-gke"]
    truncated.write_text(truncated.read_text()[:1000])  # cut short: not JSON
    tampered = entries["prod-nomad"]
    data = json.loads(tampered.read_text())
    data["stacks"]["prod-nomad"]["files"]["cdk.tf.json"] = data["stacks"]["prod-nomad"]["files"]["cdk.tf.json"].replace("prod", "evil", 1)
    tampered.write_text(json.dumps(data))  # valid JSON, but a file no longer matches its digest
    built.clear()
    synthesize(example_configs, tmp_path / "c", jobs=1)
    assert _tree(tmp_path / "c") == _tree(fleet_out)
    assert sorted(n for names in built for n in names) == ["dev-gke", "dev-gke-scheduler", "prod-nomad", "prod-nomad-scheduler"]


def _key(configs, cluster: str, imported: Path) -> str:
    [(unit_configs, stacks)] = [(c, s) for c, s in _units(configs) if s[0].cluster == cluster]
    return synth_cache.unit_key(unit_configs, stacks, imported)


def test_the_key_changes_with_every_input_that_determines_the_stacks(
        example_configs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    imported = tmp_path / "imported"
    imported.mkdir()
    base = _key(example_configs, "dev-gke", imported)
    assert _key(example_configs, "dev-gke", imported) == base
    assert _key(example_configs, "prod-gke", imported) != base

    # the cluster file: a value changes the key, a comment does not (it cannot change a stack)
    assert _key(clusters.load_all(_edited_fleet(tmp_path / "edit")), "dev-gke", imported) != base
    commented = tmp_path / "comment" / "clusters"
    shutil.copytree(FLEET_CLUSTERS, commented)
    (commented / "dev-gke.yaml").write_text("# reviewed again\n" + (commented / "dev-gke.yaml").read_text())
    assert _key(clusters.load_all(commented), "dev-gke", imported) == base

    # a referenced file: the stack's recorded imports, added and then edited
    (imported / "dev-gke-scheduler.json").write_text("{}")
    with_imports = _key(example_configs, "dev-gke", imported)
    assert with_imports != base
    (imported / "dev-gke-scheduler.json").write_text('{"kubernetes_namespace_v1.x": "x"}')
    assert _key(example_configs, "dev-gke", imported) not in (base, with_imports)
    (imported / "dev-gke-scheduler.json").unlink()
    assert _key(example_configs, "dev-gke", imported) == base

    # today's date (a maintenance exclusion renews by the quarter) and cdktf's environment
    monkeypatch.setenv("GPUFLEET_TODAY", "2031-01-01")
    assert _key(example_configs, "dev-gke", imported) != base
    monkeypatch.delenv("GPUFLEET_TODAY")
    monkeypatch.setenv("SYNTH_HCL_OUTPUT", "true")
    assert _key(example_configs, "dev-gke", imported) != base
    monkeypatch.delenv("SYNTH_HCL_OUTPUT")

    # tfc-workspaces is built from every cluster keeping state in Terraform Cloud: an edit of one of them
    # changes its key, an edit of another cluster (dev-gke: local state) does not
    def tfc_key(configs) -> str:
        [(unit_configs, stacks)] = [(c, s) for c, s in _units(configs) if not s[0].cluster]
        return synth_cache.unit_key(unit_configs, stacks, imported)

    assert tfc_key(clusters.load_all(_edited_fleet(tmp_path / "edit2"))) == tfc_key(example_configs)
    tfc_edit = tmp_path / "tfc" / "clusters"
    shutil.copytree(FLEET_CLUSTERS, tfc_edit)
    text = (tfc_edit / "prod-nomad.yaml").read_text()
    assert "  backend: tfc\n  organization: gpufleet\n" in text
    (tfc_edit / "prod-nomad.yaml").write_text(text.replace("organization: gpufleet\n", "organization: gpufleet-eu\n", 1))
    assert tfc_key(clusters.load_all(tfc_edit)) != tfc_key(example_configs)


def test_the_key_changes_with_gpufleet_source_and_versions(example_configs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    imported = tmp_path / "imported"
    imported.mkdir()
    code = tmp_path / "code"
    for relative in synth_cache.code_files():
        (code / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / relative, code / relative)
    monkeypatch.setattr(synth_cache, "CODE_ROOT", code)
    synth_cache.code_digest.cache_clear()
    try:
        base = _key(example_configs, "dev-gke", imported)
        construct = code / "constructs_lib" / "network.py"
        construct.write_text(construct.read_text() + "\n# a changed construct\n")
        synth_cache.code_digest.cache_clear()
        after_source = _key(example_configs, "dev-gke", imported)
        assert after_source != base
        data = code / "clusters" / "gcp_zones.json"
        data.write_text(data.read_text() + "\n")
        synth_cache.code_digest.cache_clear()
        after_data = _key(example_configs, "dev-gke", imported)
        assert after_data not in (base, after_source)
        versions = synth_cache._versions()
        assert any(v.startswith("cdktf==") for v in versions) and any(v.startswith("cdktf-cdktf-provider-google==") for v in versions)
        monkeypatch.setattr(synth_cache, "_versions", lambda: [v.replace("cdktf==", "cdktf==9.") for v in versions])
        synth_cache.code_digest.cache_clear()
        assert _key(example_configs, "dev-gke", imported) not in (base, after_source, after_data)
    finally:
        synth_cache.code_digest.cache_clear()


AUDIT = textwrap.dedent("""
    import os, sys
    opened = set()
    sys.addaudithook(lambda event, args: opened.add(os.path.realpath(args[0])) if event == "open" and isinstance(args[0], str) else None)
    from pathlib import Path
    import clusters
    from stacks.synth import synthesize
    synthesize(clusters.load_all(Path(sys.argv[1])), Path(sys.argv[2]), jobs=1)
    print("\\n".join(sorted(opened)))
""")


def test_every_file_a_synthesis_reads_is_keyed(tmp_path: Path) -> None:
    """Load and synthesize the example fleet in a fresh interpreter and record every file it opens
    (Python's ``open`` audit event: imports and reads): each one under gpufleet's code root is either a
    file of ``code_files()`` (the code digest), a cluster file (keyed as its config) or a recorded import."""
    fleet = tmp_path / "clusters"
    shutil.copytree(FLEET_CLUSTERS, fleet)
    imported = REPO_ROOT / "stacks" / "imported"
    done = subprocess.run([sys.executable, "-c", AUDIT, str(fleet), str(tmp_path / "out")], cwd=REPO_ROOT,
                          capture_output=True, text=True, env={**os.environ, synth_cache.CACHE_ENV: "off"}, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    root = REPO_ROOT.resolve()
    keyed = {str((root / p).resolve()) for p in synth_cache.code_files(root)}
    read = [Path(p) for p in done.stdout.splitlines()]
    unkeyed = [str(p) for p in read if p.is_relative_to(root) and not p.is_relative_to(root / ".venv") and p.is_file()
               and "__pycache__" not in p.parts and str(p) not in keyed and not p.is_relative_to(imported.resolve())
               and not p.parent.name.endswith(".egg-info")]  # the installed package's metadata: its version is keyed
    assert unkeyed == []
    assert any(p.is_relative_to(fleet.resolve()) for p in read)  # the audit saw the cluster files being read
    assert str((root / "constructs_lib" / "gpu_health_check.py").resolve()) in {str(p) for p in read}


def test_a_synthesis_refused_by_the_template_check_stores_nothing(example_configs, cache: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Cached stacks are not checked again (stacks.interpolation.check_outdir), so what fails that check must never be stored."""
    import stacks.synth
    from clusters.errors import UserError

    def refuse(outdir, shown_as=None, stacks=None):
        raise UserError(f"{shown_as}/stacks/dev-gke/cdk.tf.json: $.x: ${{file(...)}} is not a template sequence gpufleet generates")

    monkeypatch.setattr(stacks.synth, "check_outdir", refuse)
    with pytest.raises(UserError, match="not a template sequence"):
        synthesize(example_configs, tmp_path / "out", jobs=1)
    assert not [p for p in cache.rglob("*.json")] and not (tmp_path / "out").exists()


def _poison(cache: Path, stack: str) -> None:
    """What another user who can write the cache directory does: rewrite an entry with a template
    sequence gpufleet never generates and recompute its digest (a digest is no signature)."""
    import hashlib

    [entry] = [p for p in cache.rglob("*.json") if stack in json.loads(p.read_text())["stacks"]]
    data = json.loads(entry.read_text())
    files = data["stacks"][stack]["files"]
    stack_json = json.loads(files["cdk.tf.json"])
    stack_json["locals"] = {"leak": '${base64encode(file("/proc/self/environ"))}'}
    files["cdk.tf.json"] = json.dumps(stack_json, indent=2)
    data["stacks"][stack]["sha256"]["cdk.tf.json"] = hashlib.sha256(files["cdk.tf.json"].encode()).hexdigest()
    entry.write_text(json.dumps(data))


def test_a_cache_dir_another_user_can_write_is_not_used(fleet_out: Path, example_configs, cache: Path, tmp_path: Path,
                                                        capfd: pytest.CaptureFixture) -> None:
    """Cached stacks skip the template check, so an entry someone else could write would put
    ``${file(...)}`` into a stack unchecked: a group- or world-writable cache, or one owned by another
    user, is not read (nor written), and the one line on stderr says how to fix it."""
    synthesize(example_configs, tmp_path / "a", jobs=1)
    _poison(cache, "dev-gke")
    cache.chmod(0o777)
    synthesize(example_configs, tmp_path / "b", jobs=1)
    assert _tree(tmp_path / "b") == _tree(fleet_out)
    assert "chmod go-w" in capfd.readouterr().err

    cache.chmod(0o700)
    os.chown(cache, 65534, 65534)  # the tests run as root: hand the cache to nobody
    synthesize(example_configs, tmp_path / "c", jobs=1)
    assert _tree(tmp_path / "c") == _tree(fleet_out)


def test_a_symlink_inside_the_cache_is_never_followed(fleet_out: Path, example_configs, cache: Path, tmp_path: Path) -> None:
    """An entry or shard directory that is a link reads from outside the cache: a miss."""
    synthesize(example_configs, tmp_path / "a", jobs=1)
    _poison(cache, "dev-gke")
    [entry] = [p for p in cache.rglob("*.json") if "dev-gke" in json.loads(p.read_text())["stacks"]]
    outside = tmp_path / "elsewhere"
    shutil.move(entry.parent, outside)
    entry.parent.symlink_to(outside)
    synthesize(example_configs, tmp_path / "b", jobs=1)
    assert _tree(tmp_path / "b") == _tree(fleet_out)


def test_an_input_changed_while_synthesizing_is_not_stored_under_the_old_key(
        example_configs, cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys are computed before synthesis, but the constructs import code and read recorded imports while it
    runs: an input edited meanwhile (a `git checkout` during `gpufleet check`) would put the new input's
    stacks under the old input's key, served later to the old input. Here a recorded import appears mid-run."""
    imported = tmp_path / "imported"
    imported.mkdir()
    real = parallel.synth_group

    def edit_then_synth(configs, names, outdir, imported_dir):
        (imported / "dev-gke-scheduler.json").write_text("{}")
        return real(configs, names, outdir, imported_dir)

    monkeypatch.setattr(parallel, "synth_group", edit_then_synth)
    synthesize(example_configs, tmp_path / "out", jobs=1, imported_dir=imported)
    stored = {json.loads(p.read_text())["key"] for p in cache.rglob("*.json")}
    now = {synth_cache.unit_key(c, s, imported) for c, s in _units(example_configs)}
    assert stored and stored <= now


def test_the_libraries_whose_code_shapes_a_stack_are_keyed() -> None:
    """Besides cdktf and the bindings, two libraries' code decides values of a stack: ruamel.yaml parses
    the vendored GPUDirect manifests whose containers, mounts and capabilities the admission policies
    embed (clusters/gpudirect_upstream.py), and jsii's runtime requirements (attrs/cattrs serialize every
    value sent to the kernel). An upgrade of one of them alone must be another key."""
    keyed = {v.split("==")[0].lower().replace("_", "-").replace(".", "-") for v in synth_cache._versions()}
    assert {"ruamel-yaml", "attrs", "cattrs", "python-dateutil", "typing-extensions", "publication"} <= keyed


def test_workers_synthesize_with_the_recorded_imports_the_key_names(example_configs, cache: Path, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The key reads the recorded imports where this process finds them (``stacks.imported.imported_dir``:
    ``--repo``'s checkout, or a directory set in this process); a worker process must synthesize with those
    same imports, not with whatever its own default finds, or a stack without its import block is stored
    under the key of the imports it lacks."""
    from stacks import imported

    monkeypatch.setattr(imported, "IMPORTED_DIR", tmp_path / "imported")
    imported.IMPORTED_DIR.mkdir()
    pool_id = "projects/ml-train-prod/locations/us-central1/clusters/prod-gke/nodePools/h100"
    (imported.IMPORTED_DIR / "prod-gke.json").write_text(f'{{"google_container_node_pool.pool_h100": "{pool_id}"}}')
    synthesize(example_configs, tmp_path / "out", jobs=2)
    stack = json.loads((tmp_path / "out" / "stacks" / "prod-gke" / "cdk.tf.json").read_text())
    assert stack["import"] == [{"to": "google_container_node_pool.pool_h100", "id": pool_id}]
