"""Kill safety of an MCP server attached at run time: a real `salvor serve` with
``--attachable-mcp``, SIGKILLed and restarted, and the fixture MCP server over streamable HTTP
(a server of its own on a declared ``--mcp-origin``, outliving the daemon).

An agent waits on a question; the operator attaches the declared server ``desk`` by name. Killed
while the run waits, the restarted daemon still has it attached (read back from the log) and,
once the question is answered, offers the server's tools (listed through the log) and calls
one, performed once. An attached write with a probe, killed after the server performed it and
before its completion was recorded, is settled by the probe when the restarted daemon recovers
the run: recorded once, never sent again.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
from salvor.protocol import EventKind

from tests.chaos.test_kill_flow_tools import register, start_run
from tests.chaos.test_kill_graph_run import stored_log, wait_state
from tests.chaos.test_kill_run_tools import asks_then, offered
from tests.chaos.test_kill_serve import Daemon
from tests.support.mcp_servers import FixtureServer, HttpFixtureServer
from tests.support.scripted_provider import ScriptedProvider

pytestmark = pytest.mark.kill

DESK_TOOLS = ["lookup", "write_note", "find_note"]


TOKEN_VAR = "DESK_TOKEN"
DESK_TOKEN = "desk-token-the-operator-keeps"


def attachable_file(tmp_path: Path, url: str) -> Path:
    """The operator's --attachable-mcp file: ``desk``, whose write is keyed and probed, sent the
    operator's token (a ``${VAR}`` header bound to its origin)."""
    path = tmp_path / "attachable.toml"
    path.write_text(
        f'[[mcp_servers]]\nname = "desk"\nurl = "{url}"\ntools = {json.dumps(DESK_TOOLS)}\n'
        f'headers = {{ Authorization = "Bearer ${{{TOKEN_VAR}}}" }}\n'
        'effects = { lookup = "read", write_note = "write", find_note = "read" }\n'
        'idempotency_keys = { write_note = "text" }\n'
        "[mcp_servers.probes.write_note]\n"
        'tool = "find_note"\ninput = { text = "text" }\nlanded = "found"\noutput = "note"\n',
        encoding="utf-8",
    )
    return path


@pytest.fixture
def desk(tmp_path: Path):
    fx_dir = tmp_path / "fx"
    fx_dir.mkdir()
    fx = FixtureServer(fx_dir)
    http = HttpFixtureServer(fx, "--find-note")
    try:
        yield fx, http
    finally:
        http.stop()


def serving_desk(tmp_path: Path, store_url: str, http: HttpFixtureServer, provider) -> Daemon:
    daemon = Daemon(tmp_path, store_url, tmp_path / "effects.jsonl")
    daemon.env[TOKEN_VAR] = DESK_TOKEN
    daemon.args += [
        "--model-endpoint",
        provider.base_url,
        "--mcp-origin",
        f"http://127.0.0.1:{http.port},header_env={TOKEN_VAR}",
        "--attachable-mcp",
        str(attachable_file(tmp_path, http.url)),
    ]
    return daemon


def attach_desk(client: httpx.Client, run_id: str) -> None:
    response = client.post(f"/v1/runs/{run_id}/tools", json={"mcp_servers": ["desk"]})
    assert response.status_code == 200, response.text
    assert response.json()["tools"] == ["mcp:desk"]


def tool_calls(store_url: str, run_id: str) -> list[str]:
    log = stored_log(store_url, run_id)
    return [e.event.tool for e in log if e.event.KIND is EventKind.TOOL_CALL_REQUESTED]


def test_an_attached_server_survives_a_kill_and_its_tool_is_called_once(
    tmp_path: Path, store_url: str, desk
) -> None:
    fx, http = desk
    with ScriptedProvider(asks_then("lookup", lambda a: {"key": a})) as provider:
        daemon = serving_desk(tmp_path, store_url, http, provider)
        daemon.start()
        try:
            client = httpx.Client(base_url=daemon.base_url, timeout=30)
            agent = register(client, provider, 'flow_tools = ["ask_user"]')
            run_id = start_run(client, agent, "what does INV-7 owe?")
            waiting = wait_state(client, run_id, "suspended")
            attach_desk(client, run_id)

            daemon.kill()
            daemon.start()
            assert client.get(f"/v1/runs/{run_id}").json()["status"] == waiting["status"]
            resumed = client.post(f"/v1/runs/{run_id}/resume", json={"input": {"answer": "INV-7"}})
            assert resumed.status_code == 202, resumed.text
            body = wait_state(client, run_id, "completed")
            client.close()
        finally:
            daemon.kill()
        calls = list(provider.calls)

    assert body["status"]["output"] == "value of INV-7"
    assert offered(calls[0]) == ["ask_user"]
    assert offered(calls[1]) == [*DESK_TOOLS, "ask_user"]
    assert [c["arguments"] for c in fx.calls_of("lookup")] == [{"key": "INV-7"}]
    log = stored_log(store_url, run_id)
    assert [e.event.KIND for e in log].count(EventKind.TOOLS_ATTACHED) == 1
    assert tool_calls(store_url, run_id) == ["ask_user", "mcp:desk/tools/list", "lookup"]
    # The secret went to the server as the daemon connected, and never into the log.
    assert {r["authorization"] for r in fx.http_requests} == {f"Bearer {DESK_TOKEN}"}
    assert DESK_TOKEN not in repr(log) and http.url not in repr(log)


def test_an_attached_servers_write_killed_after_it_landed_is_settled_by_its_probe(
    tmp_path: Path, store_url: str, desk
) -> None:
    fx, http = desk
    note = {"text": "INV-7", "hold": fx.hold("w")}
    with ScriptedProvider(asks_then("write_note", lambda a: note)) as provider:
        daemon = serving_desk(tmp_path, store_url, http, provider)
        daemon.start()
        try:
            client = httpx.Client(base_url=daemon.base_url, timeout=30)
            agent = register(client, provider, 'flow_tools = ["ask_user"]')
            run_id = start_run(client, agent, "note INV-7")
            wait_state(client, run_id, "suspended")
            attach_desk(client, run_id)
            resumed = client.post(f"/v1/runs/{run_id}/resume", json={"input": {"answer": "yes"}})
            assert resumed.status_code == 202, resumed.text
            # The server has performed the write (its ledger line) and holds the answer back:
            # the daemon dies between the write's intent and its completion.
            deadline = time.monotonic() + 30
            while not fx.calls_of("write_note"):
                assert time.monotonic() < deadline, "the write never reached the server"
                time.sleep(0.02)
            daemon.kill()
            fx.release("w")
            daemon.start()
            body = wait_state(client, run_id, "completed")
            client.close()
        finally:
            daemon.kill()

    assert body["status"]["output"] == "noted INV-7"  # the probe's output, told to the model
    assert len(fx.calls_of("write_note")) == 1
    assert [c["arguments"] for c in fx.calls_of("find_note")] == [{"text": "INV-7"}]
    log = stored_log(store_url, run_id)
    (intent,) = [e for e in log if getattr(e.event, "tool", None) == "write_note"]
    (done,) = [
        e.event
        for e in log
        if e.event.KIND is EventKind.TOOL_CALL_COMPLETED and e.event.seq == intent.seq
    ]
    assert done.settled_by == "probe"
