"""One entry point for ``gpufleet preview`` and ``gpufleet check``: base vs head, then the diff."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gpufleet.preview.diff import PreviewResult, preview
from gpufleet.preview.forcenew import load_tables
from gpufleet.preview.synth import base_stacks, default_base, default_cache_dir, head_stacks, read_stacks, require_git


def run_preview(repo: Path, base: str | None, *, allow_destroy: Iterable[str] = (), cache_dir: Path | None = None,
                use_cache: bool = True, head_out: Path | None = None) -> tuple[PreviewResult, dict[str, Any]]:
    """Preview the working tree of ``repo`` against ``base`` (default: merge base with the default branch).

    ``head_out``: an already synthesized ``cdktf.out`` of the working tree (``gpufleet check``
    has one), so the head is not synthesized twice.
    """
    root = require_git(Path(repo))
    ref = base or default_base(root)
    base_json, info = base_stacks(root, ref, (cache_dir or default_cache_dir()) if use_cache else None)
    head_json = read_stacks(head_out) if head_out is not None else head_stacks(root)
    return preview(base_json, head_json, load_tables(), allow_destroy=allow_destroy), info
