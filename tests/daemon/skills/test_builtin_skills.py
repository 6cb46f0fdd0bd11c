"""Skills on a built-in agent, in a real daemon (``serve``, real HTTP, a real store) with the
operator's skill directories: the scripted provider drives the calls.

An agent declaring skills is told of each in its system prompt (name, description, the absolute
path of its SKILL.md), is granted ``read`` without naming it, and reads its skills' folders
whatever its ``access.read`` globs say; nothing else outside the workspace and its globs, and no
link in a skill folder that leads out of it. A skill that resolves nowhere is a 400 with the
nearest name; the operator's directory wins over salvor's own.
"""

from __future__ import annotations

import os

from salvor.daemon.skills import SHIPPED_SKILLS
from salvor.daemon.tools import Workspace

from tests.daemon.skills.skill_folders import TIDES, workspace_with_skills
from tests.support.api_server import agent_toml
from tests.support.flows import tool_results
from tests.support.scripted_provider import tool_loop_script

SKILLED = 'skills = ["tide-tables", "salvor-authoring"]\naccess = { read = ["docs/**"] }'


async def _run(server, provider, extra: str) -> dict:
    agent = await server.register_agent(agent_toml(provider.base_url, extra=extra))
    run_id = await server.start_run(agent, "when can we sail?")
    body = await server.wait_resting(run_id)
    assert body["status"]["state"] == "completed", body
    return body


async def test_a_skill_is_advertised_and_read_past_the_agents_read_globs(
    server_factory, providers, tmp_path
) -> None:
    root, skills, outside = workspace_with_skills(tmp_path)
    tides = os.path.realpath(skills / "tide-tables" / "SKILL.md")
    ports = os.path.realpath(skills / "tide-tables" / "ports.md")
    plan = [
        ("read", {"path": tides}),
        ("read", {"path": ports}),
        ("read", {"path": "skills/tide-tables/ports.md"}),  # the same file, by the workspace
        ("read", {"path": "docs/guide.md"}),  # within its globs
        ("read", {"path": "readme.md"}),  # in the workspace, outside its globs
        ("read", {"path": "skills/other/SKILL.md"}),  # a skill it did not declare
        ("read", {"path": str(tmp_path / "secret.txt")}),  # outside everything
        ("read", {"path": str(skills / "tide-tables" / "escape.md")}),  # a link out of the skill
        ("ls", {"path": str(skills / "tide-tables")}),
        ("grep", {"pattern": "Falmouth", "path": str(skills / "tide-tables")}),
    ]
    provider = providers(tool_loop_script(plan))
    server = await server_factory(
        workspace=Workspace(root=str(root)), skills_dirs=(str(skills), str(outside))
    )
    await _run(server, provider, SKILLED + '\n[[tools]]\nname = "ls"\n[[tools]]\nname = "grep"')

    first = provider.calls[0].request
    assert first["system"].startswith("You settle refunds.\n\n"), first["system"]
    assert (
        "  <skill>\n    <name>tide-tables</name>\n"
        f"    <description>{TIDES.replace('&', '&amp;')}</description>\n"
        f"    <location>{tides}</location>\n  </skill>"
    ) in first["system"]
    # The operator's directory wins over salvor's own for the same name.
    mine = os.path.realpath(outside / "salvor-authoring" / "SKILL.md")
    assert f"<location>{mine}</location>" in first["system"]
    assert SHIPPED_SKILLS not in first["system"]
    assert "read" in [tool["name"] for tool in first["tools"]]  # granted, never named

    answers = tool_results(provider.calls[-1])
    texts = [answer["content"] for answer in answers]
    assert [bool(answer.get("is_error")) for answer in answers] == [
        False, False, False, False, True, True, True, True, False, False,
    ], texts  # fmt: skip
    assert texts[0].startswith("---\nname: tide-tables\n")
    assert texts[1] == texts[2] == "Falmouth: high water 06:10\n"
    assert texts[3] == "a guide\n"
    assert "not among the paths this agent may read" in texts[4]
    assert "not among the paths this agent may read" in texts[5]
    assert "leads outside the workspace" in texts[6] and "skill folders" in texts[6]
    assert "leads outside the workspace" in texts[7]
    assert texts[8].split("\n") == ["SKILL.md", "escape.md@", "ports.md"]
    assert texts[9] == f"{ports}:1: Falmouth: high water 06:10"


async def test_without_a_workspace_read_reaches_the_skill_folders_alone(
    server_factory, providers, tmp_path
) -> None:
    _, skills, _ = workspace_with_skills(tmp_path)
    tides = os.path.realpath(skills / "tide-tables" / "SKILL.md")
    plan = [
        ("read", {"path": tides}),
        ("read", {"path": "SKILL.md"}),
        ("read", {"path": str(tmp_path / "secret.txt")}),
    ]
    provider = providers(tool_loop_script(plan))
    server = await server_factory(skills_dirs=(str(skills),))
    await _run(server, provider, 'skills = ["tide-tables"]')
    answers = tool_results(provider.calls[-1])
    assert not answers[0].get("is_error") and answers[0]["content"].startswith("---\n")
    assert answers[1]["is_error"] and "without a workspace" in answers[1]["content"]
    assert answers[2]["is_error"] and "not in this agent's skill folders" in answers[2]["content"]
    # The other file tools still need a workspace.
    refused = await server.client.post(
        "/v1/agents",
        content=agent_toml(provider.base_url, tools=["grep"], extra='skills = ["tide-tables"]'),
        headers={"Content-Type": "application/toml"},
    )
    assert refused.status_code == 400 and "no workspace" in refused.text, refused.text


async def test_a_skill_that_resolves_nowhere_is_refused_with_the_nearest_name(
    server_factory, providers, tmp_path
) -> None:
    _, skills, _ = workspace_with_skills(tmp_path)
    provider = providers(tool_loop_script([]))
    server = await server_factory(skills_dirs=(str(skills),))
    for extra, said in (
        ('skills = ["tide-table"]', "unknown skill 'tide-table' (did you mean `tide-tables`?)"),
        ('skills = ["../other"]', "is not a skill name"),
        ('[[tools]]\nname = "skill_read"', "there is no 'skill_read' tool"),
    ):
        response = await server.client.post(
            "/v1/agents",
            content=agent_toml(provider.base_url, extra=extra),
            headers={"Content-Type": "application/toml"},
        )
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["code"] == "bad_request" and said in error["message"], error
    # salvor's own skill resolves with no directory of the operator's.
    plain = await server_factory()
    await plain.register_agent(agent_toml(provider.base_url, extra='skills = ["salvor-authoring"]'))
