"""A real write through a stand-in:
``@modelcontextprotocol/server-filesystem`` on a temporary directory.

The agent is the stand-in suite's (``mcp`` SDK client). It writes a file
(``write_file``, declared a write), calls ``move_file`` (which the
definition answers itself, so the server never runs it) and lists the
directory. The filesystem is the evidence: the written file is there with
its content; the move never happened, live or on a re-run; and once the
agent has been killed after the write and a person has removed the file,
recovery answers the write from the log and never writes it again.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from salvor.daemon.recording._run_context import DriveInterrupted

from tests.support.backends import SQLITE_ONLY
from tests.support.mcp_servers import NPM_SERVERS_INSTALL, filesystem_server
from tests.support.mcp_standin_agents import lane, lane_shape, standin_agent
from tests.support.scripted_provider import tool_loop_script

# SQLite alone (tests/support/backends.py): what it tests is a real filesystem MCP server through
# a stand-in.
STORE_BACKENDS = SQLITE_ONLY

pytestmark = pytest.mark.skipif(
    filesystem_server() is None,
    reason=(
        f"mcp-server-filesystem is not installed; .ci/run installs it with: {NPM_SERVERS_INSTALL}"
    ),
)

EFFECTS = 'effects = { write_file = "write", list_directory = "read" }\n'
# Shaped as the server's own output schema for move_file, which the SDK client checks.
RESULTS = 'results = { move_file = { content = "salvor answered move_file: nothing was moved" } }\n'


def filesystem_agent(
    tmp_path: Path,
    sandbox: Path,
    *,
    transport: str = "stdio",
    env: dict | None = None,
    command: str | None = None,
):
    command = command or filesystem_server()
    return standin_agent(
        tmp_path,
        f"command = {json.dumps([command, str(sandbox)])}\n",
        transport=transport,
        env=env,
        effects=EFFECTS,
        results=RESULTS,
    )


@pytest.fixture
def sandbox(tmp_path: Path) -> Path:
    directory = tmp_path / "sandbox"
    directory.mkdir()
    return directory.resolve()


def plan_for(sandbox: Path) -> list:
    note, elsewhere = sandbox / "note.txt", sandbox / "moved.txt"
    return [
        ("write_file", {"path": str(note), "content": "first draft"}),
        ("move_file", {"source": str(note), "destination": str(elsewhere)}),
        ("list_directory", {"path": str(sandbox)}),
    ]


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_a_write_file_lands_once_and_a_stubbed_move_never_runs(
    runtime, providers, upstream_env, tmp_path, sandbox, transport
):
    provider = providers(tool_loop_script(plan_for(sandbox), final_text="filed"))
    upstream_env(provider)
    agent = filesystem_agent(tmp_path, sandbox, transport=transport)
    origin = await runtime.starts.start_run(agent, "file the note")
    view = await runtime.drive(origin, agent=agent)
    assert view.state.value == "completed", view.detail
    assert (sandbox / "note.txt").read_text() == "first draft"
    assert not (sandbox / "moved.txt").exists()
    assert not (tmp_path / "errors.jsonl").exists()
    calls = await lane(runtime, origin)
    assert lane_shape(calls)[-3:] == ["call:write_file", "call:move_file", "call:list_directory"]
    effects = {
        e.event.input.get("name"): e.event.effect
        for e in await runtime.reads.log(origin)
        if e.kind == "ToolCallRequested" and e.event.tool == "mcp:fix/tools/call"
    }
    assert effects == {"write_file": "write", "move_file": "read", "list_directory": "read"}
    listed = [
        e.event.output for e in await runtime.reads.log(origin) if e.kind == "ToolCallCompleted"
    ][-1]
    assert "note.txt" in json.dumps(listed) and "moved.txt" not in json.dumps(listed)

    # A re-run with the server unstartable and the file gone: nothing is written, nothing moved.
    (sandbox / "note.txt").unlink()
    missing = filesystem_agent(
        tmp_path, sandbox, transport=transport, command="/nonexistent/mcp-server-filesystem"
    )
    rerun = await runtime.starts.start_run(missing, None, replay_of=origin)
    view = await runtime.drive(rerun, agent=missing)
    assert view.state.value == "completed", view.detail
    assert list(sandbox.iterdir()) == []


async def test_a_killed_agent_recovers_without_writing_the_file_again(
    runtime, providers, upstream_env, tmp_path, sandbox
):
    provider = providers(tool_loop_script(plan_for(sandbox), final_text="filed"))
    upstream_env(provider)
    # The agent is SIGKILLed as soon as its write has been answered.
    agent = filesystem_agent(
        tmp_path, sandbox, env={"DIE_AFTER": "1", "MARKER": str(tmp_path / "died")}
    )
    run_id = await runtime.starts.start_run(agent, "file the note")
    with pytest.raises(DriveInterrupted, match="killed by signal 9"):
        await runtime.drive(run_id, agent=agent)
    assert (sandbox / "note.txt").read_text() == "first draft"
    assert not [
        e
        for e in await runtime.reads.log(run_id)
        if e.kind == "ToolCallRequested"
        and e.event.input.get("name") in ("move_file", "list_directory")
    ]
    # A person removes the file: only a second execution of the recorded write could bring it back.
    (sandbox / "note.txt").unlink()

    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "completed", view.detail
    assert list(sandbox.iterdir()) == []
    log = await runtime.reads.log(run_id)
    writes = [
        e
        for e in log
        if e.kind == "ToolCallRequested" and e.event.input.get("name") == "write_file"
    ]
    assert len(writes) == 1
    assert not (tmp_path / "errors.jsonl").exists()  # every call was answered as the agent expected
    # The listing ran live after recovery, and saw the directory as the person left it.
    listed = [e.event.output for e in log if e.kind == "ToolCallCompleted"][-1]
    assert "note.txt" not in json.dumps(listed)
