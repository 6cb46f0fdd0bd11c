"""The daemon's rooms: every module sits in one sub-package, packages import one way (bottom up,
as ``salvor.daemon.LAYERS`` lists them), only through each other's ``__init__``, and each
``__init__`` re-exports exactly the names it lists in ``__all__``."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest
import salvor.daemon
from salvor.daemon import LAYERS

from tests.support.import_loops import import_loop

DAEMON = Path(salvor.daemon.__file__).resolve().parent
APART = ("standin",)
PACKAGES = sorted(p.name for p in DAEMON.iterdir() if (p / "__init__.py").exists())


def modules(package: str) -> list[Path]:
    return sorted((DAEMON / package).glob("*.py"))


def imports(path: Path) -> list[ast.ImportFrom | ast.Import]:
    return [
        n
        for n in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(n, ast.ImportFrom | ast.Import)
    ]


def test_every_module_lives_in_a_room() -> None:
    loose = sorted(p.name for p in DAEMON.glob("*.py") if p.name != "__init__.py")
    assert loose == []
    assert sorted(LAYERS + APART) == PACKAGES


@pytest.mark.parametrize("package", LAYERS)
def test_a_package_imports_only_the_packages_below_it_through_their_front_door(
    package: str,
) -> None:
    below = set(LAYERS[: LAYERS.index(package)])
    for path in modules(package):
        for node in imports(path):
            where = f"{package}/{path.name}:{node.lineno}"
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
                assert not any(n.startswith("salvor.daemon") for n in names), where
                continue
            if node.level == 0:
                # The daemon reaches its own packages relatively, so the layering is visible here.
                assert not (node.module or "").startswith("salvor.daemon"), (
                    f"{where} imports {node.module}"
                )
            elif node.level == 1:
                # ``__main__`` starts the package through its front door; elsewhere name the module.
                assert node.module or path.name == "__main__.py", (
                    f"{where}: `from . import` hides the module"
                )
            else:
                assert node.level == 2 and node.module, where
                target, _, private = node.module.partition(".")
                assert not private, f"{where} reaches into {node.module}; import it from {target}"
                assert target in below, f"{where}: {package} may not import {target} (not below it)"


@pytest.mark.parametrize("package", LAYERS + APART)
def test_the_modules_of_a_package_import_each_other_one_way(package: str) -> None:
    # A module split in two whose halves still import each other (even only under
    # TYPE_CHECKING, or inside a function) is one module in two files: the lower half names what
    # it uses of the higher by a Protocol, or takes a callable, instead.
    loop = import_loop(DAEMON / package)
    assert loop == [], f"{package}: {' -> '.join(loop)} import each other in a loop"


def test_the_standin_uses_the_standard_library_only() -> None:
    for path in modules("standin"):
        for node in imports(path):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
            )
            assert not getattr(node, "level", 0)
            for name in names:
                assert name.split(".")[0] in sys.stdlib_module_names or name == "__future__", name


@pytest.mark.parametrize("package", LAYERS)
def test_each_front_door_states_its_rule_and_exports_exactly_what_it_lists(package: str) -> None:
    init = DAEMON / package / "__init__.py"
    tree = ast.parse(init.read_text())
    doc = ast.get_docstring(tree) or ""
    assert "Rule:" in doc, f"{package}/__init__.py should open with its rule"
    imported = {
        a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names
    }
    imported.discard("annotations")
    # A front door may also define a name that loads its module on first use (web's listener).
    imported |= {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    module = importlib.import_module(f"salvor.daemon.{package}")
    assert sorted(module.__all__) == sorted(imported), f"{package}: __all__ and its imports differ"
    for name in module.__all__:
        assert getattr(module, name, None) is not None, f"{package}.{name} does not resolve"


def test_every_name_a_package_takes_from_another_is_exported() -> None:
    for package in LAYERS:
        for path in modules(package):
            for node in imports(path):
                if isinstance(node, ast.ImportFrom) and node.level == 2 and node.module:
                    exported = importlib.import_module(f"salvor.daemon.{node.module}").__all__
                    for alias in node.names:
                        assert alias.name in exported, (
                            f"{package}/{path.name} takes {alias.name} from {node.module}"
                        )


def test_route_handlers_talk_to_the_runtime_never_to_the_store_behind_it() -> None:
    for path in modules("api"):
        text = path.read_text()
        assert "access.store" not in text, (
            f"api/{path.name} reaches through the Runtime to its store"
        )


# A route factory that outgrows this holds more than one resource's routes: split it by resource.
LONGEST_FUNCTION = 100


def test_no_api_module_names_the_store_access() -> None:
    # Handlers reach the store only through the services (the Runtime, ClientRuns), so the
    # services decide what is read and written; `.access` is the writer thread behind them.
    for path in modules("api"):
        tree = ast.parse(path.read_text(), str(path))
        named = [
            n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "access"
        ]
        assert named == [], f"api/{path.name} names `.access` at lines {named}"


def test_no_api_function_runs_over_a_hundred_lines() -> None:
    # Every function is measured whole: a route factory's nested handlers count inside it.
    for path in modules("api"):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno
                assert length <= LONGEST_FUNCTION, (
                    f"api/{path.name}:{node.lineno} {node.name} runs {length} lines "
                    f"(at most {LONGEST_FUNCTION})"
                )


def test_the_command_line_loads_no_web_framework_until_it_serves() -> None:
    # A `salvor run`, `resume` or `resolve` is a process started for one run: Quart (with Flask,
    # Werkzeug and Jinja behind it) is the HTTP API's, imported only by `salvor serve`.
    probe = (
        "import sys, salvor.daemon.cli; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'quart', 'quart_trio', 'flask'}))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert loaded.stdout.strip() == "[]", loaded.stdout


def test_the_command_line_loads_no_listener_and_no_postgresql_dialect_until_it_needs_them() -> None:
    # Every `salvor` command pays for what it imports: hypercorn's protocol stack (~90 ms) is a
    # listener's alone, and SQLAlchemy's PostgreSQL dialect (~60 ms) a PostgreSQL store's.
    probe = (
        "import sys, salvor.daemon.cli; print(sorted(m for m in sys.modules if m in "
        "{'hypercorn', 'h2', 'wsproto', 'salvor.daemon.web._listener', "
        "'sqlalchemy.dialects.postgresql'}))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert loaded.stdout.strip() == "[]", loaded.stdout
