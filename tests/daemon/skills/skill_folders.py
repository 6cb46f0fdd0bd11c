"""Skill folders for the skills tests: an operator's skill directory inside a workspace, and a
second one outside it holding a skill of the name salvor ships."""

from __future__ import annotations

import os
from pathlib import Path

TIDES = "Tide tables for the harbour, when to sail out & when to come back."


def skill(directory: Path, name: str, description: str, body: str = "") -> Path:
    """A skill folder ``name`` in ``directory``; its SKILL.md's path."""
    folder = directory / name
    folder.mkdir(parents=True)
    text = f"---\nname: {name}\ndescription: {description}\n---\n{body}"
    (folder / "SKILL.md").write_text(text)
    return folder / "SKILL.md"


def workspace_with_skills(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(the workspace, its skill directory ``skills/``, a directory of the operator's outside
    it). ``tide-tables`` has a topic file and a link out of its folder to ``secret.txt``;
    ``other`` is a skill no agent declares; the outside directory holds a ``salvor-authoring``
    of the operator's own."""
    root = tmp_path / "ws"
    (root / "docs").mkdir(parents=True)
    (root / "readme.md").write_text("# Workspace\n")
    (root / "docs" / "guide.md").write_text("a guide\n")
    skills = root / "skills"
    skill(skills, "tide-tables", TIDES, "See ports.md for each port.\n")
    (skills / "tide-tables" / "ports.md").write_text("Falmouth: high water 06:10\n")
    (tmp_path / "secret.txt").write_text("outside\n")
    os.symlink(tmp_path / "secret.txt", skills / "tide-tables" / "escape.md")
    skill(skills, "other", "Another skill nobody declared.")
    outside = tmp_path / "operator-skills"
    skill(outside, "salvor-authoring", "The operator's own notes on writing agents.")
    return root, skills, outside
