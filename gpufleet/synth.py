"""Deterministic, atomic synthesis: build every stack into a temp dir, then swap it into place.

A failed synthesis (bad cluster file, construct error) leaves the previous ``cdktf.out``
untouched, so a reviewer never plans against a half-written tree.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from clusters.schema import ClusterConfig
from clusters.errors import UserError

DEFAULT_OUTDIR = Path("cdktf.out")
# jsii prints a banner on every start under Node 20; gpufleet pins Node 20 knowingly.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
os.environ.setdefault("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1")


def synthesize(configs: tuple[ClusterConfig, ...], outdir: Path = DEFAULT_OUTDIR,
               only: tuple[str, ...] = ()) -> tuple[str, ...]:
    """Synthesize the fleet (or only the named stacks' clusters) into ``outdir``; returns stack names."""
    from cdktf import App

    from stacks import build_fleet

    outdir = Path(outdir).resolve()
    outdir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".cdktf.out.", dir=outdir.parent))
    try:
        app = App(outdir=str(tmp), skip_validation=False)
        fleet = build_fleet(app, configs)
        unknown = sorted(set(only) - set(fleet.stacks))
        if unknown:
            raise UserError(f"unknown stack {unknown[0]!r}; known stacks: {', '.join(sorted(fleet.stacks))}")
        app.synth()
        _swap(tmp, outdir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return tuple(fleet.stacks)


def _swap(new: Path, target: Path) -> None:
    old = target.with_name(target.name + ".old")
    if old.exists():
        shutil.rmtree(old)
    if target.exists():
        os.replace(target, old)
    os.replace(new, target)
    if old.exists():
        shutil.rmtree(old)
