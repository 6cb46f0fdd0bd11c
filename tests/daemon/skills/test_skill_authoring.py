"""Skills in authoring, over a real store: ``flow_agents write`` reports a skill that resolves
nowhere as a diagnostic on its line with the nearest skill's name, ``skill_read`` among the tools
as one saying to use ``read``, and ``flow_agents list`` answers each agent's skills (a markdown
file's ``skills: a, b`` read as a list)."""

from __future__ import annotations

import pytest
from salvor.daemon.runs import FlowCatalog
from salvor.daemon.skills import SkillLibrary

from tests.daemon.skills.skill_folders import workspace_with_skills

AGENT = """---
name: pilot
description: Takes ships in and out of the harbour.
model: scripted-model
skills: {skills}
tools: {tools}
llm:
  provider: demo
---
You pilot ships.
"""


@pytest.fixture
def host(runtime, tmp_path) -> FlowCatalog:
    _, skills, _ = workspace_with_skills(tmp_path)
    runtime.kit.registry.skills = SkillLibrary((str(skills),))
    return FlowCatalog(runtime.definitions, credentials=runtime.kit.credentials)


async def test_an_unknown_skill_and_skill_read_are_diagnostics_with_what_to_write(host) -> None:
    written = await host.write_agent(
        AGENT.format(skills="tide-tables, tide-tabels", tools="skill_read")
    )
    assert written["written"] is False
    assert written["diagnostics"] == [
        {
            "line": 5,
            "severity": "error",
            "message": "unknown skill 'tide-tabels' (did you mean `tide-tables`?); a skill is a "
            "folder holding SKILL.md in the operator's skill directories (salvor serve "
            "--skills-dir; SALVOR_SKILLS_DIRS for a local run) or among salvor's own",
            "suggestion": "tide-tables",
        },
        {
            "line": 6,
            "severity": "error",
            "message": "there is no 'skill_read' tool: declare the skill in `skills` and the "
            "agent reads its files with `read` (granted with the skills)",
        },
    ]
    assert await host.agent_catalog() == []


async def test_the_catalog_lists_each_agents_skills(host) -> None:
    written = await host.write_agent(
        AGENT.format(skills="tide-tables, salvor-authoring", tools="ask_user")
    )
    assert (written["written"], written["diagnostics"]) == (True, []), written
    (entry,) = await host.agent_catalog()
    assert entry["skills"] == ["tide-tables", "salvor-authoring"]
    assert entry["tools"] == ["read", "ask_user"]  # read comes with the skills
