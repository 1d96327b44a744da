"""``gpufleet preview`` end to end: a throwaway git repository of the example fleet, a committed
base, one edit in the working tree, a real synthesis of both sides and the exact findings.

The repository is a copy of this checkout (code, cluster files), so base and head synthesize
in-process (same code) and the base synthesis is cached across tests (same base tree): each
case costs one head synthesis. ``test_code_change_*`` edits code, which makes the head
synthesize in a subprocess with its own ``main.py``, the path a PR that changes code takes.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from gpufleet.cli import main
from safety.plan_gate import DEFAULT_PROTECTED_TYPES
from tests.conftest import REPO_ROOT

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}


def git(repo: Path, *args: str) -> str:
    import os

    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env={**os.environ, **GIT_ENV}).stdout


@pytest.fixture(scope="module")
def fleet_repo(tmp_path_factory, fleet_out) -> Path:
    """A git repository holding this checkout's files, committed once as the base (``fleet_out`` warms jsii)."""
    repo = tmp_path_factory.mktemp("fleet-repo")
    files = subprocess.run(["git", "-C", str(REPO_ROOT), "ls-files", "-co", "--exclude-standard", "-z"], check=True,
                           capture_output=True, text=True).stdout.split("\0")
    for name in filter(None, files):
        source = REPO_ROOT / name
        if source.is_file():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, repo / name)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    return repo


@pytest.fixture()
def repo(fleet_repo) -> Path:
    git(fleet_repo, "reset", "-q", "--hard", "main")
    git(fleet_repo, "clean", "-qfd")
    return fleet_repo


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("preview-cache")


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


def run(repo: Path, cache_dir: Path, tmp_path: Path, *extra: str) -> tuple[int, dict]:
    """Preview the uncommitted edits (``--base HEAD``, the explicit spelling; see test_base_head_*)."""
    out = tmp_path / "preview.json"
    rc = main(["--repo", str(repo), "preview", "--base", "HEAD", "--cache-dir", str(cache_dir), "--json-out", str(out), *extra])
    return rc, json.loads(out.read_text()) if out.exists() else {}


def findings(report: dict, protected_only: bool = False) -> list[tuple[str, str, str | None]]:
    return [(f["kind"], f"{s['stack']}/{f['address']}", f["new_address"]) for s in report["stacks"] for f in s["findings"]
            if f["protected"] or not protected_only]


def test_unchanged_working_tree_exits_0_and_second_preview_hits_the_cache(repo, cache_dir, tmp_path):
    rc, report = run(repo, cache_dir, tmp_path)
    assert rc == 0 and findings(report) == []
    rc, report = run(repo, cache_dir, tmp_path)
    assert rc == 0 and report["base"]["cache"] == "hit" and report["base"]["tree"] == git(repo, "rev-parse", "main^{tree}").strip()


def test_json_out_goes_through_the_one_output_writer(repo, cache_dir, tmp_path, capsys):
    """--json-out is written by clusters.outputs.write_file, like every other gpufleet output: a
    previous report is replaced, a file gpufleet did not write or a reviewed directory is refused."""
    rc, first = run(repo, cache_dir, tmp_path)
    rc_again, again = run(repo, cache_dir, tmp_path)
    assert rc == rc_again == 0 and first["stacks"] == again["stacks"]
    foreign = tmp_path / "notes.json"
    foreign.write_text('{"mine": true}\n')
    assert main(["--repo", str(repo), "preview", "--base", "HEAD", "--cache-dir", str(cache_dir), "--json-out", str(foreign)]) == 2
    assert foreign.read_text() == '{"mine": true}\n'
    assert capsys.readouterr().err.strip() == f"error: --json-out {foreign}: refused: the file exists and gpufleet did not write it; pass a new path or remove it yourself"
    reviewed = repo / "clusters" / "preview.json"
    assert main(["--repo", str(repo), "preview", "--base", "HEAD", "--cache-dir", str(cache_dir), "--json-out", str(reviewed)]) == 2
    assert not reviewed.exists()
    assert "refused: it is inside clusters/, which holds the repository's reviewed files" in capsys.readouterr().err


def test_pool_renamed_is_a_costly_rename_of_a_protected_pool(repo, cache_dir, tmp_path):
    cluster = repo / "clusters/prod-gke.yaml"
    edit(cluster, "  - name: h100\n", "  - name: h200\n")
    edit(cluster, "gpu_quota: {h100: 24,", "gpu_quota: {h200: 24,")
    edit(cluster, "gpu_quota: {h100: 8,", "gpu_quota: {h200: 8,")
    status, worktrees, refs = git(repo, "status", "--porcelain"), git(repo, "worktree", "list"), git(repo, "show-ref")
    rc, report = run(repo, cache_dir, tmp_path)
    assert (git(repo, "status", "--porcelain"), git(repo, "worktree", "list"), git(repo, "show-ref")) == (status, worktrees, refs)
    assert rc == 4
    assert findings(report, protected_only=True) == [
        ("renamed", "prod-gke/google_container_node_pool.pool_h100", "google_container_node_pool.pool_h200")]
    (pool,) = [f for s in report["stacks"] for f in s["findings"] if f["protected"]]
    assert "keep the old name" in pool["advice"] and report["blocking"] == ["prod-gke/google_container_node_pool.pool_h100"]


def test_rename_kept_by_allow_destroy_exits_3(repo, cache_dir, tmp_path):
    cluster = repo / "clusters/prod-gke.yaml"
    edit(cluster, "  - name: h100\n", "  - name: h200\n")
    edit(cluster, "gpu_quota: {h100: 24,", "gpu_quota: {h200: 24,")
    edit(cluster, "gpu_quota: {h100: 8,", "gpu_quota: {h200: 8,")
    rc, report = run(repo, cache_dir, tmp_path, "--allow-destroy", "prod-gke/google_container_node_pool.pool_h100")
    assert rc == 3 and report["blocking"] == []
    assert [f["allowed"] for s in report["stacks"] for f in s["findings"] if f["protected"]] == [True]


def test_fails_when_allow_destroy_is_a_bare_address(repo, cache_dir, tmp_path, capsys):
    """Issue 22: a bare address was accepted as "fleet-unique" and allowed the rename; now it is refused with the form."""
    cluster = repo / "clusters/prod-gke.yaml"
    edit(cluster, "  - name: h100\n", "  - name: h200\n")
    edit(cluster, "gpu_quota: {h100: 24,", "gpu_quota: {h200: 24,")
    edit(cluster, "gpu_quota: {h100: 8,", "gpu_quota: {h200: 8,")
    rc, report = run(repo, cache_dir, tmp_path, "--allow-destroy", "google_container_node_pool.pool_h100")
    assert rc == 2 and report == {}
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: --allow-destroy google_container_node_pool.pool_h100: a bare address is refused (it would allow that address in "
        "every stack); name its stack: --allow-destroy prod-gke/google_container_node_pool.pool_h100"]


def test_static_ip_description_changed_replaces_the_ip(repo, cache_dir, tmp_path):
    edit(repo / "clusters/prod-gke.yaml", "description: training dashboards and TensorBoard ingress", "description: dashboards")
    rc, report = run(repo, cache_dir, tmp_path)
    assert rc == 4 and findings(report) == [("replaced", "prod-gke/google_compute_global_address.ip_ingress", None)]
    (ip,) = report["stacks"][[s["stack"] for s in report["stacks"]].index("prod-gke")]["findings"]
    assert ip["changes"] == [{"path": "description", "old": "training dashboards and TensorBoard ingress", "new": "dashboards",
                              "forces_replacement": True, "source": ip["changes"][0]["source"]}]


def test_reservation_changed_replaces_the_reserved_pool(repo, cache_dir, tmp_path):
    edit(repo / "clusters/prod-gke.yaml", "reservation: h100-reservation-2026", "reservation: h100-reservation-2027")
    rc, report = run(repo, cache_dir, tmp_path)
    assert rc == 4 and findings(report) == [("replaced", "prod-gke/google_container_node_pool.pool_h100", None)]


def test_driver_version_changed_on_a_reserved_pool_replaces_it(repo, cache_dir, tmp_path):
    edit(repo / "clusters/prod-gke.yaml", "    reservation: h100-reservation-2026\n",
         "    reservation: h100-reservation-2026\n    gpu_driver_version: LATEST\n")
    rc, report = run(repo, cache_dir, tmp_path)
    assert rc == 4 and findings(report) == [("replaced", "prod-gke/google_container_node_pool.pool_h100", None)]
    (pool,) = [f for s in report["stacks"] for f in s["findings"]]
    assert [(c["path"], c["old"], c["new"]) for c in pool["changes"]] == [
        ("node_config.guest_accelerator[0].gpu_driver_installation_config.gpu_driver_version", "DEFAULT", "LATEST")]


def test_machine_type_changed_replaces_the_pool_through_its_accelerator_count(repo, cache_dir, tmp_path):
    edit(repo / "clusters/prod-gke.yaml", "machine_type: g2-standard-24", "machine_type: g2-standard-48")
    rc, report = run(repo, cache_dir, tmp_path)
    assert rc == 4 and findings(report) == [("replaced", "prod-gke/google_container_node_pool.pool_l4_spot", None)]
    (pool,) = [f for s in report["stacks"] for f in s["findings"]]
    assert [(c["path"], c["old"], c["new"]) for c in pool["changes"]] == [("node_config.guest_accelerator[0].count", 2, 4)]


def test_max_nodes_raised_is_in_place(repo, cache_dir, tmp_path):
    edit(repo / "clusters/prod-gke.yaml", "max_nodes: 4\n", "max_nodes: 6\n")
    rc, report = run(repo, cache_dir, tmp_path)
    assert rc == 3 and findings(report) == []
    assert {s["stack"]: s["updated_in_place"] for s in report["stacks"] if s["status"] == "changed"} == {"prod-gke": 1}


def test_tenant_added_is_not_destructive(repo, cache_dir, tmp_path):
    edit(repo / "clusters/prod-gke.yaml", "dns:\n", "  - name: evals\n    groups: [group:ml-evals@example.com]\n    gpu_quota: {}\ndns:\n")
    rc, report = run(repo, cache_dir, tmp_path)
    assert rc == 3 and findings(report) == []
    # The scheduler stack gets the tenant's namespace and queues; the infra stack its checkpoint prefix grant.
    assert {s["stack"] for s in report["stacks"] if s["created"]} == {"prod-gke", "prod-gke-scheduler"}


def test_cluster_file_deleted_destroys_every_protected_resource_of_its_stacks(repo, cache_dir, tmp_path, stack_json):
    (repo / "clusters/prod-nomad.yaml").unlink()
    rc, report = run(repo, cache_dir, tmp_path)
    assert rc == 4
    removed = {s["stack"] for s in report["stacks"] if s["status"] == "removed"}
    assert removed == {"prod-nomad", "prod-nomad-scheduler", "tfc-workspaces"}  # prod-nomad was the only TFC-backed cluster
    # every resource of the removed stacks is destroyed; protected: by type (the gate's list) or by prevent_destroy
    expected = []
    for stack in sorted(removed):
        for rtype, by_name in sorted(stack_json(stack)["resource"].items()):
            for name, body in sorted(by_name.items()):
                protected = rtype in DEFAULT_PROTECTED_TYPES or body.get("lifecycle", {}).get("prevent_destroy") is True
                expected.append(("destroyed", f"{stack}/{rtype}.{name}", None, protected))
    assert [(*f, p["protected"]) for f, p in zip(findings(report), [f for s in report["stacks"] for f in s["findings"]])] == expected
    assert {
        "prod-nomad/google_compute_region_instance_group_manager.nomad_pool_a100",
        "prod-nomad-scheduler/nomad_node_pool.nomad_node_pool_a100", "tfc-workspaces/tfe_workspace.workspace_prod_nomad",
    } <= set(report["blocking"])


def test_reviewed_import_removed_with_its_resource_is_a_blocked_destroy(repo, cache_dir, tmp_path):
    imported = repo / "stacks/imported/prod-gke.json"
    imported.parent.mkdir(parents=True, exist_ok=True)
    imported.write_text(json.dumps({"google_service_account.tenant_sa_research": "projects/ml-train-prod/serviceAccounts/r@x"}))
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "import the research tenant's service account")
    try:
        imported.unlink()
        edit(repo / "clusters/prod-gke.yaml", "    service_account:\n      roles: [roles/storage.objectViewer]\n", "")
        rc, report = run(repo, cache_dir, tmp_path, "--base", "HEAD")
    finally:
        git(repo, "reset", "-q", "--hard", "main")
    assert rc == 4
    assert findings(report, protected_only=True) == [("destroyed", "prod-gke/google_service_account.tenant_sa_research", None)]
    (sa,) = [f for s in report["stacks"] for f in s["findings"] if f["protected"]]
    assert sa["why_protected"] == "reviewed import"


def test_non_protected_resource_replaced_is_reported_not_blocking(repo, cache_dir, tmp_path):
    # a DNS record pointing at a static IP (A) becomes a CNAME: cloudflare replaces it (type RequiresReplace)
    edit(repo / "clusters/prod-gke.yaml", "    - name: tensorboard.prod\n      static_ip: ingress\n",
         "    - name: tensorboard.prod\n      hostname: dashboards.example.com\n")
    rc, report = run(repo, cache_dir, tmp_path)
    assert rc == 3
    assert findings(report) == [("replaced", "prod-gke/cloudflare_dns_record.dns_tensorboard_prod", None)]


def test_bad_base_ref_is_a_one_line_user_error(repo, cache_dir, tmp_path, capsys):
    rc, _ = run(repo, cache_dir, tmp_path, "--base", "no-such-branch")
    err = capsys.readouterr().err
    assert rc == 2 and err.strip().startswith("error: --base no-such-branch: not a commit") and "Traceback" not in err


def test_code_change_renaming_a_construct_id_is_previewed_with_the_working_tree_code(repo, cache_dir, tmp_path):
    edit(repo / "constructs_lib/static_ips.py", 'f"ip_{ip.name}"', 'f"static_ip_{ip.name}"')
    rc, report = run(repo, cache_dir, tmp_path)
    assert rc == 4
    assert findings(report, protected_only=True) == [
        ("renamed", "prod-gke/google_compute_global_address.ip_ingress", "google_compute_global_address.static_ip_ingress"),
    ]
    assert all("moved" in f["advice"] for s in report["stacks"] for f in s["findings"] if f["protected"])


def test_fleet_in_a_subdirectory_of_a_git_repository_previews_that_directory(tmp_path, repo, cache_dir):
    """A monorepo: the fleet is ``infra/gpufleet``; base and head are that directory, not the repository root."""
    assert run(repo, cache_dir, tmp_path)[0] == 0  # caches the fleet's base tree (usually already cached)
    mono = tmp_path / "mono"
    (mono / "infra").mkdir(parents=True)
    shutil.copytree(repo, mono / "infra" / "gpufleet", ignore=shutil.ignore_patterns(".git"))
    (mono / "README.md").write_text("other things\n")
    git(mono, "init", "-q", "-b", "main")
    git(mono, "add", "-A")
    git(mono, "commit", "-qm", "base")
    fleet = mono / "infra" / "gpufleet"
    edit(fleet / "clusters/prod-gke.yaml", "reservation: h100-reservation-2026", "reservation: h100-reservation-2027")
    rc, report = run(fleet, cache_dir, tmp_path)
    assert rc == 4 and findings(report) == [("replaced", "prod-gke/google_container_node_pool.pool_h100", None)]
    assert report["base"]["tree"] == git(mono, "rev-parse", "main:infra/gpufleet").strip()
    assert report["base"]["cache"] == "hit"  # the same fleet tree as fleet_repo's base: its cached synthesis serves


def test_check_runs_the_full_preview_when_cheap_and_catches_an_immutable_edit(repo, cache_dir, tmp_path, monkeypatch, capsys):
    """The simple check-time notice sees only removed files and pools; a reworded static IP
    description (the IP is released) needs the ForceNew tables: check reuses its own synthesis
    as the head and the base's in-process synthesis (same code), then fails the destroys step."""
    from review.checks import run_checks

    monkeypatch.setenv("XDG_CACHE_HOME", str(cache_dir / "xdg"))
    monkeypatch.setenv("GPUFLEET_BASE_REF", "HEAD")
    edit(repo / "clusters/prod-gke.yaml", "description: training dashboards and TensorBoard ingress", "description: dashboards")
    import clusters.repo

    clusters.repo.use(repo)
    try:
        report = run_checks(None, out=repo / "cdktf.out", checkov=False)
    finally:
        clusters.repo.use(None)
    row = next(r for r in report.rows if r[0] == "destroys")
    assert row[:2] == ("destroys", False) and "(gpufleet preview)" in row[2]
    head = git(repo, "rev-parse", "HEAD").strip()[:12]
    assert [d for d in report.details if d.startswith("preview:")] == [
        f"preview: note: base is HEAD ({head}, GPUFLEET_BASE_REF=HEAD): comparing uncommitted changes only",
        "preview: BLOCKED: prod-gke: google_compute_global_address.ip_ingress is replaced (immutable: description: "
        "training dashboards and TensorBoard ingress -> dashboards) [protected type]"]


def test_rendered_jobs_do_not_change_the_code_hash(tmp_path):
    """jobs/out is git-ignored render output: with it counted, any render made check's preview think the
    base's code differs and silently fall back to the simple destroys form."""
    from preview.synth import code_hash

    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "render.py").write_text("x = 1\n")
    before = code_hash(tmp_path)
    (tmp_path / "jobs" / "out").mkdir()
    (tmp_path / "jobs" / "out" / "finetune-llama.json").write_text("{}\n")
    assert code_hash(tmp_path) == before
    (tmp_path / "jobs" / "render.py").write_text("x = 2\n")
    assert code_hash(tmp_path) != before


def test_the_code_hash_covers_every_package_synthesis_imports():
    """code_hash decides whether a base synthesizes in-process: a package synthesis imports but the
    hash leaves out would let a base with different code be synthesized with this checkout's code.
    Synthesis (main.py and SYNTH_PACKAGES) imports no other project package, so the CLI (gpufleet)
    is not hashed: a CLI-only change does not force a subprocess synthesis of the base."""
    from preview.synth import CODE_ROOT, SYNTH_PACKAGES
    from tests.test_layers import imported_packages, layers

    project = set(layers()) | {"main"}
    files = [CODE_ROOT / "main.py", *(p for package in SYNTH_PACKAGES for p in sorted((CODE_ROOT / package).rglob("*.py")))]
    outside = sorted(f"{path.relative_to(CODE_ROOT)}:{line}: {target}" for path in files for target, line in imported_packages(path)
                     if target in project and target not in SYNTH_PACKAGES)
    assert outside == []
    assert "gpufleet" not in SYNTH_PACKAGES


def _renamed_pool_committed_on(tmp_path: Path, fleet_repo: Path, branch: str) -> Path:
    """A fleet repository whose only branch is ``branch``: the base commit, then a *committed*
    rename of the protected prod-gke h100 pool; the working tree is clean."""
    other = tmp_path / f"on-{branch}"
    shutil.copytree(fleet_repo, other, ignore=shutil.ignore_patterns(".git", "cdktf.out"))
    git(other, "init", "-q", "-b", branch)
    git(other, "add", "-A")
    git(other, "commit", "-qm", "base")
    cluster = other / "clusters/prod-gke.yaml"
    edit(cluster, "  - name: h100\n", "  - name: h200\n")
    edit(cluster, "gpu_quota: {h100: 24,", "gpu_quota: {h200: 24,")
    edit(cluster, "gpu_quota: {h100: 8,", "gpu_quota: {h200: 8,")
    git(other, "commit", "-qam", "rename the h100 pool")
    return other


def test_fails_when_no_base_exists_instead_of_comparing_head_with_itself(fleet_repo, cache_dir, tmp_path, monkeypatch, capsys):
    """Issue 22: with no main or origin/main, the default base was HEAD, so a committed rename of a
    protected pool previewed as "no changes", exit 0. Now: one line naming every ref tried, exit 2."""
    monkeypatch.delenv("GPUFLEET_BASE_REF", raising=False)
    other = _renamed_pool_committed_on(tmp_path, fleet_repo, "trunk")
    out = tmp_path / "preview.json"
    rc = main(["--repo", str(other), "preview", "--cache-dir", str(cache_dir), "--json-out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and not out.exists()
    assert err == [f"error: no base to compare with in {other}: tried GPUFLEET_BASE_REF (unset), origin/main, main, none exists; "
                   "fetch main (git fetch origin main), or name the base with --base <ref> or GPUFLEET_BASE_REF"]


def test_fails_when_the_named_base_ref_does_not_exist(fleet_repo, cache_dir, tmp_path, monkeypatch, capsys):
    """A typo in GPUFLEET_BASE_REF was dropped silently (main served instead); it is now named and refused."""
    other = _renamed_pool_committed_on(tmp_path, fleet_repo, "main")
    monkeypatch.setenv("GPUFLEET_BASE_REF", "orign/main")
    out = tmp_path / "preview.json"
    rc = main(["--repo", str(other), "preview", "--cache-dir", str(cache_dir), "--json-out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and not out.exists()
    assert err == [f"error: GPUFLEET_BASE_REF=orign/main: not a commit in {other}; set it to an existing branch, tag or commit "
                   "(e.g. origin/main), or unset it to use origin/main or main"]


def test_named_base_that_exists_previews_the_committed_rename(fleet_repo, cache_dir, tmp_path, monkeypatch):
    """The same repository with the base named (a tag on the first commit): the committed rename is blocked."""
    other = _renamed_pool_committed_on(tmp_path, fleet_repo, "trunk")
    git(other, "tag", "reviewed", "HEAD~1")
    monkeypatch.setenv("GPUFLEET_BASE_REF", "reviewed")
    out = tmp_path / "preview.json"
    rc = main(["--repo", str(other), "preview", "--cache-dir", str(cache_dir), "--json-out", str(out)])
    report = json.loads(out.read_text())
    assert rc == 4 and report["blocking"] == ["prod-gke/google_container_node_pool.pool_h100"]


def test_check_fails_its_destroys_step_when_no_base_exists(fleet_repo, tmp_path, monkeypatch):
    """``gpufleet check`` shares the rule: no base is a failed step naming what was tried, not a silent pass."""
    from review.checks import CheckReport, _destroys

    import clusters

    monkeypatch.delenv("GPUFLEET_BASE_REF", raising=False)
    other = _renamed_pool_committed_on(tmp_path, fleet_repo, "trunk")
    clusters.repo.use(other)
    try:
        report = CheckReport()
        _destroys(report, clusters.load_all(other / "clusters"))
    finally:
        clusters.repo.use(None)
    assert report.rows == [("destroys", False, "no base to compare with")]
    assert report.details[0].startswith(f"destroy: no base to compare with in {other}: tried GPUFLEET_BASE_REF (unset), origin/main, main")


@pytest.mark.parametrize("base", ["HEAD~0", "main", "@"])
def test_fails_when_base_is_another_name_for_head_with_a_committed_rename(fleet_repo, cache_dir, tmp_path, monkeypatch, capsys, base):
    """Issue 22 red team: ``--base`` (or the default, local ``main`` with no origin) naming HEAD by
    another name previewed a committed rename of a protected pool as "no changes", exit 0."""
    monkeypatch.delenv("GPUFLEET_BASE_REF", raising=False)
    other = _renamed_pool_committed_on(tmp_path, fleet_repo, "main")
    head = git(other, "rev-parse", "HEAD").strip()
    out = tmp_path / "preview.json"
    flag = ["--base", base] if base != "main" else []  # main: the default base, on main with no origin
    rc = main(["--repo", str(other), "preview", *flag, "--cache-dir", str(cache_dir), "--json-out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    label = f"--base {base}" if flag else "main"
    assert rc == 2 and not out.exists()
    assert err == [f"error: {label} resolves to HEAD ({head[:12]}) in {other}: committed changes would not be compared; name the "
                   "base you branched from with --base or GPUFLEET_BASE_REF, or spell it HEAD to compare uncommitted changes only"]


def test_base_head_previews_uncommitted_changes_only_and_says_so(fleet_repo, cache_dir, tmp_path, monkeypatch, capsys):
    """``--base HEAD`` is the one explicit way to ask for the uncommitted edits alone: the note is in the text and the JSON."""
    other = _renamed_pool_committed_on(tmp_path, fleet_repo, "main")
    head = git(other, "rev-parse", "HEAD").strip()
    out = tmp_path / "preview.json"
    rc = main(["--repo", str(other), "preview", "--base", "HEAD", "--cache-dir", str(cache_dir), "--json-out", str(out)])
    note = f"base is HEAD ({head[:12]}, --base HEAD): comparing uncommitted changes only"
    assert rc == 0 and json.loads(out.read_text())["base"]["note"] == note
    assert f"note: {note}" in capsys.readouterr().out.splitlines()


def test_fresh_clone_previews_with_a_note_and_commits_on_it_against_origin_main(fleet_repo, cache_dir, tmp_path, monkeypatch, capsys):
    """A newcomer's ``git clone``: origin/main is HEAD, the preview passes with the note; a rename
    committed on the clone's main (not pushed) is compared with origin/main and blocked."""
    monkeypatch.delenv("GPUFLEET_BASE_REF", raising=False)
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(fleet_repo), str(clone))
    head = git(clone, "rev-parse", "HEAD").strip()
    out = tmp_path / "preview.json"
    rc = main(["--repo", str(clone), "preview", "--cache-dir", str(cache_dir), "--json-out", str(out)])
    assert rc == 0 and json.loads(out.read_text())["base"]["note"] == (
        f"base origin/main is HEAD ({head[:12]}), already in origin/main: comparing uncommitted changes only")
    cluster = clone / "clusters/prod-gke.yaml"
    edit(cluster, "  - name: h100\n", "  - name: h200\n")
    edit(cluster, "gpu_quota: {h100: 24,", "gpu_quota: {h200: 24,")
    edit(cluster, "gpu_quota: {h100: 8,", "gpu_quota: {h200: 8,")
    git(clone, "commit", "-qam", "rename the h100 pool")
    rc = main(["--repo", str(clone), "preview", "--cache-dir", str(cache_dir), "--json-out", str(out)])
    report = json.loads(out.read_text())
    assert rc == 4 and report["blocking"] == ["prod-gke/google_container_node_pool.pool_h100"] and "note" not in report["base"]
