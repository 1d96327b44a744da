"""One entry point for ``gpufleet preview`` and ``gpufleet check``: base vs head, then the diff."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clusters.errors import UserError
from preview.diff import PreviewResult, preview
from preview.forcenew import load_tables
from preview.synth import NeedsSubprocess, base_stacks, default_cache_dir, head_stacks, read_stacks, require_git

if TYPE_CHECKING:
    from safety.destroys import Base


def resolve_base(root: Path, flag: str | None = None) -> "Base":
    """The one base rule ``check`` and ``preview`` share (``safety.destroys.base_ref``), ``--base`` included."""
    from safety import destroys

    base = destroys.base_ref(root, flag)
    if base is None:
        raise UserError(f"{root}: the git checkout has no commit to compare with; commit once, or pass --base <ref>")
    return base


def run_preview(repo: Path, base: str | None, *, allow_destroy: Iterable[str] = (), cache_dir: Path | None = None,
                use_cache: bool = True, head_out: Path | None = None,
                subprocess_ok: bool = True) -> tuple[PreviewResult, dict[str, Any]]:
    """Preview the working tree of ``repo`` against ``base`` (checked and defaulted by ``resolve_base``).

    ``head_out``: an already synthesized ``cdktf.out`` of the working tree (``gpufleet check``
    has one), so the head is not synthesized twice. ``subprocess_ok=False`` raises
    ``NeedsSubprocess`` instead of starting a synthesis process for a base with other code.
    """
    root = require_git(Path(repo))
    resolved = resolve_base(root, base)
    base_json, info = base_stacks(root, base or resolved.commit, (cache_dir or default_cache_dir()) if use_cache else None,
                                  subprocess_ok=subprocess_ok)
    if resolved.note:
        info = {**info, "note": resolved.note}
    head_json = read_stacks(head_out) if head_out is not None else head_stacks(root)
    return preview(base_json, head_json, load_tables(), allow_destroy=allow_destroy), info


def cheap_preview(repo: Path, head_out: Path, cache_dir: Path | None = None) -> tuple[PreviewResult, dict[str, Any]] | None:
    """The full preview for ``gpufleet check`` when it costs no extra process: the base is cached, or
    its code is the running code (in-process synthesis in check's warm jsii, seconds). None otherwise."""
    try:
        return run_preview(repo, None, cache_dir=cache_dir, head_out=head_out, subprocess_ok=False)
    except NeedsSubprocess:
        return None
