"""Loops of imports between the modules of one package.

A loop is read from every relative import a module makes, wherever it stands: at the top, in a
function's body, or under ``if TYPE_CHECKING:``. Each of those names the other module, so a loop
through any of them is still two modules that cannot be read, or changed, one without the other.
"""

from __future__ import annotations

import ast
from pathlib import Path


def sibling_imports(package: Path) -> dict[str, set[str]]:
    """Each module of ``package`` (its ``*.py`` files but the front door) -> the modules of
    ``package`` it imports."""
    names = {path.stem for path in package.glob("*.py")}
    found: dict[str, set[str]] = {}
    for path in sorted(package.glob("*.py")):
        if path.name == "__init__.py":
            continue
        imported = found.setdefault(path.stem, set())
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom) or node.level != 1:
                continue
            if node.module:
                imported.add(node.module.split(".")[0])
            else:
                imported.update(alias.name for alias in node.names)
        imported &= names - {"__init__", path.stem}
    return found


def import_loop(package: Path) -> list[str]:
    """One loop of imports among ``package``'s modules, each importing the next and the last the
    first again (``["_a", "_b", "_a"]``), or ``[]`` when they import one way."""
    graph = sibling_imports(package)
    done: set[str] = set()
    path: list[str] = []

    def visit(name: str) -> list[str]:
        if name in path:
            return [*path[path.index(name) :], name]
        if name in done:
            return []
        path.append(name)
        for other in sorted(graph.get(name, ())):
            if loop := visit(other):
                return loop
        path.pop()
        done.add(name)
        return []

    for name in sorted(graph):
        if loop := visit(name):
            return loop
    return []
