"""Every test the README names exists: a table row saying ``shown by`` a test that was renamed
or never written would tell a reader a behaviour is covered when nothing checks it.

A name is a backticked ``tests/...py`` path, optionally with ``::test_name``; a ``::test_name``
that follows in the same cell belongs to the last path named before it (a table's cells are
apart: the flow tools' table names a built-in and a process agent's test in two cells of a row).
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
_NO_FILE = "(no file named before it)"
_NAMED = re.compile(r"`(tests/[\w/]+\.py)?(?:::(\w+))?`")


def named_tests(readme: str) -> list[tuple[str, str | None]]:
    """Each (file, test or None) the README names, in order."""
    named = []
    for line in readme.splitlines():
        for cell in line.split("|"):
            last = None
            for match in _NAMED.finditer(cell):
                path, test = match.group(1), match.group(2)
                if path is None and test is None:
                    continue
                last = path or last
                # A continuation with no file before it in its cell names nothing that exists.
                named.append((last or _NO_FILE, test))
    return named


def test_every_test_the_readme_names_exists() -> None:
    named = named_tests(README.read_text(encoding="utf-8"))
    assert len(named) > 20, "the README's tables name their tests"
    missing = []
    for path, test in named:
        source = REPO / path
        if not source.is_file():
            missing.append(path)
        elif test is not None and not re.search(
            rf"^(?:async )?def {test}\(", source.read_text(encoding="utf-8"), re.MULTILINE
        ):
            missing.append(f"{path}::{test}")
    assert not missing, "the README names tests that do not exist: " + ", ".join(missing)


def test_a_continuation_belongs_to_the_last_file_named() -> None:
    line = "`tests/a.py::test_x`, `::test_y`, `tests/b.py`"
    assert named_tests(line) == [
        ("tests/a.py", "test_x"),
        ("tests/a.py", "test_y"),
        ("tests/b.py", None),
    ]


def test_a_continuation_never_reaches_into_the_next_cell() -> None:
    row = "| x | `tests/a.py::test_x` | `::test_y` |"
    assert named_tests(row) == [("tests/a.py", "test_x"), (_NO_FILE, "test_y")]
