"""``gpufleet check`` names what a removed cluster file or a renamed/removed protected pool destroys.

The plan gate blocks the destroy later, but only for stacks CI still plans: a removed cluster
file takes its stacks out of the CI matrix without a word, and a renamed pool reads as an
innocent edit in review. This compares the cluster files with a git base (simple form; the full
offline preview is ``gpufleet preview``'s):

- base: the merge-base of HEAD with ``$GPUFLEET_BASE_REF`` (which must exist), else with
  ``origin/main`` or ``main``; neither is an error naming what was tried (never HEAD against
  itself). When that merge-base is HEAD (working on main), uncommitted edits are the change.
- a protected pool (protected by default outside dev) present at the base and gone now, or a
  removed cluster file that had protected pools, is blocking; the fix is a reviewed commit that
  sets ``protected: false`` first, then the removal. Unprotected ones are announced as notes.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from clusters.derive.pools import derive_gpu_pools
from clusters.errors import ConfigError, UserError
from clusters.schema import ClusterConfig
from clusters.source import YamlDocument, validate_document
from stacks.layout import plan_stacks

BASE_ENV = "GPUFLEET_BASE_REF"
DEFAULT_BASES = ("origin/main", "main")


@dataclass(frozen=True)
class Destroy:
    blocking: bool
    line: str


def _git(repo: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def base_ref(repo: Path) -> str | None:
    """The commit the working tree is compared with; None when ``repo`` has no commit (not a fleet checkout yet).

    Resolved explicitly and failing closed: a base named by ``$GPUFLEET_BASE_REF`` must exist, and
    without one ``origin/main`` or ``main`` must. Falling back to HEAD compared a committed removal
    of a protected pool with itself and reported "no changes" (issue 22); now that is a one-line
    error naming every ref tried. HEAD is the base only when it *is* the merge base (working on
    main), where the uncommitted edits are the change.
    """
    head = (_git(repo, "rev-parse", "--verify", "--quiet", "HEAD^{commit}") or "").strip()
    if not head:
        return None
    named = os.environ.get(BASE_ENV, "").strip()
    if named:
        if not _git(repo, "rev-parse", "--verify", "--quiet", f"{named}^{{commit}}"):
            raise UserError(f"{BASE_ENV}={named}: not a commit in {repo}; set it to an existing branch, tag or commit "
                            "(e.g. origin/main), or unset it to use origin/main or main")
        return _merge_base(repo, named, f"{BASE_ENV}={named}")
    tried = []
    for ref in DEFAULT_BASES:
        tried.append(ref)
        if _git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"):
            return _merge_base(repo, ref, ref)
    raise UserError(f"no base to compare with in {repo}: tried {BASE_ENV} (unset), {', '.join(tried)}, none exists; "
                    f"fetch main (git fetch origin main), or name the base with --base <ref> or {BASE_ENV}")


def _merge_base(repo: Path, ref: str, label: str) -> str:
    merge_base = (_git(repo, "merge-base", "HEAD", ref) or "").strip()
    if not merge_base:
        raise UserError(f"{label}: shares no history with HEAD in {repo}; name a base HEAD was branched from")
    return merge_base


def _old_config(repo: Path, ref: str, path: str) -> ClusterConfig | None:
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    text = _git(repo, "show", f"{ref}:{path}")
    if text is None:
        return None
    try:
        return validate_document(YamlDocument(Path(path), YAML(typ="rt").load(text)), ClusterConfig)
    except (ConfigError, YAMLError):
        return None  # a base that did not validate protected nothing gpufleet could have applied


def announce(repo: Path, configs: tuple[ClusterConfig, ...]) -> tuple[str | None, list[Destroy]]:
    """(base commit, what the working tree destroys relative to it); base None when ``repo`` is not a git checkout."""
    ref = base_ref(repo)
    if ref is None:
        return None, []
    listed = _git(repo, "ls-tree", "--name-only", ref, "clusters/") or ""
    now = {c.name: c for c in configs}
    short = ref[:12]
    out: list[Destroy] = []
    for path in sorted(p for p in listed.splitlines() if p.endswith((".yaml", ".yml"))):
        old = _old_config(repo, ref, path)
        if old is None:
            continue
        protected = [p for p in derive_gpu_pools(old) if p.protected]
        current = now.get(old.name)
        if current is None:
            stacks = ", ".join(s.name for s in plan_stacks((old,)))
            pools = ", ".join(f"{p.name} ({p.machine_type})" for p in protected)
            what = f"protected GPU pools {pools} and everything else it declares" if protected else "everything it declares"
            fix = ("restore the file, or first set protected: false on those pools in a reviewed commit, then remove it"
                   if protected else "make sure the stacks were destroyed deliberately (gpufleet plan before removing)")
            out.append(Destroy(bool(protected), f"{path}: removed since {short}: stacks {stacks} leave the CI plan matrix and"
                                                f" nothing manages {what} any more; {fix}"))
            continue
        names = {p.name for p in current.gpu_pools}
        for pool in derive_gpu_pools(old):
            if pool.name in names:
                continue
            line = (f"{path}: gpu_pools: pool {pool.name!r} ({pool.machine_type}) is gone since {short}: renaming or removing a pool"
                    " destroys its node pool or instance group and every node on it")
            fix = ("; restore the name, or set protected: false on it in a reviewed commit first" if pool.protected
                   else " (it is not protected: the plan will delete it)")
            out.append(Destroy(pool.protected, line + fix))
    return short, out
