"""``gpufleet check`` names what a removed cluster file or a renamed/removed protected pool destroys.

The plan gate blocks the destroy later, but only for stacks CI still plans: a removed cluster
file takes its stacks out of the CI matrix without a word, and a renamed pool reads as an
innocent edit in review. This compares the cluster files with a git base (simple form; the full
offline preview is ``gpufleet preview``'s):

- base: the merge-base of HEAD with ``$GPUFLEET_BASE_REF`` (which must exist), else with
  ``origin/main`` or ``main``; neither is an error naming what was tried. A base that resolves
  to HEAD is refused (never HEAD against itself) unless it is spelled ``HEAD`` or HEAD is already
  in ``origin/main``: then only uncommitted edits are the change, said in a note.
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
from clusters.source import parse_yaml, validate_document
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


@dataclass(frozen=True)
class Base:
    """The commit the working tree is compared with, how it was named, and a note when it is HEAD."""

    commit: str
    label: str
    note: str | None = None

    @property
    def short(self) -> str:
        return self.commit[:12]


def _commit(repo: Path, ref: str) -> str:
    return (_git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}") or "").strip()


def base_ref(repo: Path, flag: str | None = None) -> Base | None:
    """The base the working tree is compared with; None when ``repo`` has no commit (not a fleet checkout yet).

    Resolved explicitly and failing closed (issue 22). ``flag`` (``preview --base``) is taken as
    given; otherwise the merge base of HEAD with ``$GPUFLEET_BASE_REF`` (which must exist), else
    with ``origin/main`` or ``main`` (one must exist). Falling back to HEAD compared a committed
    rename of a protected pool with itself and reported "no changes"; so does any base that
    *resolves* to HEAD (a tag at HEAD, ``HEAD~0``, the current branch, ``main`` with no origin),
    which ``_not_head`` refuses unless nothing committed is left to compare.
    """
    head = _commit(repo, "HEAD")
    if not head:
        return None
    if flag is not None:
        commit = _commit(repo, flag)
        if not commit:
            raise UserError(f"--base {flag}: not a commit in {repo}; pass a branch, tag or commit (e.g. --base origin/main)")
        return _not_head(repo, Base(commit, f"--base {flag}"), flag, head)
    named = os.environ.get(BASE_ENV, "").strip()
    if named:
        if not _commit(repo, named):
            raise UserError(f"{BASE_ENV}={named}: not a commit in {repo}; set it to an existing branch, tag or commit "
                            "(e.g. origin/main), or unset it to use origin/main or main")
        return _not_head(repo, _merge_base(repo, named, f"{BASE_ENV}={named}"), named, head)
    tried = []
    for ref in DEFAULT_BASES:
        tried.append(ref)
        if _commit(repo, ref):
            return _not_head(repo, _merge_base(repo, ref, ref), ref, head)
    raise UserError(f"no base to compare with in {repo}: tried {BASE_ENV} (unset), {', '.join(tried)}, none exists; "
                    f"fetch main (git fetch origin main), or name the base with --base <ref> or {BASE_ENV}")


def _merge_base(repo: Path, ref: str, label: str) -> Base:
    merge_base = (_git(repo, "merge-base", "HEAD", ref) or "").strip()
    if not merge_base:
        raise UserError(f"{label}: shares no history with HEAD in {repo}; name a base HEAD was branched from")
    return Base(merge_base, label)


def _not_head(repo: Path, base: Base, spelled: str, head: str) -> Base:
    """``base`` unless it is HEAD while HEAD holds commits nobody compared.

    A base equal to HEAD compares only uncommitted edits. That is what the user asked for when
    the base is spelled exactly ``HEAD``, and all there is to compare when HEAD is already in
    ``origin/main`` (a fresh clone of main, a branch with no commit of its own): both pass with
    a visible note. Anything else that lands on HEAD (a tag or branch at HEAD, ``HEAD~0``,
    ``@``, local ``main`` with no origin or force-moved to HEAD) would read committed changes as
    no change, so it is a one-line error naming the ref and its commit.
    """
    if base.commit != head:
        return base
    if spelled == "HEAD":
        return Base(head, base.label, f"base is HEAD ({base.short}, {base.label}): comparing uncommitted changes only")
    upstream_main = _commit(repo, "refs/remotes/origin/main")
    if upstream_main and _git(repo, "merge-base", "--is-ancestor", head, upstream_main) is not None:
        return Base(head, base.label, f"base {base.label} is HEAD ({base.short}), already in origin/main: "
                                      "comparing uncommitted changes only")
    upstream = (_git(repo, "rev-parse", "--abbrev-ref", "--symbolic-full-name", "@{upstream}") or "").strip()
    hint = (f" (this branch's upstream {upstream} is at {_commit(repo, upstream)[:12]})"
            if upstream and _commit(repo, upstream) not in ("", head) else "")
    raise UserError(f"{base.label} resolves to HEAD ({base.short}) in {repo}: committed changes would not be compared; "
                    f"name the base you branched from with --base or {BASE_ENV}{hint}, or spell it HEAD to compare "
                    "uncommitted changes only")


def _old_config(repo: Path, ref: str, path: str) -> ClusterConfig | None:
    """The base's file read as the working tree's are (``parse_yaml``: its alias bound, and what ruamel.yaml raises
    outside its error classes as a ConfigError), so no base file is a traceback or an unbounded expansion."""
    text = _git(repo, "show", f"{ref}:{path}")
    if text is None:
        return None
    try:
        return validate_document(parse_yaml(Path(path), text), ClusterConfig)
    except ConfigError:
        return None  # a base that did not validate protected nothing gpufleet could have applied


def announce(repo: Path, configs: tuple[ClusterConfig, ...]) -> tuple[Base | None, list[Destroy]]:
    """(base, what the working tree destroys relative to it); base None when ``repo`` is not a git checkout."""
    base = base_ref(repo)
    if base is None:
        return None, []
    ref = base.commit
    listed = _git(repo, "ls-tree", "--name-only", ref, "clusters/") or ""
    now = {c.name: c for c in configs}
    short = base.short
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
    return base, out
