"""Built-in agents whose tools are real MCP servers, driven over a real store.

The model is the scripted provider; the tools are real servers: the fixture
server (stdio, and streamable HTTP with JSON or event-stream answers),
``mcp-server-time`` and, when installed, ``@modelcontextprotocol/server-everything``.
The fixture server's ledger counts every execution and its start records
count every process, so "never forwarded" and "no server started" are facts
read from the server side.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta

import pytest
import trio
from salvor.daemon.agents._definition import parse_definition
from salvor.protocol import (
    TOOL_ERROR_KEY,
    TOOL_SLEEP_KEY,
    TOOL_SUSPEND_KEY,
    EventKind,
    RunState,
    format_instant,
)

from tests.daemon.agents.test_loop import assert_log_is_sound, kinds
from tests.support.backends import SQLITE_ONLY
from tests.support.mcp_servers import (
    EVERYTHING_INSTALL,
    EverythingHttpServer,
    FixtureServer,
    HttpFixtureServer,
    SdkHttpServer,
    everything_server,
    time_server,
)
from tests.support.runtime import agent_toml
from tests.support.scripted_provider import tool_loop_script

# SQLite alone (tests/support/backends.py): what it tests is a built-in agent's MCP transports.
STORE_BACKENDS = SQLITE_ONLY

LISTING = "mcp:fx/tools/list"


@pytest.fixture(params=["stdio", "http", "http-sse"])
def transport(request) -> str:
    return request.param


@pytest.fixture
def fx_server(fx: FixtureServer, transport: str):
    """The `[[mcp_servers]]` location lines of the fixture server on the test's transport."""
    if transport == "stdio":
        yield f"command = {fx.toml_command()}\n"
        return
    server = HttpFixtureServer(fx, sse=transport == "http-sse")
    try:
        yield f'url = "{server.url}"\n'
    finally:
        server.stop()


def mcp_agent(provider, registry, servers: str, *, tools=(), extra: str = ""):
    text = agent_toml(provider.base_url, tools=tools, extra=extra) + servers
    return parse_definition(text, "toml", known_tools=registry.names())


def fx_table(location: str, body: str = "", name: str = "fx") -> str:
    return f'\n[[mcp_servers]]\nname = "{name}"\n{location}{body}'


def tool_events(log, tool: str):
    return [
        e.event
        for e in log
        if e.event.KIND is EventKind.TOOL_CALL_REQUESTED and e.event.tool == tool
    ]


def completion_of(log, tool: str):
    seqs = {
        e.seq for e in log if e.event.KIND is EventKind.TOOL_CALL_REQUESTED and e.event.tool == tool
    }
    return [
        e.event.output
        for e in log
        if e.event.KIND is EventKind.TOOL_CALL_COMPLETED and e.event.seq in seqs
    ]


def tool_results_seen(provider) -> list[dict]:
    """The tool_result blocks of the last request the model was sent."""
    messages = provider.calls[-1].request["messages"]
    return [b for m in messages for b in m["content"] if b["type"] == "tool_result"]


async def start_and_drive(runtime, agent, run_input=None):
    run_id = await runtime.starts.start_run(agent, run_input)
    return run_id, await runtime.drive(run_id, agent=agent)


async def test_each_call_is_recorded_with_the_declared_effect(
    runtime, providers, registry, fx, fx_server
):
    plan = [
        ("lookup", {"key": "a"}),
        ("write_note", {"text": "n1"}),
        ("delete_everything", {}),
        ("lookup", {"key": "b"}),
    ]
    provider = providers(tool_loop_script(plan, final_text="all done"))
    agent = mcp_agent(
        provider,
        registry,
        fx_table(fx_server, 'effects = { lookup = "read", write_note = "idempotent" }\n'),
    )
    run_id, view = await start_and_drive(runtime, agent)

    assert view.status() == {"state": "completed", "output": "all done"}
    log = await assert_log_is_sound(runtime, run_id)
    # The listing is a recorded read before the first model call.
    assert kinds(log)[:3] == ["RunStarted", "ToolCallRequested", "ToolCallCompleted"]
    assert log[1].event.tool == LISTING and log[1].event.effect == "read"
    listed = [t["name"] for t in log[2].event.output["tools"]]
    assert (
        listed[:3] == ["lookup", "write_note", "delete_everything"] and len(listed) == 10
    )  # three pages
    effects = {
        e.tool: e.effect
        for e in tool_events(log, "lookup")
        + tool_events(log, "write_note")
        + tool_events(log, "delete_everything")
    }
    # Declared effects are kept; a tool nobody declared (even with a destructive hint) is a write.
    assert effects == {"lookup": "read", "write_note": "idempotent", "delete_everything": "write"}
    assert completion_of(log, "lookup")[0] == {"content": [{"type": "text", "text": "value of a"}]}
    assert [e["tool"] for e in fx.ledger] == ["lookup", "write_note", "delete_everything", "lookup"]
    # An idempotent call carries its recorded key to the server.
    key = tool_events(log, "write_note")[0].idempotency_key
    assert key and fx.calls_of("write_note")[0]["meta"] == {
        "salvor": {"idempotency_key": key, "run_id": run_id}
    }
    # The model was offered the listed tools and read their text.
    offered = [t["name"] for t in provider.calls[0].request["tools"]]
    assert offered == listed
    assert [r["content"] for r in tool_results_seen(provider)] == [
        "value of a",
        "noted n1",
        "delete_everything done",
        "value of b",
    ]
    assert len(fx.starts) == 1  # one session served the whole drive


async def test_a_stubbed_tool_is_answered_by_the_daemon_and_never_forwarded(
    runtime, providers, registry, fx, fx_server
):
    provider = providers(tool_loop_script([("delete_everything", {}), ("lookup", {"key": "k"})]))
    stub = (
        "[mcp_servers.results.delete_everything]\ncontent = [{ type = "
        '"text", text = "deleted (stub)" }]\n'
    )
    agent = mcp_agent(
        provider,
        registry,
        fx_table(fx_server, 'effects = { delete_everything = "write" }\n') + stub,
    )
    run_id, view = await start_and_drive(runtime, agent)

    assert view.state is RunState.COMPLETED
    log = await runtime.reads.log(run_id)
    assert completion_of(log, "delete_everything") == [
        {"content": [{"type": "text", "text": "deleted (stub)"}]}
    ]
    # Answered by the daemon, so safe to answer again: recorded as a read.
    assert tool_events(log, "delete_everything")[0].effect == "read"
    assert [e["tool"] for e in fx.ledger] == ["lookup"]
    assert tool_results_seen(provider)[0]["content"] == "deleted (stub)"


async def test_an_allow_list_limits_what_the_model_is_offered(runtime, providers, registry, fx):
    provider = providers(tool_loop_script([("write_note", {"text": "x"})]))
    agent = mcp_agent(
        provider, registry, fx_table(f"command = {fx.toml_command()}\n", 'tools = ["lookup"]\n')
    )
    _run_id, _view = await start_and_drive(runtime, agent)

    assert [t["name"] for t in provider.calls[0].request["tools"]] == ["lookup"]
    assert tool_results_seen(provider)[0] == {
        "type": "tool_result",
        "tool_use_id": "toolu_0",
        "content": "there is no tool named 'write_note' in this agent",
        "is_error": True,
    }
    assert fx.ledger == []


async def test_a_replay_only_drive_starts_no_server_and_a_live_call_after_it_starts_one(
    runtime, providers, registry, fx, clock
):
    wake_at = format_instant(clock.now + timedelta(hours=1))
    plan = [("park", {"salvor": {"sleep_until": wake_at}}), ("lookup", {"key": "after"})]
    provider = providers(tool_loop_script(plan))
    agent = mcp_agent(
        provider,
        registry,
        fx_table(f"command = {fx.toml_command()}\n", 'effects = { park = "read" }\n'),
    )
    run_id, view = await start_and_drive(runtime, agent)
    assert view.state is RunState.SLEEPING and len(fx.starts) == 1
    # A parked run holds no MCP process: the drive closed its session.
    with pytest.raises(ProcessLookupError):
        os.kill(fx.starts[0]["pid"], 0)
    log = await runtime.reads.log(run_id)
    assert kinds(log)[-3:] == ["ToolCallRequested", "ToolCallCompleted", "SleepStarted"]
    assert completion_of(log, "park") == [{TOOL_SLEEP_KEY: {"wake_at": wake_at}}]

    # Not due: the drive replays listing, model call and tool call from the log.
    view = await runtime.drive(run_id, agent=agent)
    assert view.state is RunState.SLEEPING
    assert len(fx.starts) == 1 and provider.call_count == 1

    clock.advance(3601)
    view = await runtime.drive(run_id, agent=agent)
    assert view.state is RunState.COMPLETED
    # The live lookup needed a session: one new start, initialised before the call.
    assert len(fx.starts) == 2
    assert [e["tool"] for e in fx.ledger] == ["park", "lookup"]
    assert tool_results_seen(provider)[0]["content"] == json.dumps({"slept_until": wake_at})


async def test_meta_salvor_suspend_parks_the_run_until_resumed(
    runtime, providers, registry, fx, fx_server
):
    schema = {
        "type": "object",
        "required": ["approved"],
        "properties": {"approved": {"type": "boolean"}},
    }
    request = {
        "suspend": {"reason": "approve the refund", "input_schema": schema, "kind": "signal"}
    }
    provider = providers(tool_loop_script([("park", {"salvor": request})], final_text="resumed"))
    agent = mcp_agent(provider, registry, fx_table(fx_server))
    run_id, view = await start_and_drive(runtime, agent)

    assert view.state is RunState.SUSPENDED
    assert (
        view.status()["reason"] == "approve the refund" and view.status()["input_schema"] == schema
    )
    log = await runtime.reads.log(run_id)
    assert kinds(log)[-3:] == ["ToolCallRequested", "ToolCallCompleted", "Suspended"]
    assert completion_of(log, "park") == [{TOOL_SUSPEND_KEY: request["suspend"]}]

    decision = await runtime.control.resume(run_id, {"approved": True})
    assert decision.outcome == "driving"
    view = await runtime.drive(run_id, agent=agent)
    assert view.status() == {"state": "completed", "output": "resumed"}
    assert tool_results_seen(provider)[0]["content"] == json.dumps(
        {"approved": True}, sort_keys=True
    )
    assert len(fx.calls_of("park")) == 1


@pytest.mark.parametrize(
    ("salvor", "is_error", "problem"),
    [
        (
            {"suspend": {"reason": "r", "input_schema": {}}, "sleep_until": "2030-01-01T00:00:00Z"},
            False,
            "names both suspend and sleep_until",
        ),
        ({"snooze": "1h"}, False, "uses the key 'snooze'"),
        ({"sleep_until": "tomorrow"}, False, "sleep_until that is not an RFC 3339 instant"),
        ({"sleep_until": "2030-01-01T00:00:00"}, False, "no UTC offset"),
        ({"suspend": {"input_schema": {}}}, False, "without a `reason`"),
        ({"suspend": {"reason": "r"}}, False, "without an `input_schema`"),
        (
            {"suspend": {"reason": "r", "input_schema": {}, "kind": "person"}},
            False,
            'other than "signal"',
        ),
        ("soon", False, "is not an object"),
        ({}, False, "names neither"),
        ({"sleep_until": "2030-01-01T00:00:00Z"}, True, "flagged isError"),
    ],
)
async def test_a_bad_meta_salvor_request_fails_the_call_once_and_never_parks(
    runtime, providers, registry, fx, salvor, is_error, problem
):
    provider = providers(
        tool_loop_script([("park", {"salvor": salvor, "is_error": is_error})], final_text="went on")
    )
    # Declared a read, so only the refusal's own rule keeps it from being retried.
    agent = mcp_agent(
        provider,
        registry,
        fx_table(f"command = {fx.toml_command()}\n", 'effects = { park = "read" }\n'),
    )
    run_id, view = await start_and_drive(runtime, agent)

    assert view.status() == {"state": "completed", "output": "went on"}
    (output,) = completion_of(await runtime.reads.log(run_id), "park")
    error = output[TOOL_ERROR_KEY]
    assert (
        "`_meta.salvor`" in error["message"]
        and problem in error["message"]
        and error["attempts"] == 1
    )
    assert len(fx.calls_of("park")) == 1
    seen = tool_results_seen(provider)[0]
    assert seen["is_error"] is True and "`_meta.salvor`" in seen["content"]


async def test_an_is_error_result_is_recorded_as_it_is_and_shown_as_an_error(
    runtime, providers, registry, fx, fx_server
):
    provider = providers(tool_loop_script([("fail_soft", {})]))
    agent = mcp_agent(provider, registry, fx_table(fx_server))
    run_id, view = await start_and_drive(runtime, agent)

    assert view.state is RunState.COMPLETED
    assert completion_of(await runtime.reads.log(run_id), "fail_soft") == [
        {"content": [{"type": "text", "text": "it went wrong"}], "isError": True}
    ]
    assert tool_results_seen(provider)[0] == {
        "type": "tool_result",
        "tool_use_id": "toolu_0",
        "content": "it went wrong",
        "is_error": True,
    }


@pytest.mark.parametrize("tool", ["crash", "hang", "garbage"])
async def test_a_write_that_gets_no_answer_parks_for_reconciliation(
    runtime, providers, registry, fx, tool
):
    provider = providers(tool_loop_script([(tool, {})]))
    agent = mcp_agent(
        provider, registry, fx_table(f"command = {fx.toml_command()}\n", "timeout = 1\n")
    )
    run_id, view = await start_and_drive(runtime, agent)

    assert view.state is RunState.NEEDS_RECONCILIATION
    assert view.pending.tool == tool and view.pending.kind == "tool"
    log = await runtime.reads.log(run_id)
    assert kinds(log)[-1] == "ToolCallRequested" and log[-1].event.effect == "write"
    assert len(fx.calls_of(tool)) == 1
    assert provider.call_count == 1


@pytest.mark.parametrize(
    ("tool", "said"),
    [
        ("crash", "exited with code 3; its stderr ended with: fixture crashing"),
        ("hang", "did not answer tools/call within 2s"),
        ("garbage", "wrote a line to stdout that is not JSON"),
    ],
)
async def test_a_read_that_gets_no_answer_is_retried_then_recorded_as_failed(
    runtime, providers, registry, fx, tool, said
):
    provider = providers(tool_loop_script([(tool, {})], final_text="coped"))
    # The timeout bounds every request, `initialize` too: short enough that three hung calls
    # take seconds, long enough that a fresh server's start on a loaded machine is inside it (at
    # 0.5 s one was not, and the start it cost was counted as one more).
    agent = mcp_agent(
        provider,
        registry,
        fx_table(
            f"command = {fx.toml_command()}\n", f'timeout = 2\neffects = {{ {tool} = "read" }}\n'
        ),
    )
    run_id, view = await start_and_drive(runtime, agent)

    assert view.status() == {"state": "completed", "output": "coped"}
    (output,) = completion_of(await runtime.reads.log(run_id), tool)
    assert output[TOOL_ERROR_KEY]["attempts"] == 3 and said in output[TOOL_ERROR_KEY]["message"]
    assert len(fx.calls_of(tool)) == 3
    # A dead session is replaced for the next attempt; a slow one is kept.
    assert len(fx.starts) == (3 if tool != "hang" else 1)


async def test_an_oversized_answer_is_refused(runtime, providers, registry, fx):
    provider = providers(tool_loop_script([("big", {"size": 5 * 1024 * 1024})], final_text="coped"))
    agent = mcp_agent(
        provider,
        registry,
        fx_table(f"command = {fx.toml_command()}\n", 'effects = { big = "read" }\n'),
    )
    run_id, view = await start_and_drive(runtime, agent)

    assert view.state is RunState.COMPLETED
    (output,) = completion_of(await runtime.reads.log(run_id), "big")
    assert "over the 4194304-byte cap" in output[TOOL_ERROR_KEY]["message"]


@pytest.mark.parametrize("effect", ["write", "read", "idempotent"])
async def test_an_intent_left_open_by_a_dead_drive(runtime, providers, registry, fx, effect):
    """A drive cut mid-call (its session killed with it): an open write parks, an open read or
    idempotent call runs again."""
    provider = providers(
        tool_loop_script([("write_note", {"text": "held", "hold": fx.hold("w")})], final_text="ok")
    )
    agent = mcp_agent(
        provider,
        registry,
        fx_table(f"command = {fx.toml_command()}\n", f'effects = {{ write_note = "{effect}" }}\n'),
    )
    run_id = await runtime.starts.start_run(agent, None)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(runtime.drive, run_id)
        with trio.fail_after(10):
            while not fx.calls_of("write_note"):
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    view = await runtime.reads.view(run_id)
    fx.release("w")
    if effect == "write":
        assert view.state is RunState.NEEDS_RECONCILIATION
        view = await runtime.drive(run_id, agent=agent)
        assert view.state is RunState.NEEDS_RECONCILIATION
        assert len(fx.starts) == 1 and len(fx.calls_of("write_note")) == 1
    else:
        assert view.state is RunState.AWAITING_TOOL
        view = await runtime.drive(run_id, agent=agent)
        assert view.status() == {"state": "completed", "output": "ok"}
        assert len(fx.starts) == 2 and len(fx.calls_of("write_note")) == 2
        assert provider.call_count == 2
        first, again = fx.calls_of("write_note")
        # An idempotent call runs again under the key its intent recorded.
        assert first["meta"] == again["meta"]
        assert (first["meta"] is not None) == (effect == "idempotent")


async def test_a_listing_that_lost_a_declared_tool_fails_the_run(runtime, providers, registry, fx):
    provider = providers(tool_loop_script([]))
    agent = mcp_agent(
        provider,
        registry,
        fx_table(f"command = {fx.toml_command()}\n", 'effects = { vanished = "read" }\n'),
    )
    _run_id, view = await start_and_drive(runtime, agent)

    assert view.state is RunState.FAILED
    assert "lists no tool 'vanished'" in view.status()["error"]
    assert provider.call_count == 0


async def test_a_server_that_cannot_start_leaves_the_listing_open(
    runtime, providers, registry, tmp_path
):
    provider = providers(tool_loop_script([]))
    agent = mcp_agent(provider, registry, fx_table(f'command = ["{tmp_path}/no-such-server"]\n'))
    run_id = await runtime.starts.start_run(agent, None)
    with pytest.raises(Exception, match="could not be started") as stopped:
        await runtime.drive(run_id, agent=agent)
    assert "salvor resume" in str(stopped.value)
    view = await runtime.reads.view(run_id)
    assert view.state is RunState.AWAITING_TOOL and view.pending.tool == LISTING


# pytest.skip inside a trio test loses its reason; a marker keeps it.
needs_everything = pytest.mark.skipif(
    everything_server() is None,
    reason=f"@modelcontextprotocol/server-everything is not installed: {EVERYTHING_INSTALL}",
)


async def test_mcp_server_time_over_stdio(runtime, providers, registry):
    command = time_server()
    assert command is not None, (
        "mcp-server-time is part of the test extra: pip install -e '.[test]'"
    )
    provider = providers(
        tool_loop_script([("get_current_time", {"timezone": "UTC"})], final_text="told")
    )
    servers = (
        f'\n[[mcp_servers]]\nname = "time"\ncommand = ["{command}"]\neffects = {{ '
        'get_current_time = "read" }\n'
    )
    agent = mcp_agent(provider, registry, servers)
    run_id, view = await start_and_drive(runtime, agent)

    assert view.status() == {"state": "completed", "output": "told"}
    log = await runtime.reads.log(run_id)
    assert [t["name"] for t in log[2].event.output["tools"]] == ["get_current_time", "convert_time"]
    (output,) = completion_of(log, "get_current_time")
    assert output["structuredContent"]["timezone"] == "UTC" and output["isError"] is False
    assert json.loads(tool_results_seen(provider)[0]["content"])["timezone"] == "UTC"


@needs_everything
async def test_server_everything_over_stdio(runtime, providers, registry, monkeypatch):
    monkeypatch.setenv("SALVOR_SECRET_FOR_TEST", "never-handed-to-a-server")
    plan = [
        ("echo", {"message": "hi"}),
        ("get-sum", {"a": 2, "b": 3}),
        ("get-env", {}),
        ("get-tiny-image", {}),
    ]
    provider = providers(tool_loop_script(plan, final_text="ok"))
    servers = (
        '\n[[mcp_servers]]\nname = "everything"\ncommand = ["mcp-server-everything"]\n'
        'env = { EVERYTHING_MARK = "from-the-definition" }\n'
        'effects = { echo = "read", get-sum = "read", get-env = "read", get-tiny-image = "read" }\n'
    )
    agent = mcp_agent(provider, registry, servers)
    run_id, view = await start_and_drive(runtime, agent)

    assert view.status() == {"state": "completed", "output": "ok"}
    seen = [r["content"] for r in tool_results_seen(provider)]
    assert seen[0] == "Echo: hi" and "5" in seen[1]
    assert "from-the-definition" in seen[2] and "SALVOR_SECRET_FOR_TEST" not in seen[2]
    # The orphan mark a restarted daemon finds a left-behind server by.
    assert "SALVOR_DAEMON" in seen[2] and run_id in seen[2]
    # An image is named to the model, not pasted into the conversation.
    assert '"mimeType": "image/png"' in seen[3] and len(seen[3]) < 2000


def test_salvor_run_builds_the_agent_file_and_refuses_one_that_will_not_build(
    store_url, providers, fx, tmp_path
):
    from tests.daemon.cli.test_cli import one_sentence, run_count
    from tests.daemon.cli.test_cli import salvor_process as salvor

    provider = providers(tool_loop_script([("lookup", {"key": "cli"})], final_text="from the cli"))
    good = tmp_path / "agent.toml"
    good.write_text(
        agent_toml(provider.base_url)
        + fx_table(f"command = {fx.toml_command()}\n", 'effects = { lookup = "read" }\n')
    )
    result = salvor(store_url, "run", str(good))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1].endswith('completed: "from the cli"')
    # One start to build the agent (closed again), one for the drive's live call.
    assert len(fx.starts) == 2 and [e["tool"] for e in fx.ledger] == ["lookup"]

    bad = tmp_path / "bad.toml"
    bad.write_text(
        agent_toml(provider.base_url)
        + fx_table(f"command = {fx.toml_command()}\n", 'effects = { lokup = "read" }\n')
    )
    before = run_count(store_url)
    one_sentence(
        salvor(store_url, "run", str(bad)),
        "the agent definition does not build",
        "lists no tool 'lokup'",
    )
    assert run_count(store_url) == before


@pytest.mark.parametrize("json_response", [False, True], ids=["sse", "json"])
async def test_a_server_on_the_official_sdk_over_streamable_http(
    runtime, providers, registry, clock, json_response
):
    peer = SdkHttpServer(json_response=json_response)
    try:
        wake_at = format_instant(clock.now + timedelta(minutes=5))
        provider = providers(
            tool_loop_script(
                [("add", {"a": 2, "b": 3}), ("nap", {"until": wake_at})], final_text="ok"
            )
        )
        servers = (
            f'\n[[mcp_servers]]\nname = "sdk"\nurl = "{peer.url}"\neffects = {{ '
            'add = "read", nap = "read" }\n'
        )
        agent = mcp_agent(provider, registry, servers)
        run_id, view = await start_and_drive(runtime, agent)
        assert view.state is RunState.SLEEPING and view.status()["wake_at"] == wake_at
        log = await runtime.reads.log(run_id)
        assert completion_of(log, "add")[0]["structuredContent"] == {"result": 5}
        assert completion_of(log, "nap") == [{TOOL_SLEEP_KEY: {"wake_at": wake_at}}]
        clock.advance(301)
        view = await runtime.drive(run_id, agent=agent)
        assert view.status() == {"state": "completed", "output": "ok"}
        assert tool_results_seen(provider)[0]["content"] == "5"
    finally:
        peer.stop()


async def test_mcp_tools_over_the_openai_wire(runtime, providers, registry, fx):
    provider = providers(
        tool_loop_script([("lookup", {"key": "o"}), ("fail_soft", {})], final_text="ok")
    )
    text = agent_toml(provider.base_url, wire="openai") + fx_table(
        f"command = {fx.toml_command()}\n"
    )
    agent = parse_definition(text, "toml", known_tools=registry.names())
    _run_id, view = await start_and_drive(runtime, agent)

    assert view.status() == {"state": "completed", "output": "ok"}
    offered = provider.calls[0].request["tools"]
    assert offered[0]["name"] == "lookup" and offered[0]["input_schema"]["required"] == ["key"]
    assert [r["content"] for r in tool_results_seen(provider)] == ["value of o", "it went wrong"]


@needs_everything
async def test_server_everything_over_streamable_http(runtime, providers, registry):
    command = everything_server()
    peer = EverythingHttpServer(command)
    try:
        plan = [("echo", {"message": "over http"}), ("get-sum", {"a": 40, "b": 2})]
        provider = providers(tool_loop_script(plan, final_text="ok"))
        servers = (
            f'\n[[mcp_servers]]\nname = "everything"\nurl = "{peer.url}"\n'
            'effects = { echo = "read", get-sum = "read" }\ntools = ["echo", "get-sum"]\n'
        )
        agent = mcp_agent(provider, registry, servers)
        _run_id, view = await start_and_drive(runtime, agent)
    finally:
        peer.stop()
    assert view.status() == {"state": "completed", "output": "ok"}
    assert [t["name"] for t in provider.calls[0].request["tools"]] == ["echo", "get-sum"]
    seen = [r["content"] for r in tool_results_seen(provider)]
    assert seen[0] == "Echo: over http" and "42" in seen[1]
