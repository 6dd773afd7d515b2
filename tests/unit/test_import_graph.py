"""The import graph of schedsim/ and policies/ has no cycle.

Every import counts, at module level or inside a function: a cycle through a function-level
import still ties the two modules together, it only hides it until the call.
"""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("schedsim", "policies")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(tree: ast.AST, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The project modules ``module`` imports anywhere in its source: ``import a.b``, ``from a
    import b`` (``a.b`` when that is a module, else ``a``), relative imports resolved."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[:len(package) - (node.level - 1)]
                base = ".".join(package + ([base] if base else []))
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for name in names:
            # The deepest project module the name stands for (``import a.b.c`` imports a.b.c).
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                out.add(name)
    return out


def import_graph(root: Path = ROOT, packages=PACKAGES) -> dict[str, set[str]]:
    """Module -> the project modules it imports."""
    files = {module_name(p, root): p for pkg in packages for p in sorted((root / pkg).rglob("*.py"))}
    return {module: imported_modules(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)),
                                     module, path.name == "__init__.py", set(files))
            for module, path in files.items()}


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (its modules, the first repeated last), or None."""
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as e:
        return e.args[1]
    return None


def test_the_package_imports_have_no_cycle():
    found = cycle(import_graph())
    assert found is None, "import cycle: " + " -> ".join(found)


def test_a_cycle_through_a_function_level_import_is_found(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import g\n\ndef f():\n    return g()\n")
    (pkg / "b.py").write_text("def g():\n    from pkg import a\n    return a\n")
    (pkg / "c.py").write_text("from . import a\n")
    graph = import_graph(tmp_path, ("pkg",))
    assert graph == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}, "pkg.c": {"pkg.a"}}
    assert sorted(cycle(graph)[1:]) == ["pkg.a", "pkg.b"]
    del graph["pkg.b"]
    assert cycle(graph) is None


@pytest.mark.parametrize("source, expected", [
    ("import pkg.b", {"pkg.b"}),
    ("from pkg import b", {"pkg.b"}),
    ("from pkg.b import name", {"pkg.b"}),
    ("from .b import name", {"pkg.b"}),
    ("import numpy", set()),
])
def test_imports_resolve_to_project_modules(source, expected):
    known = {"pkg", "pkg.a", "pkg.b"}
    assert imported_modules(ast.parse(source), "pkg.a", False, known) == expected
