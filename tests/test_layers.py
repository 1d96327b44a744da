"""No import points up: every project module imports only packages of its own or a lower layer.

The order is the one docs/layout.md states (read from it here, so the two cannot
disagree); imports inside functions count too, because a lazy import is still a dependency, and
so do ``importlib.import_module("...")`` / ``__import__("...")`` with a literal name. Relative
imports are resolved against the importing file's package; one that climbs out of it is refused. ``main``,
``bench``, ``tools`` and ``tests`` sit above every layer: no layer imports them.

Inside ``jobs`` the scheduler seam holds the same way: the neutral modules import neither side
(``jobs.nomad``, ``jobs.k8s``) except the few that pick one by design, and the sides never import
each other.
"""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def layers() -> list[str]:
    text = (ROOT / "docs" / "layout.md").read_text()
    section = text[text.index("## Layout") :]
    match = re.search(r"Layers, bottom to top[^:]*\):\s*(.+?)\.\s", section, re.S)
    assert match, "docs/layout.md lost its 'Layers, bottom to top' line"
    return re.findall(r"`(\w+)` ?<?", match.group(1).replace("\n", " "))


class RelativeImportError(ValueError):
    """A relative import that climbs above its top-level package (Python refuses it at run time)."""


def _resolve(name: str, package: str, where: str) -> str:
    """``name`` (``.x``, ``..k8s.render``) as an absolute module, against ``package`` (the
    importing file's ``__package__``), as ``importlib.util.resolve_name`` does."""
    level = len(name) - len(name.lstrip("."))
    parts = package.split(".") if package else []
    if level - 1 >= len(parts):
        raise RelativeImportError(f"{where}: relative import {name!r} climbs above the top-level package {package or '(none)'}")
    base = ".".join(parts[: len(parts) - (level - 1)])
    rest = name[level:]
    return f"{base}.{rest}" if rest else base


def _dynamic_import(node: ast.AST, package: str, where: str) -> str | None:
    """The module a call ``importlib.import_module("a.b")`` / ``import_module("a.b")`` /
    ``__import__("a.b")`` names with a string literal (a computed name cannot be checked here); a
    relative name is resolved against the literal package ``import_module`` is given, or this file's."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    first = node.args[0]
    if name not in ("import_module", "__import__") or not isinstance(first, ast.Constant) or not isinstance(first.value, str):
        return None
    if not first.value.startswith("."):
        return first.value
    anchor = node.args[1] if name == "import_module" and len(node.args) > 1 else None
    if isinstance(anchor, ast.Constant) and isinstance(anchor.value, str):
        package = anchor.value
    return _resolve(first.value, package, where)


def package_of(path: Path, root: Path) -> str:
    """The importing file's ``__package__``: its directory under ``root``, dotted (``jobs/nomad/x.py``
    and ``jobs/nomad/__init__.py`` are both in ``jobs.nomad``; ``main.py`` is in none)."""
    return ".".join(path.resolve().relative_to(root.resolve()).parent.parts)


def imported_modules(path: Path, root: Path = ROOT) -> set[tuple[str, int]]:
    """Every dotted module an import names, with its line: ``import``, ``from a import b`` (counted
    as both ``a`` and ``a.b``: b may be a submodule), relative imports resolved against the file's
    package (``from ..k8s import render`` in ``jobs/nomad`` is ``jobs.k8s``), and literal dynamic imports."""
    package = package_of(path, root)
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        where = f"{path.relative_to(root)}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            found |= {(alias.name, node.lineno) for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                module = _resolve("." * node.level + module, package, where)
            found.add((module, node.lineno))
            found |= {(f"{module}.{alias.name}", node.lineno) for alias in node.names}
        elif (module := _dynamic_import(node, package, where)) is not None:
            found.add((module, node.lineno))
    return found


def imported_packages(path: Path, root: Path = ROOT) -> set[tuple[str, int]]:
    return {(module.split(".")[0], line) for module, line in imported_modules(path, root)}


# Entry points and their tests sit above every layer: no layer imports them.
ABOVE_EVERY_LAYER = ("bench", "tools", "tests", "main")


def upward_imports(root: Path, order: list[str]) -> list[str]:
    rank = {name: i for i, name in enumerate(order)} | {name: len(order) for name in ABOVE_EVERY_LAYER}
    bad = []
    for package in order:
        for path in sorted((root / package).rglob("*.py")):
            for target, line in sorted(imported_packages(path, root)):
                if target in rank and rank[target] > rank[package]:
                    bad.append(f"{path.relative_to(root)}:{line}: {package} imports {target} (a higher layer)")
    return bad


SIDES = ("jobs.nomad", "jobs.k8s")
# Neutral jobs modules that pick a scheduler by design (jobs/__init__.py says why for each).
SIDE_PICKERS = frozenset({"jobs/runner.py", "jobs/outputs.py", "jobs/local.py"})


def _side(module: str) -> str | None:
    return next((side for side in SIDES if module == side or module.startswith(side + ".")), None)


def scheduler_crossings(root: Path) -> list[str]:
    """Imports across the scheduler seam: a neutral ``jobs`` module (other than SIDE_PICKERS)
    importing a side, or one side importing the other."""
    bad = []
    for path in sorted((root / "jobs").rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        own = _side(relative.removesuffix(".py").replace("/", "."))
        if own is None and relative in SIDE_PICKERS:
            continue
        crossings = {(line, side) for target, line in imported_modules(path, root) if (side := _side(target)) not in (None, own)}
        for line, side in sorted(crossings):
            who = f"{own} imports the other side," if own else "a neutral jobs module imports"
            bad.append(f"{relative}:{line}: {who} {side}")
    return bad


def test_readme_names_every_package_once():
    order = layers()
    assert len(order) == len(set(order))
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests", "bench", "tools", "deploy"}
    assert set(order) == packages, f"layout section and packages differ: {set(order) ^ packages}"


def test_no_layer_imports_a_higher_one():
    assert upward_imports(ROOT, layers()) == []


def test_the_walk_sees_an_upward_import(tmp_path):
    (tmp_path / "low").mkdir()
    (tmp_path / "high").mkdir()
    (tmp_path / "low" / "mod.py").write_text("def f():\n    from high import thing\n")
    (tmp_path / "high" / "mod.py").write_text("import low.mod\n")
    assert upward_imports(tmp_path, ["low", "high"]) == ["low/mod.py:2: low imports high (a higher layer)"]


def test_the_scheduler_sides_stay_apart():
    assert scheduler_crossings(ROOT) == []


def test_the_seam_walk_sees_each_crossing(tmp_path):
    """A synthetic tree with one planted crossing of each kind, and the side-pickers left alone."""
    for package in ("jobs", "jobs/nomad", "jobs/k8s"):
        (tmp_path / package).mkdir(parents=True, exist_ok=True)
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "jobs" / "checks.py").write_text("from jobs.spec import X\n\ndef f():\n    from jobs.k8s.render import PLATFORM_ENV\n")
    (tmp_path / "jobs" / "quota.py").write_text("from jobs import nomad\n")
    (tmp_path / "jobs" / "runner.py").write_text("import jobs.nomad.client\nimport jobs.k8s.client\n")
    (tmp_path / "jobs" / "nomad" / "client.py").write_text("from jobs.nomad.render import render\nimport jobs.k8s.status\n")
    (tmp_path / "jobs" / "k8s" / "render.py").write_text("from jobs.nomad import render\n")
    assert scheduler_crossings(tmp_path) == [
        "jobs/checks.py:4: a neutral jobs module imports jobs.k8s",
        "jobs/k8s/render.py:1: jobs.k8s imports the other side, jobs.nomad",
        "jobs/nomad/client.py:2: jobs.nomad imports the other side, jobs.k8s",
        "jobs/quota.py:1: a neutral jobs module imports jobs.nomad",
    ]


def test_the_seam_walk_resolves_relative_imports(tmp_path):
    """A relative import is the same dependency as its absolute form: ``from ..k8s import render`` in
    jobs/nomad is jobs.k8s (the walk once skipped every relative import, so this one went unseen)."""
    for package in ("jobs", "jobs/nomad", "jobs/k8s"):
        (tmp_path / package).mkdir(parents=True, exist_ok=True)
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "jobs" / "nomad" / "client.py").write_text("from . import render\nfrom .render import job\n\ndef f():\n    from ..k8s import render\n")
    (tmp_path / "jobs" / "k8s" / "__init__.py").write_text("from ..nomad import client\n")
    (tmp_path / "jobs" / "checks.py").write_text("from .spec import X\nfrom .nomad.status import TERMINAL\n")
    assert scheduler_crossings(tmp_path) == [
        "jobs/checks.py:2: a neutral jobs module imports jobs.nomad",
        "jobs/k8s/__init__.py:1: jobs.k8s imports the other side, jobs.nomad",
        "jobs/nomad/client.py:5: jobs.nomad imports the other side, jobs.k8s",
    ]


def test_a_relative_import_above_the_top_level_package_is_refused(tmp_path):
    """Relative imports cannot leave their top-level package, so they cannot point up a layer; one
    that tries is refused rather than skipped, and so is one in a file outside any package."""
    (tmp_path / "low").mkdir()
    (tmp_path / "low" / "a.py").write_text("from .b import c\nfrom .. import high\n")
    with pytest.raises(RelativeImportError, match=r"low/a.py:2: relative import '..' climbs above the top-level package low"):
        upward_imports(tmp_path, ["low", "high"])
    (tmp_path / "main.py").write_text("from . import low\n")
    with pytest.raises(RelativeImportError, match=r"main.py:1: relative import '.' climbs above the top-level package \(none\)"):
        imported_modules(tmp_path / "main.py", tmp_path)


def test_a_crossing_planted_in_a_copy_of_the_real_jobs_tree_is_caught(tmp_path):
    shutil.copytree(ROOT / "jobs", tmp_path / "jobs", ignore=shutil.ignore_patterns("*.yaml", "*.json", "openapi", "out", "__pycache__"))
    assert scheduler_crossings(tmp_path) == []
    with (tmp_path / "jobs" / "checks.py").open("a") as checks:
        checks.write("\nfrom jobs.k8s.gpudirect import reserved_env\n")
    lines = len((tmp_path / "jobs" / "checks.py").read_text().splitlines())
    assert scheduler_crossings(tmp_path) == [f"jobs/checks.py:{lines}: a neutral jobs module imports jobs.k8s"]


def test_a_relative_crossing_planted_in_a_copy_of_the_real_jobs_tree_is_caught(tmp_path):
    shutil.copytree(ROOT / "jobs", tmp_path / "jobs", ignore=shutil.ignore_patterns("*.yaml", "*.json", "openapi", "out", "__pycache__"))
    assert scheduler_crossings(tmp_path) == []
    with (tmp_path / "jobs" / "nomad" / "client.py").open("a") as client:
        client.write("\nfrom ..k8s import render\n")
    lines = len((tmp_path / "jobs" / "nomad" / "client.py").read_text().splitlines())
    assert scheduler_crossings(tmp_path) == [f"jobs/nomad/client.py:{lines}: jobs.nomad imports the other side, jobs.k8s"]


def test_the_walk_sees_literal_dynamic_imports(tmp_path):
    (tmp_path / "low").mkdir()
    (tmp_path / "high").mkdir()
    (tmp_path / "low" / "a.py").write_text('import importlib\n\nMOD = importlib.import_module("high.cli")\n')
    (tmp_path / "low" / "b.py").write_text('from importlib import import_module\n\ndef f():\n    return import_module("high")\n')
    (tmp_path / "low" / "c.py").write_text('cli = __import__("high.cli")\n')
    (tmp_path / "low" / "d.py").write_text('import importlib\n\ndef f(name):\n    return importlib.import_module(f"{name}._jsii"), importlib.import_module(".x", "low")\n')
    assert upward_imports(tmp_path, ["low", "high"]) == [
        "low/a.py:3: low imports high (a higher layer)",
        "low/b.py:4: low imports high (a higher layer)",
        "low/c.py:1: low imports high (a higher layer)",
    ]


def test_no_layer_imports_the_entry_points(tmp_path):
    (tmp_path / "top").mkdir()
    (tmp_path / "top" / "a.py").write_text("from tests.openbao_fixture import vault\nimport bench.synth\n")
    (tmp_path / "top" / "b.py").write_text('import importlib\n\nimportlib.import_module("tools.refresh_gpu_prices")\nimport main\n')
    assert upward_imports(tmp_path, ["top"]) == [
        "top/a.py:2: top imports bench (a higher layer)",
        "top/a.py:1: top imports tests (a higher layer)",
        "top/b.py:4: top imports main (a higher layer)",
        "top/b.py:3: top imports tools (a higher layer)",
    ]


def test_a_dynamic_upward_import_planted_in_a_copy_of_a_real_layer_is_caught(tmp_path):
    shutil.copytree(ROOT / "clusters", tmp_path / "clusters", ignore=shutil.ignore_patterns("*.yaml", "*.json", "__pycache__"))
    order = layers()
    assert upward_imports(tmp_path, order) == []
    (tmp_path / "clusters" / "planted.py").write_text('import importlib\n\nCLI = importlib.import_module("gpufleet.cli")\nTOOLS = __import__("tools")\n')
    assert upward_imports(tmp_path, order) == [
        "clusters/planted.py:3: clusters imports gpufleet (a higher layer)",
        "clusters/planted.py:4: clusters imports tools (a higher layer)",
    ]
