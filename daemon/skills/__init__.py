"""Skills: folders of instructions an agent reads on demand, found in the operator's skill
directories and in those shipped with salvor, and the block that advertises them to a model.

Rule: imports no other daemon package; reads files, knows no runs.
"""

from __future__ import annotations

from ._advert import advertisement, with_skills
from ._library import (
    SHIPPED_SKILLS,
    SKILL_FILE,
    SKILL_NAME,
    SKILLS_DIRS_VAR,
    Skill,
    SkillLibrary,
    SkillMissing,
    skills_dirs_from_env,
)

__all__ = [
    "SHIPPED_SKILLS",
    "SKILLS_DIRS_VAR",
    "SKILL_FILE",
    "SKILL_NAME",
    "Skill",
    "SkillLibrary",
    "SkillMissing",
    "advertisement",
    "skills_dirs_from_env",
    "with_skills",
]
