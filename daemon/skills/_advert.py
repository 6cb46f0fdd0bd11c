"""The block a model is shown of an agent's skills: each one's name, what it is for, and where
its SKILL.md is, appended after the agent's own system prompt.

The block is fixed in form: the same skills give the same bytes, so a recorded model call and
its replay carry the same prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from xml.sax.saxutils import escape

from ._library import Skill

_PREAMBLE = (
    "You have skills: folders of instructions for particular kinds of task. When a task matches "
    "a skill's description, read its SKILL.md at the location given (with the `read` tool), then "
    "any file of its folder that it points you to."
)


def advertisement(skills: Sequence[Skill]) -> str:
    """The skills block; "" when there are none."""
    if not skills:
        return ""
    entries = [
        "  <skill>\n"
        f"    <name>{escape(skill.name)}</name>\n"
        f"    <description>{escape(skill.description)}</description>\n"
        f"    <location>{escape(skill.location)}</location>\n"
        "  </skill>"
        for skill in skills
    ]
    return _PREAMBLE + "\n\n<skills>\n" + "\n".join(entries) + "\n</skills>"


def with_skills(prompt: str | None, skills: Sequence[Skill]) -> str | None:
    """``prompt`` with the skills block after it (a blank line between); the block alone when
    there is no prompt; ``prompt`` unchanged when there are no skills."""
    block = advertisement(skills)
    if not block:
        return prompt
    return f"{prompt}\n\n{block}" if prompt else block
