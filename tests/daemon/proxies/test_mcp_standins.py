"""MCP stand-ins for process agents: real agents on the ``mcp`` SDK, real MCP
servers, recorded in the run's log.

The agent is a script built on the ``mcp`` SDK client (its model the scripted provider,
reached through the daemon's proxy in the OpenAI chat format by a plain POST; the ``openai`` SDK
agents are ``tests/daemon/agents/test_process_agent``'s), which spawns ``$SALVOR_MCP_SERVER_FIX``
(stdio) or dials ``$SALVOR_MCP_URL_FIX`` (streamable HTTP). The real server
is the fixture server: its ledger counts each tool execution and its start
records each process it ran, so a test proves what was executed, and that a
re-run started nothing.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from salvor.daemon.agents._definition import DefinitionError, parse_definition
from salvor.daemon.proxies._mcp_endpoint import serve_mcp
from salvor.daemon.recording._run_context import DriveInterrupted
from salvor.protocol import encode_envelope

from tests.support.backends import SQLITE_ONLY
from tests.support.mcp_servers import (
    NPM_SERVERS_INSTALL,
    HttpFixtureServer,
    everything_server,
    time_server,
)
from tests.support.scripted_provider import tool_loop_script

# SQLite alone (tests/support/backends.py): what it tests is the MCP stand-ins' recording and
# replay.
STORE_BACKENDS = SQLITE_ONLY

AGENT = r"""
import asyncio, json, os, shlex, signal, sys, urllib.request
from pathlib import Path

from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client


try:
    from mcp.client.streamable_http import streamable_http_client
except ImportError:  # the SDK's older name
    from mcp.client.streamable_http import streamablehttp_client as streamable_http_client

transport = sys.argv[1]
server = os.environ.get("SERVER", "FIX")
die_after = int(os.environ.get("DIE_AFTER", "0"))
marker = Path(os.environ.get("MARKER", "/nonexistent/marker"))
suffix = os.environ.get("NOTE_SUFFIX", "")


def die_now():
    marker.write_text("died")
    os.kill(os.getpid(), signal.SIGKILL)


# The model is reached as an OpenAI client reaches it, at the proxy's $OPENAI_BASE_URL with its
# $OPENAI_API_KEY, by a plain POST: the openai SDK would cost half a second of imports at every
# agent start, and the SDK agents are tests/daemon/agents/test_process_agent's subject.
_no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def complete(messages, tools=None):
    body = {"model": "scripted-model", "messages": messages}
    if tools is not None:
        body["tools"] = tools
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={
            "Content-Type": "application/json",
            "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
        },
    )
    with _no_proxy.open(request, timeout=600) as response:
        return json.loads(response.read())["choices"][0]["message"]


async def main():
    if transport == "none":
        complete([{"role": "user", "content": "hi"}])
        return
    if transport == "stdio":
        argv = shlex.split(os.environ[f"SALVOR_MCP_SERVER_{server}"])
        opened = stdio_client(StdioServerParameters(command=argv[0], args=argv[1:]))
    else:
        Path("dialed").write_text(os.environ[f"SALVOR_MCP_URL_{server}"])
        opened = streamable_http_client(os.environ[f"SALVOR_MCP_URL_{server}"])
    async with opened as streams:

        async def heard(params):
            with open("heard.jsonl", "a") as f:
                f.write(json.dumps(params.data) + "\n")

        async def sample(context, params):
            with open("asked.jsonl", "a") as f:
                f.write(
                    json.dumps(
                        {
                            "max_tokens": params.maxTokens
                            if hasattr(params, "maxTokens")
                            else params.max_tokens
                        }
                    )
                    + "\n"
                )
            return types.CreateMessageResult(
                role="assistant",
                model="agent-model",
                content=types.TextContent(type="text", text="sampled by the agent"),
            )

        async with ClientSession(
            streams[0], streams[1], logging_callback=heard, sampling_callback=sample
        ) as mcp:
            await mcp.initialize()
            listed = await mcp.list_tools()
            tools = [
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description or "",
                        "parameters": getattr(t, "input_schema", None) or t.inputSchema,
                    },
                }
                for t in listed.tools
            ]
            messages = [{"role": "user", "content": os.environ["SALVOR_PROMPT"]}]
            done = 0
            while True:
                message = complete(messages, tools)
                calls = message.get("tool_calls") or []
                if not calls:
                    print(message.get("content"))
                    return
                messages.append(
                    {
                        "role": "assistant",
                        "content": message.get("content"),
                        "tool_calls": [
                            {
                                "id": c["id"],
                                "type": "function",
                                "function": {
                                    "name": c["function"]["name"],
                                    "arguments": c["function"]["arguments"],
                                },
                            }
                            for c in calls
                        ],
                    }
                )
                for c in calls:
                    name = c["function"]["name"]
                    arguments = json.loads(c["function"]["arguments"] or "{}")
                    if "text" in arguments:
                        arguments["text"] += suffix + "x" * int(os.environ.get("PAD_BYTES", "0"))
                    if os.environ.get("DIE_IN") == name and not marker.exists():
                        asyncio.get_running_loop().call_later(
                            float(os.environ["DIE_DELAY"]), die_now
                        )
                    if os.environ.get("SKIP_TOOLS"):
                        messages.append(
                            {"role": "tool", "tool_call_id": c["id"], "content": "skipped"}
                        )
                        continue
                    try:
                        result = await mcp.call_tool(name, arguments)
                    except (
                        Exception
                    ) as exc:  # a JSON-RPC error: the model reads it, as a tool error
                        with open("errors.jsonl", "a") as f:
                            f.write(json.dumps(str(exc)) + "\n")
                        messages.append(
                            {"role": "tool", "tool_call_id": c["id"], "content": f"error: {exc}"}
                        )
                        continue
                    done += 1
                    if die_after and done == die_after and not marker.exists():
                        die_now()
                    text = "".join(b.text for b in result.content if b.type == "text")
                    messages.append({"role": "tool", "tool_call_id": c["id"], "content": text})


asyncio.run(main())
"""

PLAN = [
    ("lookup", {"key": "a"}),
    ("write_note", {"text": "hi"}),
    ("lookup", {"key": "b"}),
    ("delete_everything", {}),
]


EFFECTS = 'effects = { lookup = "read", write_note = "write" }\n'
RESULTS = "results = { delete_everything = { deleted = 0 } }\n"


def standin_agent(
    tmp_path: Path,
    server: str,
    *,
    transport: str = "stdio",
    env: dict | None = None,
    server_extra: str = "",
    effects: str = EFFECTS,
    results: str = RESULTS,
):
    script = tmp_path / "mcp_agent.py"
    script.write_text(AGENT)
    env_table = "".join(f"{k} = {json.dumps(v)}\n" for k, v in (env or {}).items())
    text = (
        'name = "mcp-proc"\nkind = "process"\ncommand = '
        f"{json.dumps([sys.executable, str(script), transport])}\n"
        f"cwd = {json.dumps(str(tmp_path))}\ntimeout = 60\n"
        f'[[mcp_servers]]\nname = "fix"\n{server}'
        f"{effects}"
        f"{results}{server_extra}"
        f"[env]\n{env_table}"
    )
    return parse_definition(text, "toml")


async def lane(runtime, run_id: str) -> list[tuple[str, object]]:
    """The run's MCP exchanges, in order: (tool, input)."""
    return [
        (env.event.tool, env.event.input)
        for env in await runtime.reads.log(run_id)
        if env.kind == "ToolCallRequested"
    ]


def lane_shape(calls) -> list[str]:
    return [
        tool if tool != "mcp:fix/tools/call" else f"call:{tool_input['name']}"
        for tool, tool_input in calls
    ]


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


def test_port_belongs_to_a_url_server_and_names_share_no_variable(tmp_path):
    with pytest.raises(DefinitionError, match="`port` belongs to a `url` server"):
        standin_agent(tmp_path, 'command = "x"\n', server_extra="port = 8931\n")
    agent = standin_agent(
        tmp_path, 'url = "http://127.0.0.1:1/mcp"\n', server_extra="port = 8931\n"
    )
    assert agent.mcp_servers[0].port == 8931
    text = (
        'name = "p"\nkind = "process"\ncommand = "x"\n[[mcp_servers]]\nname = "a-b"\n'
        'command = "y"\n[[mcp_servers]]\nname = "a_b"\ncommand = "z"\n'
    )
    with pytest.raises(DefinitionError, match="SALVOR_MCP_SERVER_A_B"):
        parse_definition(text, "toml")


async def test_a_json_rpc_batch_is_a_named_400():
    sent = []

    async def receive():
        return {
            "type": "http.request",
            "body": b'[{"jsonrpc":"2.0","id":1,"method":"ping"}]',
            "more_body": False,
        }

    async def send(message):
        sent.append(message)

    await serve_mcp({"fix": object()}, "fix", {"method": "POST", "headers": []}, receive, send)
    assert sent[0]["status"] == 400
    body = json.loads(sent[1]["body"])
    assert body["error"]["code"] == -32600 and "batches" in body["error"]["message"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def test_a_url_server_with_a_fixed_port_is_stood_in_there(
    runtime, providers, upstream_env, tmp_path, fx
):
    server = HttpFixtureServer(fx)
    try:
        provider = providers(tool_loop_script(PLAN))
        upstream_env(provider)
        port = _free_port()
        agent = standin_agent(
            tmp_path, f'url = "{server.url}"\n', transport="http", server_extra=f"port = {port}\n"
        )
        run_id = await runtime.starts.start_run(agent, "tidy up")
        view = await runtime.drive(run_id, agent=agent)
        assert view.state.value == "completed", view.detail
        assert [c["tool"] for c in fx.ledger] == ["lookup", "write_note", "lookup"]
        # The agent dialed the fixed port, not the capability path.
        assert (tmp_path / "dialed").read_text() == f"http://127.0.0.1:{port}/mcp"
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", port))
            taken.listen()
            second = await runtime.starts.start_run(agent, "again")
            with pytest.raises(
                DriveInterrupted, match=f"could not listen on its fixed port {port}"
            ):
                await runtime.drive(second, agent=agent)
    finally:
        server.stop()


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


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_server_notifications_reach_the_agent_live_and_again_on_a_rerun(
    runtime, providers, upstream_env, tmp_path, fx, transport
):
    provider = providers(tool_loop_script(PLAN))
    upstream_env(provider)
    agent = standin_agent(
        tmp_path, f"command = {fx.toml_command('--notify')}\n", transport=transport
    )
    origin = await runtime.starts.start_run(agent, "tidy up")
    assert (await runtime.drive(origin, agent=agent)).state.value == "completed"
    heard = tmp_path / "heard.jsonl"
    live = heard.read_text().splitlines()
    # One per executed call (the stubbed one never reached the server), each before its answer.
    assert live == ['"calling lookup"', '"calling write_note"', '"calling lookup"']
    outputs = [
        env.event.output
        for env in await runtime.reads.log(origin)
        if env.kind == "ToolCallCompleted"
    ]
    assert [n["after"] for o in outputs for n in o.get("notifications", [])] == [2, 3, 4]
    heard.unlink()
    rerun = await runtime.starts.start_run(agent, None, replay_of=origin)
    assert (await runtime.drive(rerun, agent=agent)).state.value == "completed"
    assert heard.read_text().splitlines() == live
    assert len(fx.starts) == 1


async def test_a_second_push_stream_is_a_409():
    class Open:
        def open_push(self):
            return None  # one is open already

    class Busy:
        name = "fix"
        agent = Open()

    sent = []

    async def send(message):
        sent.append(message)

    await serve_mcp({"fix": Busy()}, "fix", {"method": "GET", "headers": []}, None, send)
    assert sent[0]["status"] == 409
    assert "already open" in json.loads(sent[1]["body"])["error"]["message"]


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


def test_the_relay_answers_each_request_under_its_own_id_when_the_daemon_is_gone(tmp_path):
    request = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": "lookup", "arguments": {}},
    }
    relay = tmp_path / "FIX"
    relay.write_text(f"http://127.0.0.1:{_free_port()}/r/cap/mcp/fix\n")  # nobody listens there
    done = subprocess.run(
        [sys.executable, "-m", "salvor.daemon.standin", str(relay)],
        check=True,
        input=json.dumps(request).encode() + b"\n",
        capture_output=True,
        timeout=30,
    )
    answer = json.loads(done.stdout)
    assert answer["id"] == 7 and "could not reach the daemon" in answer["error"]["message"]


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


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_a_server_request_is_relayed_to_the_agent_live_and_asked_again_on_a_rerun(
    runtime, providers, upstream_env, tmp_path, fx, transport
):
    provider = providers(tool_loop_script([("ask_client", {})], final_text="asked"))
    upstream_env(provider)
    agent = standin_agent(tmp_path, f"command = {fx.toml_command()}\n", transport=transport)
    origin = await runtime.starts.start_run(agent, "ask")
    view = await runtime.drive(origin, agent=agent)
    assert view.state.value == "completed", view.detail
    log = await runtime.reads.log(origin)
    (intent,) = [
        e.seq
        for e in log
        if e.kind == "ToolCallRequested" and e.event.input.get("name") == "ask_client"
    ]
    (output,) = [
        e.event.output for e in log if e.kind == "ToolCallCompleted" and e.event.seq == intent
    ]
    # The server got the agent's own answer, and the exchange is recorded with the call.
    assert "sampled by the agent" in json.dumps(output["result"])
    (asked,) = output["server_requests"]
    assert asked["request"]["method"] == "sampling/createMessage" and asked["after"] == 2
    assert asked["answer"]["result"]["model"] == "agent-model"
    assert len((tmp_path / "asked.jsonl").read_text().splitlines()) == 1
    rerun = await runtime.starts.start_run(agent, None, replay_of=origin)
    view = await runtime.drive(rerun, agent=agent)
    assert view.state.value == "completed", view.detail
    assert (
        len((tmp_path / "asked.jsonl").read_text().splitlines()) == 2
    )  # asked again, with no server
    assert len(fx.starts) == 1 and len(fx.ledger) == 1


RAW_HTTP_AGENT = r"""
import json, os
from pathlib import Path

import httpx
import openai

url = os.environ["SALVOR_MCP_URL_FIX"]
headers = {
    "Authorization": "Bearer agent-secret-7f3a",
    "Accept": "application/json, text/event-stream",
}


def rpc(client, message, session=None):
    sent = {**headers, **({"Mcp-Session-Id": session} if session else {})}
    return client.post(url, json={"jsonrpc": "2.0", **message}, headers=sent)


with httpx.Client(timeout=30) as client:
    opened = rpc(
        client,
        {
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": os.environ.get("PROTOCOL_VERSION", "2025-06-18"),
                "capabilities": json.loads(os.environ.get("CAPABILITIES", "{}")),
                "clientInfo": {"name": "raw", "version": os.environ.get("CLIENT_VERSION", "1")},
            },
        },
    )
    session = opened.headers["mcp-session-id"]
    rpc(client, {"method": "notifications/initialized"}, session)
    answer = rpc(
        client,
        {"id": 2, "method": "tools/call", "params": {"name": "lookup", "arguments": {"key": "a"}}},
        session,
    )
    Path("session.txt").write_text(session)
    Path("answer.txt").write_text(answer.text)
reply = openai.OpenAI(max_retries=0).chat.completions.create(
    model="scripted-model", messages=[{"role": "user", "content": os.environ["SALVOR_PROMPT"]}]
)
print(reply.choices[0].message.content)
"""


def raw_agent(tmp_path: Path, server_url: str, env: dict | None = None):
    """A process agent speaking MCP to ``$SALVOR_MCP_URL_FIX`` by hand (``RAW_HTTP_AGENT``)."""
    script = tmp_path / "raw_agent.py"
    script.write_text(RAW_HTTP_AGENT)
    env_table = "".join(f"{k} = {json.dumps(v)}\n" for k, v in (env or {}).items())
    return parse_definition(
        'name = "raw"\nkind = "process"\ncommand = '
        f"{json.dumps([sys.executable, str(script)])}\n"
        f"cwd = {json.dumps(str(tmp_path))}\ntimeout = 60\n"
        f'[[mcp_servers]]\nname = "fix"\nurl = "{server_url}"\n'
        f'effects = {{ lookup = "read" }}\n[env]\n{env_table}',
        "toml",
    )


async def test_the_agents_authorization_reaches_the_real_server_and_neither_it_nor_a_session_id_is_stored(  # noqa: E501 -- the name is the test's id
    runtime, providers, upstream_env, tmp_path, fx
):
    server = HttpFixtureServer(fx)
    try:
        upstream_env(providers(tool_loop_script([], final_text="looked")))
        agent = raw_agent(tmp_path, server.url)
        run_id = await runtime.starts.start_run(agent, "look it up")
        view = await runtime.drive(run_id, agent=agent)
        assert view.state.value == "completed", view.detail
    finally:
        server.stop()
    assert "value of a" in (tmp_path / "answer.txt").read_text()
    (call,) = [r for r in fx.http_requests if r["method"] == "tools/call"]
    assert call["authorization"] == "Bearer agent-secret-7f3a" and call["session"]
    recorded = json.dumps([encode_envelope(e) for e in await runtime.reads.log(run_id)])
    assert "agent-secret-7f3a" not in recorded
    assert (tmp_path / "session.txt").read_text() not in recorded
    assert call["session"] not in recorded


async def test_the_session_id_is_the_servers_live_and_a_constant_in_replay_and_never_matched(
    runtime, providers, upstream_env, tmp_path, fx
):
    server = HttpFixtureServer(fx)
    try:
        provider = providers(tool_loop_script([], final_text="looked"))
        upstream_env(provider)
        agent = raw_agent(tmp_path, server.url)
        origin = await runtime.starts.start_run(agent, "look it up")
        assert (await runtime.drive(origin, agent=agent)).state.value == "completed"
    finally:
        server.stop()
    # Live, the agent holds the real server's session, and presents it back.
    (call,) = [r for r in fx.http_requests if r["method"] == "tools/call"]
    assert (tmp_path / "session.txt").read_text() == call["session"]
    live_answer = (tmp_path / "answer.txt").read_text()

    # Answered from the log, it holds salvor's constant one; the server is gone, and a
    # session id unlike the recorded exchange's is no divergence.
    rerun = await runtime.starts.start_run(agent, None, replay_of=origin)
    view = await runtime.drive(rerun, agent=agent)
    assert view.state.value == "completed", view.detail
    assert (tmp_path / "session.txt").read_text() == "salvor-replay"
    assert json.loads((tmp_path / "answer.txt").read_text()) == json.loads(live_answer)
    assert len(fx.ledger) == 1


async def test_a_replayed_initialize_matches_its_protocol_version_and_nothing_else_of_it(
    runtime, providers, upstream_env, tmp_path, fx
):
    server = HttpFixtureServer(fx)
    try:
        upstream_env(providers(tool_loop_script([], final_text="looked")))
        origin = await runtime.starts.start_run(raw_agent(tmp_path, server.url), "look it up")
        view = await runtime.drive(origin, agent=raw_agent(tmp_path, server.url))
        assert view.state.value == "completed", view.detail
    finally:
        server.stop()

    # Another client release (its clientInfo, its capabilities) replays as recorded.
    patched = raw_agent(
        tmp_path,
        server.url,
        env={"CLIENT_VERSION": "1.0.1", "CAPABILITIES": '{"roots": {"listChanged": true}}'},
    )
    rerun = await runtime.starts.start_run(patched, None, replay_of=origin)
    view = await runtime.drive(rerun, agent=patched)
    assert view.state.value == "completed", view.detail

    # Another protocol version is another conversation: the re-run fails at the initialize.
    older = raw_agent(tmp_path, server.url, env={"PROTOCOL_VERSION": "2025-03-26"})
    rerun = await runtime.starts.start_run(older, None, replay_of=origin)
    view = await runtime.drive(rerun, agent=older)
    assert view.state.value == "failed"
    error = view.detail["error"]
    assert "MCP server 'fix'" in error and "call 1" in error, error
    assert '`params.protocolVersion`: the agent sent "2025-03-26" where the log records ' in error
    assert len(fx.ledger) == 1
