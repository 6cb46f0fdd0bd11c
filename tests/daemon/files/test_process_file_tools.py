"""The file and shell tools of a process agent, through the ``salvor`` MCP server: the agent is
the stand-in suite's script on the real ``mcp`` SDK client, its model the scripted provider, in
a real daemon with a workspace.

Each tool the definition names is listed beside the flow tools and does its work on the folder,
held to the workspace and the agent's ``access`` like a built-in agent's; a write is recorded as
the lane's ``tools/call`` with the write's effect.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from salvor.daemon.tools import Workspace

from tests.daemon.files.test_file_tools import _workspace
from tests.daemon.proxies.test_salvor_server import steps_script, tool_results
from tests.support.backends import SQLITE_ONLY
from tests.support.mcp_standin_agents import AGENT

# SQLite alone: what is new here is the salvor server's offer; the lane's recording is the same
# on both backends (tests/chaos/test_kill_salvor_server).
STORE_BACKENDS = SQLITE_ONLY


def _process_agent(tmp_path: Path, tools: list[str], extra: str = "") -> str:
    script = tmp_path / "mcp_agent.py"
    script.write_text(AGENT)
    tables = "".join(f'[[tools]]\nname = "{tool}"\n' for tool in tools)
    return (
        'name = "clerk"\nkind = "process"\n'
        f"command = {json.dumps([sys.executable, str(script), 'stdio'])}\n"
        f"cwd = {json.dumps(str(tmp_path))}\ntimeout = 60\n"
        f'access = {{ write = ["notes/**"] }}\n{extra}'
        f'{tables}[env]\nSERVER = "SALVOR"\n'
    )


async def test_a_process_agent_calls_the_file_tools_through_the_salvor_server(
    server_factory, providers, tmp_path, monkeypatch
) -> None:
    from tests.daemon.agents.test_process_agent import SECRET

    root = _workspace(tmp_path)
    append = {"path": "notes/log.md", "old_text": "day 1\n", "new_text": "day 1\nday 2\n"}
    provider = providers(
        steps_script(
            lambda _: ("ls", {}),
            lambda _: ("read", {"path": "readme.md"}),
            lambda _: ("write", {"path": "notes/new.md", "content": "by a process\n"}),
            lambda _: ("edit", append),
            lambda _: ("write", {"path": "readme.md", "content": "clobbered\n"}),
            lambda _: ("bash", {"command": "echo ran >> notes/count.txt"}),
            lambda _: "done",
        )
    )
    monkeypatch.setenv("SALVOR_AGENT_UPSTREAM", provider.base_url)
    monkeypatch.setenv("SALVOR_AGENT_KEY", SECRET)
    server = await server_factory(
        allow_process_agents=True, workspace=Workspace(root=str(root), shell=True)
    )
    tools = ["ls", "read", "write", "edit", "bash"]
    agent = await server.register_agent(_process_agent(tmp_path, tools))
    run_id = await server.start_run(agent, "keep the notes")
    body = await server.wait_resting(run_id)
    assert body["status"]["state"] == "completed", body
    listed, read, wrote, edited, refused, shell = tool_results(provider.calls[-1])
    assert listed.split("\n") == ["docs/", "notes/", "readme.md"]
    assert read == "# Workspace\nthe needle is here\n"
    assert json.loads(wrote) == {"path": "notes/new.md", "bytes": 13}
    assert json.loads(edited) == {"path": "notes/log.md", "bytes": 12, "replacements": 1}
    assert "not among the paths this agent may write" in refused, refused
    assert json.loads(shell)["exit_code"] == 0
    assert (root / "notes" / "new.md").read_text() == "by a process\n"
    assert (root / "notes" / "log.md").read_text() == "day 1\nday 2\n"
    assert (root / "readme.md").read_text().startswith("# Workspace")
    assert (root / "notes" / "count.txt").read_text() == "ran\n"
    log = await server.state.runtime.reads.log(run_id)
    calls = [
        (env.event.input["name"], env.event.effect)
        for env in log
        if env.kind == "ToolCallRequested" and env.event.tool == "mcp:salvor/tools/call"
    ]
    assert calls == [
        ("ls", "read"),
        ("read", "read"),
        ("write", "write"),
        ("edit", "write"),
        ("write", "write"),
        ("bash", "write"),
    ]


async def test_a_process_agents_file_tools_need_the_salvor_server_and_a_workspace(
    server_factory, tmp_path
) -> None:
    with_workspace = await server_factory(
        allow_process_agents=True, workspace=Workspace(root=str(_workspace(tmp_path)))
    )
    without = await server_factory(allow_process_agents=True)
    off = _process_agent(tmp_path, ["read"], extra="salvor_mcp = false\n")
    for server, text, said in (
        (with_workspace, off, "salvor_mcp = false"),
        (without, _process_agent(tmp_path, ["read"]), "no workspace"),
    ):
        response = await server.client.post(
            "/v1/agents", content=text, headers={"Content-Type": "application/toml"}
        )
        assert response.status_code == 400, response.text
        assert said in response.json()["error"]["message"], response.text
