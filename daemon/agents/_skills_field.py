"""A definition's ``skills``: the skills an agent declares, each a name the daemon's skill
directories resolve, and what declaring one grants: ``read``, reaching the skills' folders (and,
on a daemon with a workspace, the workspace as its ``access`` says). The other file tools an
agent names still need the workspace.

Only names are kept in the definition (and its hash): which folder a name resolves to is the
daemon's, decided when a run starts (``_skill_calls``), never by whoever sent the definition.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial
from typing import Any

from ..skills import SKILL_NAME, SkillLibrary, SkillMissing
from ._definition_error import DefinitionError
from ._definition_rules import expect

# The tool another implementation might offer for skills; here a skill's files are read with
# `read`, so naming it is a mistake worth a sentence of its own.
SKILL_READ = "skill_read"
_NAME = re.compile(SKILL_NAME)


def _names(raw: dict) -> Any:
    return raw.get("skills", [])


def skills_of(raw: dict, library: SkillLibrary | None, stored: bool = False) -> tuple[str, ...]:
    """``skills``: each a skill name, listed once, that ``library`` resolves (not checked when
    ``library`` is None or the definition is the daemon's stored copy: its runs say whether
    the name still resolves).

    Raises:
        DefinitionError: ``at`` the field or the entry.
    """
    names = _names(raw)
    _check_list(names)
    chosen: list[str] = []
    for index, name in enumerate(names):
        chosen.append(_skill(name, index, chosen, None if stored else library))
    return tuple(chosen)


def skill_checks(raw: dict, library: SkillLibrary | None) -> list[Callable[[], object]]:
    """``skills_of``'s checks one entry at a time, for the diagnostics."""
    names = _names(raw)
    if not isinstance(names, list):
        return [partial(_check_list, names)]
    return [
        partial(_skill, name, index, [n for n in names[:index] if isinstance(n, str)], library)
        for index, name in enumerate(names)
    ]


def _check_list(names: Any) -> None:
    expect(isinstance(names, list), "`skills` must be an array of skill names", ("skills",))


def _skill(name: Any, index: int, earlier: list[str], library: SkillLibrary | None) -> str:
    at = ("skills", index)
    expect(
        isinstance(name, str) and _NAME.match(name) is not None,
        f"`skills` holds {name!r}, which is not a skill name (a folder's name: letters, digits, "
        "`-` and `_`, at most 64 characters)",
        at,
    )
    expect(name not in earlier, f"skill {name!r} is listed twice", at)
    if library is not None:
        try:
            library.find(name)
        except SkillMissing as exc:
            raise DefinitionError(str(exc), at=at, suggestion=exc.suggestion) from None
    return name


def granted(tools: list[str], skills: tuple[str, ...]) -> list[str]:
    """The agent's tools with ``read`` added when it declares skills and did not name it."""
    return [*tools, "read"] if skills and "read" not in tools else tools


def refuse_skill_read(tool_name: str, at: tuple) -> None:
    expect(
        tool_name != SKILL_READ,
        f"there is no {SKILL_READ!r} tool: declare the skill in `skills` and the agent reads its "
        "files with `read` (granted with the skills)",
        at,
    )
