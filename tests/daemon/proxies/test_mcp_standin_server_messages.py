"""What an MCP server sends its agent through a stand-in: notifications and requests reach the agent
live and again on a re-run, with no server, and a second push stream is a 409.

The agents are real subprocesses on the ``mcp`` SDK (``tests/support/mcp_standin_agents.py``), the
server the fixture server, whose ledger counts each tool execution.
"""

from __future__ import annotations

import json

import pytest
from salvor.daemon.proxies._mcp_endpoint import serve_mcp

from tests.support.backends import SQLITE_ONLY
from tests.support.mcp_standin_agents import PLAN, standin_agent
from tests.support.scripted_provider import tool_loop_script

# SQLite alone (tests/support/backends.py): what it tests is the MCP stand-ins' recording and
# replay.
STORE_BACKENDS = SQLITE_ONLY


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
