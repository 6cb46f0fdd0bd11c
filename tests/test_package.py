"""The wheel people install holds the whole source tree, and every module of it imports from there.

Milestone 2's wheel left two sub-packages out (a hand-kept package list) and every test stayed
green, because the suite runs an editable install. These tests build the wheel the way ``pip
install .`` does, from a copy of the checkout, and look inside it: the file list against the tree,
then an interpreter that sees the unpacked wheel and the test environment's dependencies but not
the checkout (``-S`` skips the editable install's path hook) imports every module.
"""

from __future__ import annotations

import email.parser
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import salvor

from .test_bootstrap import PYPI_PIP, pypi_reachable

REPO = Path(__file__).resolve().parent.parent
# The source folders and the import names pyproject.toml maps them to.
ROOTS = {
    "salvor_ns": "salvor",
    "protocol": "salvor/protocol",
    "store": "salvor/store",
    "daemon": "salvor/daemon",
}
# What a checkout has that a wheel must not ship.
NOT_SHIPPED = {"__pycache__"}

pytestmark = pytest.mark.skipif(
    not pypi_reachable(), reason=f"building a wheel fetches setuptools from PyPI ({PYPI_PIP})"
)


def tree_files() -> set[str]:
    """Every file of the source folders, named as the wheel names it."""
    files = set()
    for folder, target in ROOTS.items():
        for path in (REPO / folder).rglob("*"):
            inside = path.relative_to(REPO / folder)
            if path.is_file() and not NOT_SHIPPED.intersection(inside.parts):
                files.add(f"{target}/{inside.as_posix()}")
    return files


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built as ``pip install .`` builds one, from a copy of the checkout."""
    scratch = tmp_path_factory.mktemp("wheel")
    checkout = scratch / "checkout"
    checkout.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, checkout / name)
    for folder in ROOTS:
        shutil.copytree(
            REPO / folder, checkout / folder, ignore=shutil.ignore_patterns(*NOT_SHIPPED)
        )
    out = scratch / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), "."],
        cwd=checkout,
        check=True,
        capture_output=True,
        timeout=600,
    )
    (built,) = out.glob("salvor-*.whl")
    return built


def test_the_wheel_holds_every_file_of_the_tree_and_nothing_else(wheel):
    with zipfile.ZipFile(wheel) as archive:
        shipped = {name for name in archive.namelist() if ".dist-info/" not in name}
    assert "salvor/daemon/flows/__init__.py" in shipped  # the package milestone 2 left out
    assert "salvor/daemon/dashboard/static/index.html" in shipped  # the page's files are data
    assert sorted(tree_files() - shipped) == [], "in the tree, not in the wheel"
    assert sorted(shipped - tree_files()) == [], "in the wheel, not in the tree"


def test_the_wheel_says_the_version_the_package_and_its_command_say(wheel):
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        headers = email.parser.Parser().parsestr(archive.read(metadata).decode())
        licenses = [n for n in archive.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
        assert archive.read(licenses[0]) == (REPO / "LICENSE").read_bytes()
    assert headers["Version"] == salvor.__version__
    assert headers["License-Expression"] == "Apache-2.0"
    assert wheel.name.startswith(f"salvor-{salvor.__version__}-")


def test_every_module_of_the_tree_imports_from_the_unpacked_wheel(wheel, tmp_path):
    unpacked = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(unpacked)
    modules = sorted(
        name.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        for name in tree_files()
        if name.endswith(".py")
    )
    check = (
        "import importlib, importlib.util, json, sys\n"
        "where = {}\n"
        "for name in json.loads(sys.argv[1]):\n"
        "    if name.endswith('.__main__'):  # importing one runs its command: found, not run\n"
        "        where[name] = importlib.util.find_spec(name).origin\n"
        "    else:\n"
        "        where[name] = importlib.import_module(name).__file__\n"
        "print(json.dumps(where))\n"
    )
    dependencies = sysconfig.get_paths()["purelib"]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(unpacked), dependencies])}
    result = subprocess.run(
        [sys.executable, "-S", "-c", check, json.dumps(modules)],
        check=False,
        cwd=tmp_path,  # not the checkout, whose folders must not be what is imported
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    where = json.loads(result.stdout)
    assert len(where) == len(modules) > 150
    outside = {name: path for name, path in where.items() if not path.startswith(str(unpacked))}
    assert outside == {}, "imported from somewhere other than the wheel"
    version = subprocess.run(
        [sys.executable, "-S", "-m", "salvor.daemon.cli", "--version"],
        check=False,
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert version.stdout == f"salvor {salvor.__version__}\n", version.stderr
