"""The MCP client against real servers: lifecycle, paging, both transports,
and every way a server fails."""

from __future__ import annotations

import json
import os
import sys

import pytest
import trio
from salvor.daemon.mcp._client import (
    MAX_MESSAGE_BYTES,
    PROTOCOL_VERSION,
    McpNoAnswer,
    McpRemoteError,
    McpUnavailable,
    open_session,
)
from salvor.daemon.mcp._definition import parse_mcp_servers
from salvor.daemon.mcp._tools import open_connections

from tests.support.mcp_servers import FixtureServer, HttpFixtureServer


@pytest.fixture(params=["stdio", "http", "http-sse"])
def fx_spec(request, fx: FixtureServer):
    """A server spec for the fixture server on each transport."""

    def make(**fields):
        if request.param == "stdio":
            return parse_mcp_servers(
                [{"name": "fx", "command": fx.command(), "timeout": 2, **fields}]
            )[0]
        return parse_mcp_servers([{"name": "fx", "url": server.url, "timeout": 2, **fields}])[0]

    server = (
        None if request.param == "stdio" else HttpFixtureServer(fx, sse=request.param == "http-sse")
    )
    yield make
    if server is not None:
        server.stop()


async def test_a_session_initialises_lists_every_page_and_calls(fx_spec, nursery):
    session = await open_session(fx_spec(), nursery)
    try:
        assert session.protocol_version == PROTOCOL_VERSION
        assert session.server_info == {"name": "salvor-fixture", "version": "1"}
        tools = await session.list_tools()
        assert len(tools) == 10 and tools[0]["name"] == "lookup"  # three pages of four
        assert await session.call_tool("lookup", {"key": "k"}) == {
            "content": [{"type": "text", "text": "value of k"}]
        }
        with pytest.raises(McpRemoteError, match="error -32602: unknown tool nope") as refused:
            await session.call_tool("nope", {})
        assert refused.value.code == -32602
    finally:
        await session.aclose()


async def test_a_server_request_is_answered_method_not_found(fx_spec, nursery):
    session = await open_session(fx_spec(), nursery)
    try:
        result = await session.call_tool("ask_client", {})
    finally:
        await session.aclose()
    answer = json.loads(result["content"][0]["text"])
    assert answer["id"] == "s1" and answer["error"]["code"] == -32601
    assert "sampling/createMessage" in answer["error"]["message"]


async def test_a_hung_call_times_out_is_cancelled_and_the_session_stays_usable(
    fx, fx_spec, nursery
):
    # The spec's timeout bounds every request, the initialize and the lookup after the hang too:
    # the fixture's own 2 s, not a half second a loaded machine's process start can overrun.
    session = await open_session(fx_spec(), nursery)
    try:
        with pytest.raises(McpNoAnswer, match="did not answer tools/call within 2s"):
            await session.call_tool("hang", {})
        assert (await session.call_tool("lookup", {"key": "again"}))["content"][0][
            "text"
        ] == "value of again"
    finally:
        await session.aclose()
    assert [n["method"] for n in fx.notifications] == [
        "notifications/initialized",
        "notifications/cancelled",
    ]
    assert fx.notifications[1]["params"] == {"requestId": 2, "reason": "no answer within 2s"}


async def test_a_stdio_server_that_crashes_is_reported_with_its_stderr(fx, nursery):
    spec = parse_mcp_servers([{"name": "fx", "command": fx.command(), "timeout": 5}])[0]
    session = await open_session(spec, nursery)
    with pytest.raises(
        McpNoAnswer, match="exited with code 3; its stderr ended with: fixture crashing on purpose"
    ):
        await session.call_tool("crash", {})
    # Nothing more can be sent, and saying so claims nothing was performed.
    with pytest.raises(McpUnavailable, match="is no longer connected: it exited with code 3"):
        await session.call_tool("lookup", {"key": "k"})
    await session.aclose()


async def test_a_stdio_server_that_writes_garbage_ends_its_session(fx, nursery):
    spec = parse_mcp_servers([{"name": "fx", "command": fx.command(), "timeout": 5}])[0]
    session = await open_session(spec, nursery)
    with pytest.raises(
        McpNoAnswer, match="wrote a line to stdout that is not JSON: 'this is not json'"
    ):
        await session.call_tool("garbage", {})
    assert session.broken is not None
    await session.aclose()


async def test_oversized_messages_are_refused_both_ways(fx_spec, nursery):
    session = await open_session(fx_spec(timeout=10), nursery)
    try:
        with pytest.raises(McpNoAnswer, match=f"over the {MAX_MESSAGE_BYTES}-byte cap"):
            await session.call_tool("big", {"size": MAX_MESSAGE_BYTES + 10})
    finally:
        await session.aclose()
    session = await open_session(fx_spec(timeout=10), nursery)
    try:
        with pytest.raises(McpUnavailable, match=f"the cap is {MAX_MESSAGE_BYTES} bytes"):
            await session.call_tool("lookup", {"key": "x" * MAX_MESSAGE_BYTES})
    finally:
        await session.aclose()


async def test_a_command_that_cannot_start_is_unavailable(tmp_path, nursery):
    spec = parse_mcp_servers([{"name": "gone", "command": [str(tmp_path / "no-such-server")]}])[0]
    with pytest.raises(
        McpUnavailable, match=r"could not be started \(.*no-such-server\): No such file"
    ):
        await open_session(spec, nursery)


async def test_a_process_that_is_no_mcp_server_fails_initialize_without_hanging(nursery):
    spec = parse_mcp_servers(
        [{"name": "cat", "command": [sys.executable, "-c", "print('hello')"], "timeout": 5}]
    )[0]
    with pytest.raises(
        McpUnavailable, match="did not start a session: it wrote a line to stdout that is not JSON"
    ):
        await open_session(spec, nursery)
    spec = parse_mcp_servers(
        [
            {
                "name": "sleepy",
                "command": [sys.executable, "-c", "import time; time.sleep(60)"],
                "timeout": 0.5,
            }
        ]
    )[0]
    with pytest.raises(
        McpUnavailable, match="did not start a session: it did not answer initialize within 0.5s"
    ):
        await open_session(spec, nursery)


async def test_closing_kills_the_whole_process_group(fx, nursery):
    spec = parse_mcp_servers([{"name": "fx", "command": fx.command()}])[0]
    session = await open_session(spec, nursery)
    await session.call_tool("lookup", {"key": "k"})
    pid = fx.starts[0]["pid"]
    await session.aclose()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_http_carries_the_session_id_protocol_version_and_resolved_headers(
    fx, nursery, monkeypatch
):
    server = HttpFixtureServer(fx)
    monkeypatch.setenv("FIXTURE_TOKEN", "t0ken")
    try:
        spec = parse_mcp_servers(
            [{"name": "web", "url": server.url, "bearer_token_env": "FIXTURE_TOKEN"}]
        )[0]
        session = await open_session(spec, nursery)
        await session.call_tool("lookup", {"key": "k"})
        await session.aclose()
    finally:
        server.stop()
    first, *rest = fx.http_requests
    assert first == {
        "method": "initialize",
        "session": None,
        "authorization": "Bearer t0ken",
        "protocol_version": None,
    }
    assert {r["session"] for r in rest} == {fx.http_requests[1]["session"]} and rest[0]["session"]
    assert {r["protocol_version"] for r in rest} == {PROTOCOL_VERSION}
    assert [r["method"] for r in rest] == ["notifications/initialized", "tools/call"]


async def test_an_unset_header_variable_is_named_and_nothing_is_sent(fx, nursery, monkeypatch):
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    spec = parse_mcp_servers(
        [
            {
                "name": "web",
                "url": "http://127.0.0.1:9/mcp",
                "headers": {"X-Key": "k-${NOT_SET_ANYWHERE}"},
            }
        ]
    )[0]
    with pytest.raises(
        McpUnavailable,
        match=r"header X-Key names \$\{NOT_SET_ANYWHERE\}, which the daemon's environment",
    ):
        await open_session(spec, nursery)


async def test_an_http_server_that_forgot_the_session_is_reconnected_once(fx):
    server = HttpFixtureServer(fx)
    try:
        spec = parse_mcp_servers([{"name": "web", "url": server.url}])[0]
        async with open_connections((spec,), mark={}) as connections:
            await connections.call_tool("web", "lookup", {"key": "1"}, None)
            # The server restarts and knows no session: the call is
            # refused with 404, never performed.
            server.stop()
            server = HttpFixtureServer(fx, port=server.port)
            result = await connections.call_tool("web", "lookup", {"key": "2"}, None)
        assert result["content"][0]["text"] == "value of 2"
        assert [e["arguments"]["key"] for e in fx.calls_of("lookup")] == ["1", "2"]
    finally:
        server.stop()


async def test_an_unreachable_http_server_is_unavailable(nursery):
    spec = parse_mcp_servers([{"name": "web", "url": "http://127.0.0.1:9/mcp", "timeout": 2}])[0]
    with pytest.raises(McpUnavailable, match="could not be reached at http://127.0.0.1:9/mcp"):
        await open_session(spec, nursery)


async def test_connections_start_nothing_until_asked(fx):
    spec = parse_mcp_servers([{"name": "fx", "command": fx.command()}])[0]
    async with open_connections((spec,), mark={}):
        await trio.lowlevel.checkpoint()
    assert fx.starts == []
