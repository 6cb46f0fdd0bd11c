"""The notifications a process agent sends its MCP server, through either stand-in.

The agent (``mcp`` SDK client) says ``roots/list_changed``, reports progress,
and gives up on a held ``lookup`` once the server has it (the SDK then sends
``notifications/cancelled``) before releasing the hold itself. The fixture
server logs every notification it receives, and its ledger the request id
each call came under: the cancellation must name the id salvor's session
sent the call with, not the agent's own. Notifications are never recorded, so
a re-run (no server at all) accepts them and still reproduces every call.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import trio
from salvor.daemon.agents._definition import parse_definition

from tests.support.backends import SQLITE_ONLY
from tests.support.mcp_servers import FixtureServer
from tests.support.scripted_provider import tool_loop_script

# SQLite alone (tests/support/backends.py): what it tests is notifications crossing a stand-in.
STORE_BACKENDS = SQLITE_ONLY

AGENT = r"""
import json, os, shlex, sys
from pathlib import Path

import anyio
import openai
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

try:
    from mcp.client.streamable_http import streamable_http_client
except ImportError:  # the SDK's older name
    from mcp.client.streamable_http import streamablehttp_client as streamable_http_client

hold = os.environ["HOLD"]


async def on_progress(progress, total, message):
    pass


def told():
    notes = Path(os.environ["NOTES"])
    return notes.read_text() if notes.exists() else ""


def lookups_served():
    ledger = Path(os.environ["LEDGER"])
    return (ledger.read_text() if ledger.exists() else "").count('"tool": "lookup"')


async def give_up_once_served(scope, before):
    with anyio.fail_after(30):
        while lookups_served() == before:
            await anyio.sleep(0.01)
    scope.cancel()


async def main():
    if sys.argv[1] == "stdio":
        argv = shlex.split(os.environ["SALVOR_MCP_SERVER_FIX"])
        opened = stdio_client(StdioServerParameters(command=argv[0], args=argv[1:]))
    else:
        opened = streamable_http_client(os.environ["SALVOR_MCP_URL_FIX"])
    async with opened as streams:
        async with ClientSession(streams[0], streams[1]) as mcp:
            await mcp.initialize()
            # Listed first: the SDK lists the tools once, to check a result's schema, after the
            # first result it gets. The given-up call gets none live and one on a re-run, which
            # would move it.
            await mcp.list_tools()
            await mcp.send_roots_list_changed()
            await mcp.send_progress_notification("agent-token", 0.5, 1.0)
            # Given up once the server has the call (a new ledger line), not after a guess at how
            # long the way there takes: a cancellation sent before the call arrives names nothing.
            # A re-run has no server; it answers from the log, and then there is nothing to give up.
            with anyio.CancelScope() as give_up:
                async with anyio.create_task_group() as calls:
                    calls.start_soon(give_up_once_served, give_up, lookups_served())
                    await mcp.call_tool("lookup", {"key": "a", "hold": hold})
                    give_up.cancel()
            # The call is released only once the server has heard it was given up: the SDK sends
            # the cancellation on its own time, and one that arrives after the call is answered
            # names nothing in flight (salvor drops it, as it should).
            with anyio.move_on_after(20):
                while "notifications/cancelled" not in told():
                    await anyio.sleep(0.01)
            Path(hold).write_text("go")  # the server finishes the call it was told was cancelled
            # A progress token of the agent's own rides in the call's _meta to the server.
            await mcp.call_tool("write_note", {"text": "after"}, progress_callback=on_progress)
    reply = openai.OpenAI(max_retries=0).chat.completions.create(
        model="scripted-model", messages=[{"role": "user", "content": os.environ["SALVOR_PROMPT"]}]
    )
    print(reply.choices[0].message.content)


anyio.run(main)
"""


def notifying_agent(tmp_path: Path, fx: FixtureServer, transport: str):
    script = tmp_path / "notifying_agent.py"
    script.write_text(AGENT)
    text = (
        'name = "notifier"\nkind = "process"\ncommand = '
        f"{json.dumps([sys.executable, str(script), transport])}\n"
        f"cwd = {json.dumps(str(tmp_path))}\ntimeout = 60\n"
        f'[[mcp_servers]]\nname = "fix"\ncommand = {fx.toml_command()}\n'
        f'effects = {{ lookup = "read", write_note = "write" }}\n'
        f"[env]\nHOLD = {json.dumps(fx.hold('lookup'))}\n"
        f"LEDGER = {json.dumps(str(fx.dir / 'ledger.jsonl'))}\n"
        f"NOTES = {json.dumps(str(fx.dir / 'notifications.jsonl'))}\n"
    )
    return parse_definition(text, "toml")


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_the_agents_notifications_reach_the_live_server_and_a_rerun_accepts_them(
    runtime, providers, upstream_env, tmp_path, fx, transport
):
    provider = providers(tool_loop_script([], final_text="told"))
    upstream_env(provider)
    agent = notifying_agent(tmp_path, fx, transport)
    origin = await runtime.starts.start_run(agent, "tell the server")
    view = await runtime.drive(origin, agent=agent)
    assert view.state.value == "completed", view.detail

    # Notifications are relayed as they come, each on its own way to the server (over HTTP, a
    # request of its own): the run can rest before the server has written the last one down.
    expected = 4
    with trio.move_on_after(20):  # then the assertion below names what never came
        while len({n["method"] for n in fx.notifications}) < expected:
            await trio.sleep(0.02)
    heard = {n["method"]: n.get("params") for n in fx.notifications}
    assert sorted(heard) == [
        "notifications/cancelled",
        "notifications/initialized",
        "notifications/progress",
        "notifications/roots/list_changed",
    ]
    # salvor's own session said initialized once; the agent's was not sent again.
    assert [n["method"] for n in fx.notifications].count("notifications/initialized") == 1
    assert heard["notifications/progress"]["progressToken"] == "agent-token"
    (lookup,) = fx.calls_of("lookup")
    assert heard["notifications/cancelled"]["requestId"] == lookup["id"]
    # The agent's progress token reached the server; the log does not keep it.
    (note,) = fx.calls_of("write_note")
    assert "progressToken" in note["meta"]

    # None of them is a call in the log; the call the agent gave up on is
    # recorded with the server's answer.
    log = await runtime.reads.log(origin)
    calls = [e for e in log if e.kind == "ToolCallRequested"]
    assert not [e for e in calls if "notifications/" in e.event.tool]
    (given_up,) = [e.seq for e in calls if e.event.input.get("name") == "lookup"]
    (answer,) = [
        e.event.output for e in log if e.kind == "ToolCallCompleted" and e.event.seq == given_up
    ]
    assert "value of a" in json.dumps(answer)
    assert not [e for e in calls if "_meta" in e.event.input]

    rerun = await runtime.starts.start_run(agent, None, replay_of=origin)
    view = await runtime.drive(rerun, agent=agent)
    assert view.state.value == "completed", view.detail
    assert len(fx.starts) == 1 and len(fx.notifications) == 4 and len(fx.ledger) == 2
