"""Skills on a process agent, through the ``salvor`` MCP server: the agent is a program on the
real ``mcp`` SDK client (streamable HTTP at ``$SALVOR_MCP_URL_SALVOR``) that puts the server's
``initialize`` instructions in its system prompt, its model the scripted provider, in a real
daemon with a workspace and the operator's skill directory.

The instructions advertise each declared skill (name, description, location), ``read`` is among
the server's tools without being declared, and it reads the skill's folder past the agent's
``access.read`` globs; nothing outside, and no link out of the folder.
"""

from __future__ import annotations

import json
import os
import sys

from salvor.daemon.tools import Workspace

from tests.daemon.proxies.test_salvor_server import steps_script, tool_results
from tests.daemon.skills.skill_folders import workspace_with_skills
from tests.support.backends import SQLITE_ONLY

# SQLite alone: what is new is the salvor server's offer; its lane records on both backends alike.
STORE_BACKENDS = SQLITE_ONLY

AGENT = r"""
import asyncio, json, os, urllib.request

from mcp import ClientSession

try:
    from mcp.client.streamable_http import streamable_http_client
except ImportError:  # the SDK's older name
    from mcp.client.streamable_http import streamablehttp_client as streamable_http_client

_no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def complete(messages, tools):
    body = {"model": "scripted-model", "messages": messages, "tools": tools}
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json",
                 "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]},
    )
    with _no_proxy.open(request, timeout=600) as response:
        return json.loads(response.read())["choices"][0]["message"]


async def main():
    opened = streamable_http_client(os.environ["SALVOR_MCP_URL_SALVOR"])
    async with opened as streams, ClientSession(streams[0], streams[1]) as mcp:
        told = await mcp.initialize()
        listed = await mcp.list_tools()
        tools = [
            {"type": "function", "function": {
                "name": t.name, "description": t.description or "",
                "parameters": getattr(t, "input_schema", None) or t.inputSchema}}
            for t in listed.tools
        ]
        messages = [
            {"role": "system", "content": told.instructions},
            {"role": "user", "content": os.environ["SALVOR_PROMPT"]},
        ]
        while True:
            message = complete(messages, tools)
            calls = message.get("tool_calls") or []
            if not calls:
                print(message.get("content"))
                return
            messages.append({"role": "assistant", "content": message.get("content"),
                             "tool_calls": calls})
            for c in calls:
                result = await mcp.call_tool(
                    c["function"]["name"], json.loads(c["function"]["arguments"] or "{}"))
                text = "".join(b.text for b in result.content if b.type == "text")
                messages.append({"role": "tool", "tool_call_id": c["id"], "content": text})


asyncio.run(main())
"""


async def test_a_process_agent_is_told_of_its_skill_and_reads_it_through_the_salvor_server(
    server_factory, providers, tmp_path, monkeypatch
) -> None:
    from tests.daemon.agents.test_process_agent import SECRET

    root, skills, _ = workspace_with_skills(tmp_path)
    tides = os.path.realpath(skills / "tide-tables" / "SKILL.md")
    ports = os.path.realpath(skills / "tide-tables" / "ports.md")
    provider = providers(
        steps_script(
            lambda _: ("read", {"path": tides}),
            lambda _: ("read", {"path": ports}),
            lambda _: ("read", {"path": "readme.md"}),
            lambda _: ("read", {"path": str(tmp_path / "secret.txt")}),
            lambda _: ("read", {"path": str(skills / "tide-tables" / "escape.md")}),
            lambda _: "done",
        )
    )
    monkeypatch.setenv("SALVOR_AGENT_UPSTREAM", provider.base_url)
    monkeypatch.setenv("SALVOR_AGENT_KEY", SECRET)
    script = tmp_path / "skilled_agent.py"
    script.write_text(AGENT)
    server = await server_factory(
        allow_process_agents=True,
        workspace=Workspace(root=str(root)),
        skills_dirs=(str(skills),),
    )
    agent = await server.register_agent(
        'name = "pilot"\nkind = "process"\n'
        f"command = {json.dumps([sys.executable, str(script)])}\n"
        f"cwd = {json.dumps(str(tmp_path))}\ntimeout = 60\n"
        'skills = ["tide-tables"]\naccess = { read = ["docs/**"] }\n'
    )
    run_id = await server.start_run(agent, "when can we sail?")
    body = await server.wait_resting(run_id)
    assert body["status"]["state"] == "completed", body

    first = provider.calls[0].request
    assert "<name>tide-tables</name>" in first["system"], first["system"]
    assert f"<location>{tides}</location>" in first["system"]
    assert "read" in [tool["name"] for tool in first["tools"]]
    skill, topic, excluded, outside, escape = tool_results(provider.calls[-1])
    assert skill.startswith("---\nname: tide-tables\n"), skill
    assert topic == "Falmouth: high water 06:10\n"
    assert "not among the paths this agent may read" in excluded
    assert "leads outside the workspace" in outside and "skill folders" in outside
    assert "leads outside the workspace" in escape
