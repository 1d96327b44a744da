"""No import points up: every project module imports only packages of its own or a lower layer.

The order is the one the README's layout section states (read from it here, so the two cannot
disagree); imports inside functions count too, because a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def layers() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Layout") :]
    match = re.search(r"Layers, bottom to top[^:]*\):\s*(.+?)\.\s", section, re.S)
    assert match, "README's layout section lost its 'Layers, bottom to top' line"
    return re.findall(r"`(\w+)` ?<?", match.group(1).replace("\n", " "))


def imported_packages(path: Path) -> set[tuple[str, int]]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {(alias.name.split(".")[0], node.lineno) for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add((node.module.split(".")[0], node.lineno))
    return found


def upward_imports(root: Path, order: list[str]) -> list[str]:
    rank = {name: i for i, name in enumerate(order)}
    bad = []
    for package in order:
        for path in sorted((root / package).rglob("*.py")):
            for target, line in sorted(imported_packages(path)):
                if target in rank and rank[target] > rank[package]:
                    bad.append(f"{path.relative_to(root)}:{line}: {package} imports {target} (a higher layer)")
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
