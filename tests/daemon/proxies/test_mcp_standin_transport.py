"""How an MCP stand-in is reached: a ``url`` server's fixed port, a JSON-RPC batch refused by name,
and the relay's answer to each request when the daemon is gone.

The agents are real subprocesses on the ``mcp`` SDK (``tests/support/mcp_standin_agents.py``), the
server the fixture server.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest
from salvor.daemon.agents._definition import DefinitionError, parse_definition
from salvor.daemon.proxies._mcp_endpoint import serve_mcp
from salvor.daemon.recording._run_context import DriveInterrupted

from tests.support.backends import SQLITE_ONLY
from tests.support.mcp_servers import HttpFixtureServer
from tests.support.mcp_standin_agents import PLAN, standin_agent
from tests.support.scripted_provider import tool_loop_script

# SQLite alone (tests/support/backends.py): what it tests is the MCP stand-ins' wire.
STORE_BACKENDS = SQLITE_ONLY


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
