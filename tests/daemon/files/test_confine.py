"""The file tools' confinement, held at the instant of the open: a path checked inside the
workspace and then swapped for a link out (its last component, or a folder on the way) is
refused, never followed; and the access globs, segment by segment."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from salvor.daemon.files import FileAccess
from salvor.daemon.files._confine import Confinement
from salvor.daemon.tools import ToolFailed, Workspace


@pytest.fixture
def places(tmp_path: Path) -> tuple[Confinement, Path, Path]:
    root, outside = tmp_path / "ws", tmp_path / "outside"
    (root / "notes").mkdir(parents=True)
    outside.mkdir()
    (root / "notes" / "a.txt").write_text("inside\n")
    (outside / "a.txt").write_text("outside\n")
    access = FileAccess.parse({"write": ["**"]})
    return Confinement(Workspace(root=str(root)), access), root, outside


def test_a_file_swapped_for_a_link_after_the_check_is_not_followed(places) -> None:
    confined, root, outside = places
    target = confined.readable("notes/a.txt")
    (root / "notes" / "a.txt").unlink()
    os.symlink(outside / "a.txt", root / "notes" / "a.txt")
    with pytest.raises(ToolFailed, match="cannot be opened"):
        confined.read_bytes(target)


def test_a_folder_swapped_for_a_link_after_the_check_is_refused_at_the_open(places) -> None:
    confined, root, outside = places
    target = confined.writable("notes/a.txt")
    os.rename(root / "notes", root / "kept")
    os.symlink(outside, root / "notes")
    with pytest.raises(ToolFailed, match="changed while it was opened"):
        confined.read_bytes(target)
    with pytest.raises(ToolFailed):
        confined.replace(target, b"clobbered\n")
    assert (outside / "a.txt").read_text() == "outside\n"
    assert sorted(os.listdir(outside)) == ["a.txt"]


def test_a_replace_is_whole_and_keeps_the_mode(places) -> None:
    confined, root, _ = places
    path = root / "notes" / "a.txt"
    path.chmod(0o640)
    confined.replace(confined.writable("notes/a.txt"), b"new\n")
    assert path.read_bytes() == b"new\n" and (path.stat().st_mode & 0o777) == 0o640
    assert sorted(os.listdir(root / "notes")) == ["a.txt"]  # no temporary file left


@pytest.mark.parametrize(
    ("globs", "path", "readable"),
    [
        (["**"], "a/b/c.md", True),
        (["docs/**"], "docs/x/y.md", True),
        (["docs/**"], "docs", False),
        (["docs/**"], "docsx/y.md", False),
        (["*.md"], "top.md", True),
        (["*.md"], "sub/top.md", False),
        (["**/*.md"], "top.md", True),
        (["**/*.md"], "a/b/top.md", True),
        (["a/**/z.txt"], "a/z.txt", True),
        (["a/**/z.txt"], "a/b/c/z.txt", True),
        (["file?.[ch]"], "file1.c", True),
        (["file?.[!ch]"], "file1.c", False),
    ],
)
def test_read_globs(globs, path, readable) -> None:
    assert FileAccess.parse({"read": globs}).may_read(path) is readable


@pytest.mark.parametrize(
    ("globs", "folder", "looks"),
    [
        (["docs/**"], "", True),
        (["docs/**"], "docs", True),
        (["docs/**"], "notes", False),
        (["docs/deep/*.md"], "docs", True),
        (["docs/deep/*.md"], "docs/deep/deeper", False),
        (["**/*.md"], "any/where", True),
    ],
)
def test_folders_a_search_may_look_in(globs, folder, looks) -> None:
    assert FileAccess.parse({"read": globs}).may_look_in(folder) is looks


@pytest.mark.parametrize(
    "raw",
    [
        {"read": ["../up/**"]},
        {"write": ["/etc/**"]},
        {"write": ["a//b"]},
        {"write": "notes/**"},
        {"exec": ["**"]},
        ["**"],
    ],
)
def test_access_that_could_leave_the_workspace_or_is_malformed_is_refused(raw) -> None:
    with pytest.raises(ValueError, match="access"):
        FileAccess.parse(raw)


def test_by_default_an_agent_reads_everything_and_writes_nothing() -> None:
    access = FileAccess.parse({})
    assert access.may_read("any/file.txt") and not access.may_write("any/file.txt")
