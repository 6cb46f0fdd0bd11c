"""The dependency direction: protocol imports only the standard library,
fastjsonschema, pyyaml and re2; store never imports the daemon; and within protocol and within
store, modules import one way."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
import salvor.protocol

from tests.support.import_loops import import_loop

ROOT = Path(__file__).resolve().parents[2]
PROTOCOL_ALLOWED = set(sys.stdlib_module_names) | {"fastjsonschema", "yaml", "re2"}


def imports(path: Path) -> list[tuple[int, str]]:
    """(relative level, module) for every import statement in a file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.extend((0, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.append((node.level, node.module or ""))
            if node.level and not node.module:
                found.extend((node.level, alias.name) for alias in node.names)
    return found


def modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def test_protocol_is_the_installed_package() -> None:
    assert Path(salvor.protocol.__file__).resolve().parent == ROOT / "protocol"
    assert modules("protocol")


@pytest.mark.parametrize("path", modules("protocol"), ids=lambda p: p.name)
def test_protocol_imports_only_the_standard_library_and_its_two_dependencies(path: Path) -> None:
    for level, module in imports(path):
        if level:
            # Relative imports stay inside protocol/.
            assert level == 1, f"{path.name} reaches outside protocol/: {'.' * level}{module}"
            continue
        top = module.split(".")[0]
        assert top in PROTOCOL_ALLOWED, f"{path.name} imports {module}"


def test_store_never_imports_the_daemon() -> None:
    # Passes vacuously while store/ holds no modules.
    for path in modules("store"):
        for level, module in imports(path):
            top = module.split(".")[0]
            reaches_daemon = (
                level == 0 and (top == "daemon" or module.startswith("salvor.daemon"))
            ) or (level == 2 and top == "daemon")
            assert not reaches_daemon, f"{path.name} imports {'.' * level}{module}"


def test_the_import_walker_sees_every_form(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import os, json\nimport trio\nfrom sqlalchemy import text\n"
        "from . import _x\nfrom ._y import z\nfrom ..daemon import app\n"
    )
    assert imports(sample) == [
        (0, "os"),
        (0, "json"),
        (0, "trio"),
        (0, "sqlalchemy"),
        (1, ""),
        (1, "_x"),
        (1, "_y"),
        (2, "daemon"),
    ]


@pytest.mark.parametrize("package", ["protocol", "store"])
def test_the_modules_of_a_package_import_each_other_one_way(package: str) -> None:
    # Under TYPE_CHECKING or inside a function too: either is still a loop of two modules.
    loop = import_loop(ROOT / package)
    assert loop == [], f"{package}: {' -> '.join(loop)} import each other in a loop"
