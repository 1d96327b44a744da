"""A bench's ``--write`` replaces only its own marked section of BENCHMARKS.md (bench/mdsection.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "mdsection.py"


def _module():
    spec = importlib.util.spec_from_file_location("bench_mdsection", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_replace_section_keeps_everything_outside_its_markers(tmp_path: Path) -> None:
    md = _module()
    path = tmp_path / "BENCHMARKS.md"
    begin, end = md.markers("bench/synth.py")
    path.write_text(f"# Benchmarks\n\nintro by hand\n\n{begin}\nold figures\n{end}\n\n## Control plane\n\nother figures\n")
    md.replace_section(path, "bench/synth.py", "new figures\n")
    assert path.read_text() == f"# Benchmarks\n\nintro by hand\n\n{begin}\nnew figures\n{end}\n\n## Control plane\n\nother figures\n"
    md.replace_section(path, "bench/check.py", "check figures")  # no markers yet: appended, the rest untouched
    text = path.read_text()
    assert text.startswith(f"# Benchmarks\n\nintro by hand\n\n{begin}\nnew figures\n{end}\n\n## Control plane\n\nother figures\n\n")
    assert text.endswith("<!-- BEGIN bench/check.py -->\ncheck figures\n<!-- END bench/check.py -->\n")


def test_a_begin_marker_without_its_end_is_refused(tmp_path: Path) -> None:
    md = _module()
    path = tmp_path / "BENCHMARKS.md"
    path.write_text("# Benchmarks\n<!-- BEGIN bench/synth.py -->\nfigures\n")
    with pytest.raises(ValueError, match="has no <!-- END bench/synth.py -->"):
        md.replace_section(path, "bench/synth.py", "x")
    assert path.read_text() == "# Benchmarks\n<!-- BEGIN bench/synth.py -->\nfigures\n"


def test_the_repository_benchmarks_file_marks_the_synthesis_section() -> None:
    text = (BENCH.parents[1] / "BENCHMARKS.md").read_text()
    begin, end = _module().markers("bench/synth.py")
    assert text.count(begin) == 1 and text.count(end) == 1 and text.index(begin) < text.index(end)
