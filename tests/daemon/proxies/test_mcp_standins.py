"""MCP stand-ins for process agents: real agents on the ``mcp`` SDK, real MCP
servers, recorded in the run's log, and recovered or replayed from it.

The agent is a script built on the ``mcp`` SDK client (``tests/support/mcp_standin_agents.py``;
the ``openai`` SDK agents are ``tests/daemon/agents/test_process_agent``'s), which spawns
``$SALVOR_MCP_SERVER_FIX`` (stdio) or dials ``$SALVOR_MCP_URL_FIX`` (streamable HTTP). The real
server is the fixture server: its ledger counts each tool execution and its start
records each process it ran, so a test proves what was executed, and that a
re-run started nothing. How a stand-in is reached, what a server sends its agent, and a session
spoken by hand have modules of their own (``test_mcp_standin_transport``,
``test_mcp_standin_server_messages``, ``test_mcp_standin_sessions``).
"""

from __future__ import annotations

import json

import pytest
from salvor.daemon.recording._run_context import DriveInterrupted

from tests.support.backends import SQLITE_ONLY
from tests.support.mcp_servers import (
    NPM_SERVERS_INSTALL,
    HttpFixtureServer,
    everything_server,
    time_server,
)
from tests.support.mcp_standin_agents import PLAN, lane, lane_shape, standin_agent
from tests.support.scripted_provider import tool_loop_script

# SQLite alone (tests/support/backends.py): what it tests is the MCP stand-ins' recording and
# replay.
STORE_BACKENDS = SQLITE_ONLY


EXPECTED = [
    "mcp:fix/initialize",
    "mcp:fix/tools/list",
    "call:lookup",
    "call:write_note",
    "call:lookup",
    "call:delete_everything",
]


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_a_process_agent_records_its_mcp_calls_and_a_rerun_starts_no_server(
    runtime, providers, upstream_env, tmp_path, fx, transport
):
    provider = providers(tool_loop_script(PLAN, final_text="all done"))
    upstream_env(provider)
    agent = standin_agent(tmp_path, f"command = {fx.toml_command()}\n", transport=transport)
    origin = await runtime.starts.start_run(agent, "tidy up")
    view = await runtime.drive(origin, agent=agent)
    assert view.state.value == "completed", view.detail
    assert view.detail["output"]["reply"] == "all done"
    assert lane_shape(await lane(runtime, origin)) == EXPECTED
    effects = [
        env.event.effect
        for env in await runtime.reads.log(origin)
        if env.kind == "ToolCallRequested"
    ]
    assert effects == ["read", "read", "read", "write", "read", "read"]
    # The stubbed destructive tool was answered by salvor; the server never ran it.
    assert [c["tool"] for c in fx.ledger] == ["lookup", "write_note", "lookup"]
    assert len(fx.starts) == 1
    served = provider.call_count

    rerun = await runtime.starts.start_run(agent, None, replay_of=origin)
    view = await runtime.drive(rerun, agent=agent)
    assert view.state.value == "completed", view.detail
    assert lane_shape(await lane(runtime, rerun)) == EXPECTED
    assert len(fx.starts) == 1 and len(fx.ledger) == 3  # no server was started, nothing executed
    assert provider.call_count == served


async def test_a_killed_agent_recovers_without_running_a_completed_call_twice(
    runtime, providers, upstream_env, tmp_path, fx
):
    provider = providers(tool_loop_script(PLAN))
    upstream_env(provider)
    env = {"DIE_AFTER": "2", "MARKER": str(tmp_path / "died")}
    agent = standin_agent(tmp_path, f"command = {fx.toml_command()}\n", env=env)
    run_id = await runtime.starts.start_run(agent, "tidy up")
    with pytest.raises(DriveInterrupted, match="killed by signal 9"):
        await runtime.drive(run_id, agent=agent)
    assert [c["tool"] for c in fx.ledger] == ["lookup", "write_note"]
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "completed", view.detail
    # The recorded prefix came from the log; the server was started again
    # (initialised silently) only for the first live call.
    assert [c["tool"] for c in fx.ledger] == ["lookup", "write_note", "lookup"]
    assert len(fx.starts) == 2
    assert lane_shape(await lane(runtime, run_id)) == EXPECTED
    assert sorted(provider.count_by_request_hash().values()) == [1, 1, 1, 1, 1]


async def test_an_mcp_write_cut_off_mid_call_parks_the_run(
    runtime, providers, upstream_env, tmp_path, fx
):
    plan = [("write_note", {"text": "hi", "hold": fx.hold("w")})]
    provider = providers(tool_loop_script(plan))
    upstream_env(provider)
    env = {"DIE_IN": "write_note", "DIE_DELAY": "1.0", "MARKER": str(tmp_path / "died")}
    agent = standin_agent(tmp_path, f"command = {fx.toml_command()}\n", env=env)
    run_id = await runtime.starts.start_run(agent, "note it")
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "needs_reconciliation", view.detail
    assert view.pending.tool == "mcp:fix/tools/call" and view.pending.input["name"] == "write_note"
    # A later drive starts nothing: a person must say what happened.
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "needs_reconciliation"
    assert len(fx.starts) == 1 and [c["tool"] for c in fx.ledger] == ["write_note"]


async def test_an_open_mcp_read_is_executed_again(runtime, providers, upstream_env, tmp_path, fx):
    plan = [("lookup", {"key": "a", "hold": fx.hold("r")})]
    provider = providers(tool_loop_script(plan))
    upstream_env(provider)
    env = {"DIE_IN": "lookup", "DIE_DELAY": "1.0", "MARKER": str(tmp_path / "died")}
    agent = standin_agent(tmp_path, f"command = {fx.toml_command()}\n", env=env)
    run_id = await runtime.starts.start_run(agent, "look")
    with pytest.raises(DriveInterrupted):
        await runtime.drive(run_id, agent=agent)
    view = await runtime.reads.view(run_id)
    assert view.state.value == "awaiting_tool" and view.pending.effect == "read"
    fx.release("r")
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "completed", view.detail
    assert [c["tool"] for c in fx.ledger] == ["lookup", "lookup"]  # the open read, executed again


async def test_a_recovered_agent_that_skips_its_open_mcp_call_fails_at_its_next_model_call(
    runtime, providers, upstream_env, tmp_path, fx
):
    plan = [("lookup", {"key": "a", "hold": fx.hold("r")})]
    provider = providers(tool_loop_script(plan))
    upstream_env(provider)
    env = {"DIE_IN": "lookup", "DIE_DELAY": "1.0", "MARKER": str(tmp_path / "died")}
    agent = standin_agent(tmp_path, f"command = {fx.toml_command()}\n", env=env)
    run_id = await runtime.starts.start_run(agent, "look")
    with pytest.raises(DriveInterrupted):
        await runtime.drive(run_id, agent=agent)
    skipping = standin_agent(
        tmp_path, f"command = {fx.toml_command()}\n", env={**env, "SKIP_TOOLS": "1"}
    )
    view = await runtime.drive(run_id, agent=skipping)
    assert view.state.value == "failed"
    assert (
        "model call 2: the agent made a new model call while the mcp:fix/tools/call call"
        in view.detail["error"]
    )
    assert provider.call_count == 1


async def test_a_divergent_rerun_fails_naming_the_lane_position_and_path(
    runtime, providers, upstream_env, tmp_path, fx
):
    provider = providers(tool_loop_script(PLAN))
    upstream_env(provider)
    agent = standin_agent(tmp_path, f"command = {fx.toml_command()}\n")
    origin = await runtime.starts.start_run(agent, "tidy up")
    assert (await runtime.drive(origin, agent=agent)).state.value == "completed"
    changed = standin_agent(tmp_path, f"command = {fx.toml_command()}\n", env={"NOTE_SUFFIX": "!"})
    rerun = await runtime.starts.start_run(changed, None, replay_of=origin)
    view = await runtime.drive(rerun, agent=changed)
    assert view.state.value == "failed"
    error = view.detail["error"]
    assert "MCP server 'fix'" in error and "call 4" in error and f"origin run {origin}" in error, (
        error
    )
    assert '`arguments.text`: the agent sent "hi!" where the log records "hi"' in error, error
    assert len(fx.starts) == 1 and len(fx.ledger) == 3


async def test_a_declared_server_never_contacted_fails_naming_the_variable(
    runtime, providers, upstream_env, tmp_path, fx
):
    provider = providers(tool_loop_script([]))
    upstream_env(provider)
    agent = standin_agent(tmp_path, f"command = {fx.toml_command()}\n", transport="none")
    run_id = await runtime.starts.start_run(agent, "hello")
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "failed"
    assert "never contacted salvor's MCP stand-in for 'fix'" in view.detail["error"]
    assert "$SALVOR_MCP_SERVER_FIX" in view.detail["error"]
    assert fx.starts == []


async def test_a_real_http_server_behind_the_stdio_stand_in(
    runtime, providers, upstream_env, tmp_path, fx
):
    server = HttpFixtureServer(fx)
    try:
        provider = providers(tool_loop_script(PLAN))
        upstream_env(provider)
        agent = standin_agent(tmp_path, f'url = "{server.url}"\n')
        run_id = await runtime.starts.start_run(agent, "tidy up")
        view = await runtime.drive(run_id, agent=agent)
        assert view.state.value == "completed", view.detail
        assert [c["tool"] for c in fx.ledger] == ["lookup", "write_note", "lookup"]
    finally:
        server.stop()


@pytest.mark.skipif(time_server() is None, reason="mcp-server-time is not installed")
async def test_mcp_server_time_is_recorded_and_rerun_without_it(
    runtime, providers, upstream_env, tmp_path
):
    plan = [
        (
            "convert_time",
            {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Europe/Paris"},
        )
    ]
    provider = providers(tool_loop_script(plan, final_text="13:00"))
    upstream_env(provider)
    agent = standin_agent(
        tmp_path,
        f"command = {json.dumps([time_server(), '--local-timezone', 'UTC'])}\n",
        server_extra="",
    )
    origin = await runtime.starts.start_run(agent, "convert")
    view = await runtime.drive(origin, agent=agent)
    assert view.state.value == "completed", view.detail
    calls = await lane(runtime, origin)
    assert lane_shape(calls)[-1] == "call:convert_time"
    rerun = await runtime.starts.start_run(agent, None, replay_of=origin)
    # A re-run must not need the server: make it unstartable.
    missing = standin_agent(tmp_path, 'command = ["/nonexistent/mcp-server-time"]\n')
    view = await runtime.drive(rerun, agent=missing)
    assert view.state.value == "completed", view.detail


async def test_a_server_that_dies_mid_write_parks_the_run_and_the_agent_hears_why(
    runtime, providers, upstream_env, tmp_path, fx
):
    provider = providers(tool_loop_script([("crash", {})]))
    upstream_env(provider)
    agent = standin_agent(tmp_path, f"command = {fx.toml_command()}\n")
    run_id = await runtime.starts.start_run(agent, "crash it")
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "needs_reconciliation", view.detail
    assert (
        view.pending.input == {"name": "crash", "arguments": {}} and view.pending.effect == "write"
    )
    assert [c["tool"] for c in fx.ledger] == ["crash"]


async def test_a_server_that_never_answers_a_write_parks_the_run(
    runtime, providers, upstream_env, tmp_path, fx
):
    provider = providers(tool_loop_script([("hang", {})]))
    upstream_env(provider)
    agent = standin_agent(
        tmp_path, f"command = {fx.toml_command()}\n", server_extra="timeout = 1\n"
    )
    run_id = await runtime.starts.start_run(agent, "hang")
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "needs_reconciliation", view.detail
    assert view.pending.input["name"] == "hang"


@pytest.mark.skipif(
    everything_server() is None,
    reason=(
        f"mcp-server-everything is not installed; .ci/run installs it with: {NPM_SERVERS_INSTALL}"
    ),
)
@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_server_everything_through_the_stand_in_and_a_rerun_without_it(
    runtime, providers, upstream_env, tmp_path, transport
):
    provider = providers(tool_loop_script([("echo", {"message": "hello"})], final_text="echoed"))
    upstream_env(provider)
    agent = standin_agent(
        tmp_path, f"command = {json.dumps([everything_server(), 'stdio'])}\n", transport=transport
    )
    origin = await runtime.starts.start_run(agent, "echo")
    view = await runtime.drive(origin, agent=agent)
    assert view.state.value == "completed", view.detail
    outputs = [
        env.event.output
        for env in await runtime.reads.log(origin)
        if env.kind == "ToolCallCompleted"
    ]
    assert "hello" in json.dumps(outputs[-1])
    missing = standin_agent(
        tmp_path, 'command = ["/nonexistent/server-everything"]\n', transport=transport
    )
    rerun = await runtime.starts.start_run(missing, None, replay_of=origin)
    view = await runtime.drive(rerun, agent=missing)
    assert view.state.value == "completed", view.detail
