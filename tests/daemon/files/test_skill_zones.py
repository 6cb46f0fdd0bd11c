"""The file tools' skill folders, on the confinement itself: a skill folder is read whole
whatever the read globs say, by its absolute path or by a workspace path leading into it, and
never written; a link in a skill folder is held to where it leads (into the workspace: its
globs; anywhere else: refused); a file swapped for a link out after the check is not followed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from salvor.daemon.files import FileAccess
from salvor.daemon.files._confine import Confinement
from salvor.daemon.tools import ToolFailed, Workspace


@pytest.fixture
def places(tmp_path: Path) -> tuple[Confinement, Path, Path]:
    root, skill = tmp_path / "ws", tmp_path / "ws" / "skills" / "tides"
    (root / "docs").mkdir(parents=True)
    skill.mkdir(parents=True)
    (root / "readme.md").write_text("hidden\n")
    (root / "docs" / "a.md").write_text("doc\n")
    (skill / "SKILL.md").write_text("skill\n")
    (tmp_path / "secret.txt").write_text("outside\n")
    os.symlink(root / "readme.md", skill / "to-readme.md")
    os.symlink(root / "docs" / "a.md", skill / "to-doc.md")
    access = FileAccess.parse({"read": ["docs/**"], "write": ["**"]})
    return Confinement(Workspace(root=str(root)), access, (str(skill),)), root, skill


def test_a_skill_folder_is_read_whole_by_either_path_and_written_only_as_the_workspace_says(
    places,
) -> None:
    confined, _, skill = places
    real = os.path.realpath(skill / "SKILL.md")
    for path in (real, "skills/tides/SKILL.md", "skills/tides/../tides/SKILL.md"):
        target = confined.readable(path)
        assert (target.real, target.shown) == (real, real)
    assert confined.folder(str(skill)).shown == os.path.realpath(skill)
    with pytest.raises(ToolFailed, match="not among the paths this agent may read"):
        confined.readable("readme.md")
    # Writes know no skill folder: the workspace's write globs alone decide.
    assert confined.writable("skills/tides/SKILL.md").rel == "skills/tides/SKILL.md"


def test_a_link_in_a_skill_folder_is_held_to_where_it_leads(places, tmp_path: Path) -> None:
    confined, _, skill = places
    assert confined.readable(str(skill / "to-doc.md")).rel == "docs/a.md"
    with pytest.raises(ToolFailed, match="not among the paths this agent may read"):
        confined.readable(str(skill / "to-readme.md"))
    os.symlink(tmp_path / "secret.txt", skill / "out.md")
    with pytest.raises(ToolFailed, match="leads outside the workspace"):
        confined.readable(str(skill / "out.md"))


def test_a_skill_file_swapped_for_a_link_out_after_the_check_is_not_followed(
    places, tmp_path: Path
) -> None:
    confined, _, skill = places
    target = confined.readable(str(skill / "SKILL.md"))
    (skill / "SKILL.md").unlink()
    os.symlink(tmp_path / "secret.txt", skill / "SKILL.md")
    with pytest.raises(ToolFailed, match="cannot be opened"):
        confined.read_bytes(target)


def test_without_a_workspace_only_the_skill_folders_are_read(tmp_path: Path) -> None:
    skill = tmp_path / "tides"
    skill.mkdir()
    (skill / "SKILL.md").write_text("skill\n")
    confined = Confinement(None, FileAccess(), (str(skill),))
    assert confined.read_bytes(confined.readable(str(skill / "SKILL.md")))[0] == b"skill\n"
    with pytest.raises(ToolFailed, match="without a workspace"):
        confined.readable("SKILL.md")
    with pytest.raises(ToolFailed, match="no workspace"):
        confined.writable(str(skill / "SKILL.md"))
