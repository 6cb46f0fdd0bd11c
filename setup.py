"""The contents of the ``salvor`` distribution, found in the source tree rather than kept by hand.

``pyproject.toml`` holds everything else. Three top-level folders are mapped into the ``salvor``
namespace there (``[tool.setuptools.package-dir]``). Every folder below them that has an
``__init__.py`` is a package of the wheel, and every other file in a package's folder (or in a
folder of it that is not a package, such as the page's ``static/``) is its data, so neither a new
sub-package nor a new page file can be left out. ``tests/test_package.py`` builds the wheel and
checks it holds the whole tree and imports every module from it.
"""

from pathlib import Path

from setuptools import find_packages, setup

# The import name of each top-level folder; the same mapping as pyproject's package-dir.
ROOTS = {
    "salvor": "salvor_ns",
    "salvor.protocol": "protocol",
    "salvor.store": "store",
    "salvor.daemon": "daemon",
}
_NOT_SHIPPED = {"__pycache__"}


def discovered_packages() -> dict[str, Path]:
    """Each package's import name and its folder."""
    packages = {}
    for name, folder in ROOTS.items():
        packages[name] = Path(folder)
        for sub in find_packages(folder):
            packages[f"{name}.{sub}"] = Path(folder, *sub.split("."))
    return packages


def data_files_of(folder: Path) -> list[str]:
    """The files a package's folder holds besides its modules, relative to that folder."""
    found = []
    for path in sorted(folder.rglob("*")):
        inside = path.relative_to(folder)
        if not path.is_file() or _NOT_SHIPPED.intersection(inside.parts):
            continue
        if path.suffix in (".py", ".pyc"):
            continue
        # A file in a sub-package's folder is that package's data, not this one's.
        if any(
            (folder / part_dir).joinpath("__init__.py").is_file() for part_dir in _parents(inside)
        ):
            continue
        found.append(inside.as_posix())
    return found


def _parents(inside: Path) -> list[Path]:
    """The folders between a package's folder and a file in it, outermost first."""
    return [Path(*inside.parts[: i + 1]) for i in range(len(inside.parts) - 1)]


PACKAGES = discovered_packages()
setup(
    packages=list(PACKAGES),
    package_data={
        name: data for name, folder in PACKAGES.items() if (data := data_files_of(folder))
    },
)
