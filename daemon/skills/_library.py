"""Where a skill is found: the operator's skill directories first, in the order given, then the
skills shipped with salvor; the first directory holding a folder of the skill's name wins.

A skill is a folder holding ``SKILL.md`` (YAML front matter with ``description``, and ``name``
which, when given, must be the folder's name) and any topic files it names. A skill's name is its
folder's name. Every path is resolved (links and ``..`` followed) once here, so what is advertised
and what the file tools allow are the same real folder.

Synchronous and reading files: a caller on the trio thread runs these on a worker thread.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from salvor.protocol import MalformedYaml, load_yaml, nearest

SKILL_FILE = "SKILL.md"
SHIPPED_SKILLS = str(Path(__file__).resolve().parent / "shipped")
# A skill's name is a folder's name: no separator, no `..`, nothing a shell or a prompt misreads.
SKILL_NAME = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
_NAME = re.compile(SKILL_NAME)
MAX_DESCRIPTION_CHARS = 1024
# The most of a SKILL.md read to find its front matter.
_HEAD_BYTES = 64 * 1024
# The variable that names the skill directories of a local `salvor run` or `salvor graph run`.
SKILLS_DIRS_VAR = "SALVOR_SKILLS_DIRS"


class SkillMissing(ValueError):
    """A skill that resolves nowhere, or whose folder is not a skill; ``suggestion``: the nearest
    known skill's name, when one is near."""

    def __init__(self, message: str, suggestion: str | None = None) -> None:
        super().__init__(message)
        self.suggestion = suggestion


@dataclass(frozen=True, slots=True)
class Skill:
    """A resolved skill: ``location`` is the absolute real path of its ``SKILL.md``."""

    name: str
    description: str
    location: str

    @property
    def folder(self) -> str:
        return os.path.dirname(self.location)

    def advertised(self) -> dict[str, str]:
        return {"name": self.name, "description": self.description, "location": self.location}

    @classmethod
    def of(cls, entry: Mapping) -> Skill:
        return cls(entry["name"], entry["description"], entry["location"])


def skills_dirs_from_env(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The skill directories ``SALVOR_SKILLS_DIRS`` names (``os.pathsep``-separated)."""
    value = environ.get(SKILLS_DIRS_VAR, "")
    return tuple(part for part in value.split(os.pathsep) if part)


def _front_matter(path: str, name: str) -> dict:
    with open(path, "rb") as file:
        head = file.read(_HEAD_BYTES).decode("utf-8", errors="replace")
    lines = head.replace("\r\n", "\n").split("\n")
    if not lines or lines[0].rstrip() != "---":
        raise SkillMissing(f"the skill {name!r} has a {SKILL_FILE} without front matter")
    closing = next((i for i in range(1, len(lines)) if lines[i].rstrip() == "---"), None)
    if closing is None:
        raise SkillMissing(f"the front matter of the skill {name!r}'s {SKILL_FILE} is not closed")
    try:
        value = load_yaml("\n".join(lines[1:closing]), f"the front matter of the skill {name!r}")
    except MalformedYaml as exc:
        raise SkillMissing(exc.message) from None
    if not isinstance(value, dict):
        raise SkillMissing(f"the front matter of the skill {name!r} is not a table of keys")
    return value


def _read_skill(folder: str, name: str) -> Skill:
    """The skill in ``folder`` (resolved), its front matter checked.

    Raises:
        SkillMissing: its SKILL.md leads out of its folder, or its front matter does not say
            what a skill must.
    """
    real = os.path.realpath(folder)
    location = os.path.realpath(os.path.join(real, SKILL_FILE))
    if os.path.dirname(location) != real:
        raise SkillMissing(f"the skill {name!r}'s {SKILL_FILE} is a link out of its folder")
    try:
        front = _front_matter(location, name)
    except OSError as exc:
        raise SkillMissing(f"the skill {name!r} cannot be read: {exc.strerror}") from None
    declared = front.get("name", name)
    if declared != name:
        raise SkillMissing(
            f"the skill folder {name!r} names itself {declared!r} in its {SKILL_FILE}; a skill's "
            "name is its folder's"
        )
    description = front.get("description")
    if not isinstance(description, str) or not description.strip():
        raise SkillMissing(f"the skill {name!r} has no `description` in its front matter")
    if len(description) > MAX_DESCRIPTION_CHARS:
        raise SkillMissing(
            f"the skill {name!r}'s description is longer than {MAX_DESCRIPTION_CHARS} characters"
        )
    return Skill(name, " ".join(description.split()), location)


@dataclass(frozen=True, slots=True)
class SkillLibrary:
    """The directories skills are found in, searched in order: the operator's, then salvor's."""

    operator_dirs: tuple[str, ...] = ()
    shipped: str | None = SHIPPED_SKILLS

    @property
    def dirs(self) -> tuple[str, ...]:
        return (*self.operator_dirs, *((self.shipped,) if self.shipped is not None else ()))

    def names(self) -> list[str]:
        """Every skill name some directory holds a folder with a SKILL.md for."""
        found: set[str] = set()
        for directory in self.dirs:
            try:
                entries = os.listdir(directory)
            except OSError:
                continue
            found.update(
                entry
                for entry in entries
                if _NAME.match(entry) and os.path.isfile(os.path.join(directory, entry, SKILL_FILE))
            )
        return sorted(found)

    def find(self, name: str) -> Skill:
        """The skill ``name`` from the first directory that holds it.

        Raises:
            SkillMissing: no directory holds it (with the nearest known name), or its folder is
                not a skill.
        """
        if _NAME.match(name):
            for directory in self.dirs:
                folder = os.path.join(directory, name)
                if os.path.isfile(os.path.join(folder, SKILL_FILE)):
                    return _read_skill(folder, name)
        near = nearest(name, self.names())
        hint = f" (did you mean `{near}`?)" if near else ""
        raise SkillMissing(
            f"unknown skill {name!r}{hint}; a skill is a folder holding {SKILL_FILE} in the "
            "operator's skill directories (salvor serve --skills-dir; SALVOR_SKILLS_DIRS for a "
            "local run) or among salvor's own",
            near,
        )

    def resolve(self, names: Sequence[str]) -> list[Skill]:
        """Each of ``names`` found, in order.

        Raises:
            SkillMissing: the first that resolves nowhere.
        """
        return [self.find(name) for name in names]
