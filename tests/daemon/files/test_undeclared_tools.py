"""An agent calls only the tools it declared, on both agent kinds, in a real daemon with a
workspace: a built-in agent and a process agent (through the ``salvor`` MCP server, the real
``mcp`` SDK client) that declared ``read`` alone call ``write`` and ``bash`` as well; each such
call is the call's error the model reads, the workspace is left as it was, and no write is
recorded in the run's log.
"""

from __future__ import annotations

from salvor.daemon.tools import Workspace

from tests.daemon.files.test_file_tools import _agent, _workspace
from tests.daemon.files.test_process_file_tools import _process_agent
from tests.daemon.proxies.test_salvor_server import steps_script, tool_results
from tests.support.backends import SQLITE_ONLY

# The lane is the salvor server's, tested on SQLite (tests/support/backends.py).
STORE_BACKENDS = SQLITE_ONLY

PLAN = [
    ("read", {"path": "readme.md"}),
    ("write", {"path": "notes/new.md", "content": "not declared\n"}),
    ("bash", {"command": "echo ran > notes/ran.txt"}),
]


def _script():
    return steps_script(*(lambda _, step=step: step for step in PLAN), lambda _: "done")


async def _told(server, provider, text: str) -> tuple[list[str], list[str]]:
    """What the model was told its calls returned, and the effects the run's log recorded."""
    agent = await server.register_agent(text)
    run_id = await server.start_run(agent, "read, then try more")
    body = await server.wait_resting(run_id)
    assert body["status"]["state"] == "completed", body
    told = tool_results(provider.calls[-1])
    log = await server.state.runtime.reads.log(run_id)
    effects = [env.event.effect for env in log if env.kind == "ToolCallRequested"]
    return told, effects


async def test_both_agent_kinds_are_refused_a_tool_they_did_not_declare(
    server_factory, providers, tmp_path, monkeypatch
) -> None:
    from tests.daemon.agents.test_process_agent import SECRET

    root = _workspace(tmp_path)
    server = await server_factory(
        allow_process_agents=True, workspace=Workspace(root=str(root), shell=True)
    )
    native = providers(_script())
    told, effects = await _told(server, native, _agent(native.base_url, ["read"]))
    assert told[0] == "# Workspace\nthe needle is here\n"
    assert all("there is no tool named" in text for text in told[1:]), told
    assert "write" not in effects

    process = providers(_script())
    monkeypatch.setenv("SALVOR_AGENT_UPSTREAM", process.base_url)
    monkeypatch.setenv("SALVOR_AGENT_KEY", SECRET)
    told, effects = await _told(server, process, _process_agent(tmp_path, ["read"]))
    assert told[0] == "# Workspace\nthe needle is here\n"
    assert "offers no tool 'write'" in told[1] and "offers no tool 'bash'" in told[2], told
    assert "write" not in effects

    assert sorted(path.name for path in (root / "notes").iterdir()) == ["log.md"]
