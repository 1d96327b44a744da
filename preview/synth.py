"""Synthesize the fleet at a git ref and at the working tree, offline, without touching either.

The base is the fleet *as the base commit had it*: its cluster files, its recorded imports and
its code (a construct ID renamed by a code change is a destroy too). ``git archive`` writes the
base tree into a temporary directory (no worktree, no index, nothing in the repository
changes) and that tree's own ``main.py`` synthesizes it in a subprocess with this
interpreter's packages. When the base's synthesis code is byte-identical to the running
gpufleet, the subprocess is skipped and the tree is synthesized in-process, which gives the
same bytes (synthesis is deterministic) at a fraction of the cost.

The base output is cached under ``<cache>/<key>/`` where the key hashes the base *tree*
(its content: code, cluster files, imports) and the installed synthesis dependencies
(cdktf, jsii, the provider packages, Python): the same base previewed again costs only the
head synthesis.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from clusters.errors import UserError
from clusters.termination import run_to_end

CACHE_VERSION = 1
SYNTH_TIMEOUT_S = 900
CODE_ROOT = Path(__file__).resolve().parent.parent
SYNTH_PACKAGES = ("clusters", "constructs_lib", "stacks", "jobs", "vault_policies")
SYNTH_FILES = ("main.py", "pyproject.toml", "cdktf.json")
DEPENDENCIES = ("cdktf", "constructs", "jsii", "cdktf-cdktf-provider-google", "cdktf-cdktf-provider-kubernetes",
                "cdktf-cdktf-provider-cloudflare", "cdktf-cdktf-provider-nomad", "cdktf-cdktf-provider-tfe")


def default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpufleet" / "preview"


def git(repo: Path, *args: str) -> str:
    result = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise UserError(f"git {' '.join(args)} failed in {repo}: {result.stderr.strip().splitlines()[-1] if result.stderr.strip() else 'no output'}")
    return result.stdout.strip()


def require_git(path: Path) -> Path:
    """``path`` itself (the fleet directory), after checking it is inside a git work tree."""
    result = subprocess.run(["git", "-C", str(path), "rev-parse", "--is-inside-work-tree"], capture_output=True, text=True)
    if result.returncode != 0 or result.stdout.strip() != "true":
        raise UserError(f"{path}: not inside a git repository; run gpufleet preview from a clone of the fleet repository")
    return Path(path)


def resolve_tree(repo: Path, ref: str) -> tuple[str, str]:
    """(commit, tree of the fleet directory) at a ref; an unknown ref is a one-line user error.

    The fleet may live in a subdirectory of the git repository (a monorepo): the tree is that
    directory's at the ref, so the cache key covers the fleet and nothing else.
    """
    result = subprocess.run(["git", "-C", str(repo), "rev-parse", "-q", "--verify", f"{ref}^{{commit}}"], capture_output=True, text=True)
    if result.returncode != 0:
        raise UserError(f"--base {ref}: not a commit in {repo}; pass a branch, tag or commit (e.g. --base origin/main)")
    commit = result.stdout.strip()
    prefix = git(repo, "rev-parse", "--show-prefix").rstrip("/")
    found = subprocess.run(["git", "-C", str(repo), "rev-parse", "-q", "--verify", f"{commit}:{prefix}" if prefix else f"{commit}^{{tree}}"],
                           capture_output=True, text=True)
    if found.returncode != 0:
        raise UserError(f"--base {ref}: {prefix or 'the repository'} does not exist at {commit[:12]}; pick a base that has the fleet")
    return commit, found.stdout.strip()


def dependency_fingerprint() -> str:
    versions = {}
    for name in DEPENDENCIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "absent"
    return json.dumps({"python": platform.python_version(), "deps": versions, "cache": CACHE_VERSION}, sort_keys=True)


def cache_key(tree: str) -> str:
    return hashlib.sha256(f"{tree}\n{dependency_fingerprint()}".encode()).hexdigest()[:32]


def _code_files(root: Path) -> Iterator[Path]:
    for name in SYNTH_FILES:
        if (root / name).is_file():
            yield root / name
    for package in SYNTH_PACKAGES:
        for path in sorted((root / package).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix in (".py", ".hcl", ".yaml", ".json") \
                    and not (package == "clusters" and path.suffix == ".yaml") and not (package == "stacks" and "imported" in path.parts) \
                    and not (package == "jobs" and path.relative_to(root / package).parts[0] == "out"):
                yield path


def code_hash(root: Path) -> str:
    """Hash of what synthesis runs (code and packaged data, not cluster files, recorded imports or
    rendered jobs: ``jobs/out`` is git-ignored output, so a render must not make the working tree's
    code look different from a base that has none)."""
    digest = hashlib.sha256()
    for path in _code_files(root):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


@contextmanager
def extracted(repo: Path, tree: str) -> Iterator[Path]:
    """A tree (the fleet directory at the base) in a temporary directory, via ``git archive`` (the repository is not modified)."""
    with tempfile.TemporaryDirectory(prefix="gpufleet-preview-base-") as tmp:
        archive = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", tree], capture_output=True, check=False)
        if archive.returncode != 0:
            raise UserError(f"git archive {tree[:12]} failed: {archive.stderr.decode(errors='replace').strip()}")
        target = Path(tmp) / "tree"
        target.mkdir()
        with tarfile.open(fileobj=_bytes_io(archive.stdout)) as tar:
            tar.extractall(target, filter="data")
        yield target


@contextmanager
def _acting_on(tree: Path) -> Iterator[None]:
    """Point repository-relative reads (imports, Vault files) at ``tree`` while it synthesizes in-process."""
    import clusters.repo

    previous = clusters.repo.root_or_none()
    clusters.repo.use(tree)
    try:
        yield
    finally:
        clusters.repo.use(previous)


def _bytes_io(data: bytes) -> Any:
    import io

    return io.BytesIO(data)


def read_stacks(outdir: Path) -> dict[str, dict[str, Any]]:
    stacks_dir = Path(outdir) / "stacks"
    return {p.parent.name: json.loads(p.read_text(encoding="utf-8")) for p in sorted(stacks_dir.glob("*/cdk.tf.json"))}


class NeedsSubprocess(Exception):
    """The tree's code differs from the running code and the caller asked for in-process synthesis only."""


def synth_tree(tree: Path, outdir: Path, label: str = "the base", subprocess_ok: bool = True) -> str:
    """Synthesize a fleet tree (code + cluster files + imports) into ``outdir``; returns how (in-process|subprocess)."""
    if (tree / "clusters").is_dir() and code_hash(tree) == code_hash(CODE_ROOT):
        import clusters
        from stacks.synth import synthesize

        with _acting_on(tree):
            synthesize(clusters.load_all(tree / "clusters"), outdir, imported_dir=tree / "stacks" / "imported")
        return "in-process"
    if not subprocess_ok:
        raise NeedsSubprocess(label)
    if not (tree / "main.py").is_file():
        raise UserError(f"{tree}: no main.py; the base predates gpufleet's layout, pick a later --base")
    env = {**os.environ, "CDKTF_OUTDIR": str(outdir), "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("GPUFLEET_CLUSTERS_DIR", None)
    check = f"import sys; sys.path.insert(0, {str(tree)!r}); import runpy; runpy.run_path('main.py', run_name='__main__')"
    try:
        # Not subprocess.run: a SIGTERM would SIGKILL main.py before it removes its jsii files (termination.run_to_end).
        result = run_to_end([sys.executable, "-c", check], cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            timeout=SYNTH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise UserError(f"{label} did not finish synthesizing in {SYNTH_TIMEOUT_S} s; run `gpufleet synth` there to see why") from None
    if result.returncode != 0:
        lines = [line for line in (result.stderr or result.stdout).strip().splitlines() if line.strip()]
        raise UserError(f"{label} does not synthesize with its own code: {lines[-1] if lines else 'exit ' + str(result.returncode)}")
    return "subprocess"


def base_stacks(repo: Path, ref: str, cache_dir: Path | None, subprocess_ok: bool = True) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """The base fleet's stacks, from the cache when the same tree was synthesized before."""
    commit, tree = resolve_tree(repo, ref)
    info = {"ref": ref, "commit": commit, "tree": tree, "cache": "off"}
    entry = None
    if cache_dir is not None:
        entry = Path(cache_dir) / cache_key(tree)
        if (entry / "complete").is_file():
            return read_stacks(entry), {**info, "cache": "hit"}
    with extracted(repo, tree) as base_tree, tempfile.TemporaryDirectory(prefix="gpufleet-preview-out-") as out:
        outdir = Path(out) / "cdktf.out"
        info["synth"] = synth_tree(base_tree, outdir, subprocess_ok=subprocess_ok)
        stacks = read_stacks(outdir)
        if entry is not None:
            _store(entry, outdir)
            info["cache"] = "miss"
    return stacks, info


def _store(entry: Path, outdir: Path) -> None:
    """Copy the stacks' JSON into the cache atomically (a crash leaves no half entry)."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
    try:
        for path in sorted((outdir / "stacks").glob("*/cdk.tf.json")):
            target = partial / "stacks" / path.parent.name / path.name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
        (partial / "complete").write_text("", encoding="utf-8")
        if entry.exists():
            shutil.rmtree(partial)
            return
        os.replace(partial, entry)
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def head_stacks(repo: Path) -> dict[str, dict[str, Any]]:
    """The working tree's fleet (uncommitted edits included) synthesized by the working tree's code."""
    with tempfile.TemporaryDirectory(prefix="gpufleet-preview-head-") as out:
        outdir = Path(out) / "cdktf.out"
        synth_tree(repo, outdir, "the working tree")
        return read_stacks(outdir)
