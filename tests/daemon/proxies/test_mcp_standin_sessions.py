"""An MCP session through the stand-in, spoken by hand: the agent's authorization reaches the real
server and is never stored, the session id is the server's live and a constant in replay, and a
replayed ``initialize`` matches its protocol version and nothing else of it.

The agent (``RAW_HTTP_AGENT``) posts JSON-RPC with httpx to ``$SALVOR_MCP_URL_FIX``; the server
is the fixture server over HTTP.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from salvor.daemon.agents._definition import parse_definition
from salvor.protocol import encode_envelope

from tests.support.backends import SQLITE_ONLY
from tests.support.mcp_servers import HttpFixtureServer
from tests.support.scripted_provider import tool_loop_script

# SQLite alone (tests/support/backends.py): what it tests is the MCP stand-ins' recording and
# replay.
STORE_BACKENDS = SQLITE_ONLY


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
