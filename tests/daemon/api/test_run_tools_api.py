"""``POST /v1/runs/{id}/tools`` over a real daemon, and ``salvor tools attach``: a registry tool
attached by name to a waiting run is offered at its next model call; a body that names a URL, a
command or a server (anything but registry tool names) is refused with the envelope and nothing
recorded (the trust rule: an HTTP caller never chooses where the daemon connects); a foreign
Origin is refused as on every route."""

from __future__ import annotations

import json

import trio

from tests.support.api import snapshot
from tests.support.api_server import agent_toml
from tests.support.backends import SQLITE_ONLY
from tests.support.cli import salvor_in_process
from tests.support.flows import tool_results, tool_use
from tests.support.scripted_provider import text_reply

# SQLite alone (tests/support/backends.py): the route and the command above the store; the log's
# side of an attachment is tested on every backend (tests/daemon/agents/test_run_tools.py).
STORE_BACKENDS = SQLITE_ONLY

QUESTION = {"question": "Which invoice?", "type": "input"}


async def waiting_run(server, providers, *then) -> tuple[str, object]:
    provider = providers([tool_use("ask_user", QUESTION), *then])
    agent = await server.register_agent(
        agent_toml(provider.base_url, extra='flow_tools = ["ask_user"]')
    )
    run_id = await server.start_run(agent, "what does INV-7 owe?")
    assert (await server.wait_resting(run_id))["status"]["state"] == "suspended"
    return run_id, provider


async def test_an_attached_tool_reaches_the_next_model_call(server, providers) -> None:
    run_id, provider = await waiting_run(
        server,
        providers,
        tool_use("lookup_invoice", {"invoice_id": "INV-7"}, use_id="toolu_1"),
        text_reply("looked it up"),
    )
    response = await server.client.post(
        f"/v1/runs/{run_id}/tools", json={"tools": ["lookup_invoice"]}
    )
    assert response.status_code == 200, response.text
    assert response.json() == {
        "run": run_id,
        "tools": ["lookup_invoice"],
        "runs": [run_id],
        "busy": [],
    }
    resumed = await server.client.post(
        f"/v1/runs/{run_id}/resume", json={"input": {"answer": "INV-7"}}
    )
    assert resumed.status_code == 202, resumed.text
    body = await server.wait_resting(run_id)
    assert body["status"] == {"state": "completed", "output": "looked it up"}
    assert [t["name"] for t in provider.calls[1].request["tools"]] == ["lookup_invoice", "ask_user"]
    assert json.loads(tool_results(provider.calls[2])[-1]["content"])["invoice_id"] == "INV-7"


async def test_a_url_a_command_or_a_server_in_the_body_is_refused_with_nothing_recorded(
    server, providers
) -> None:
    run_id, _ = await waiting_run(server, providers)
    before = await snapshot(server)
    bodies = [
        {"url": "http://127.0.0.1:9/mcp"},
        {"tools": ["lookup_invoice"], "command": "rm -rf /"},
        {"tools": ["lookup_invoice"], "mcp_server": "files"},
        {"tools": [{"url": "http://127.0.0.1:9/mcp"}]},
        {"tools": [{"name": "files", "command": ["npx", "server"]}]},
        {"tools": []},
        {},
    ]
    for body in bodies:
        response = await server.client.post(f"/v1/runs/{run_id}/tools", json=body)
        assert response.status_code == 400, (body, response.text)
        error = response.json()["error"]
        assert error["code"] == "bad_request", body
        assert set(response.json()) == {"error"}
    assert await snapshot(server) == before
    log = (await server.client.get(f"/v1/runs/{run_id}/events")).text
    assert "ToolsAttached" not in log


async def test_a_foreign_origin_is_refused(server, providers) -> None:
    run_id, _ = await waiting_run(server, providers)
    before = await snapshot(server)
    response = await server.client.post(
        f"/v1/runs/{run_id}/tools",
        json={"tools": ["lookup_invoice"]},
        headers={"Origin": "https://evil.example"},
    )
    assert response.status_code == 403, response.text
    assert response.json()["error"]["code"] == "forbidden"
    assert await snapshot(server) == before


async def test_salvor_tools_attach_records_it_and_refuses_an_unknown_tool(
    server, providers, store_url
) -> None:
    run_id, _ = await waiting_run(server, providers)
    done = await trio_thread(
        salvor_in_process, "tools", "attach", run_id, "lookup_invoice", "--store", store_url
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"run {run_id}: attached lookup_invoice (recorded in 1 run of its tree)\n"
    again = await trio_thread(
        salvor_in_process, "tools", "attach", run_id, "nope", "--store", store_url, "--json"
    )
    assert again.returncode == 1
    assert json.loads(again.stdout)["error"]["code"] == "unknown_tool"
    usage = await trio_thread(salvor_in_process, "tools", "attach", run_id, "--store", store_url)
    assert usage.returncode == 2
    logged = await trio_thread(salvor_in_process, "log", run_id, "--store", store_url)
    assert "ToolsAttached       lookup_invoice by the operator" in logged.stdout


async def test_a_client_driven_run_takes_no_attachment_by_either_way(server) -> None:
    opened = (await server.client.post("/v1/client-runs")).json()
    run_id, token = opened["run"], {"X-Drive-Token": opened["drive_token"]}
    head = {
        "run_id": run_id,
        "seq": 0,
        "schema_version": 1,
        "recorded_at": "2026-01-01T00:00:00.000000Z",
        "event": {"kind": "RunStarted", "payload": {"agent_def_hash": "sha256:" + "0" * 64}},
    }
    head["event"]["payload"]["input"] = None
    events = f"/v1/client-runs/{run_id}/events"
    assert (await server.client.post(events, json={"events": [head]}, headers=token)).is_success
    attached = {**head, "seq": 1}
    attached["event"] = {
        "kind": "ToolsAttached",
        "payload": {"tools": ["lookup_invoice"], "by": "operator"},
    }
    appended = await server.client.post(events, json={"events": [attached]}, headers=token)
    assert appended.status_code == 422, appended.text
    assert appended.json()["error"]["code"] == "unsupported_event_kind"
    assert "tools are its client's" in appended.json()["error"]["message"]
    response = await server.client.post(
        f"/v1/runs/{run_id}/tools", json={"tools": ["lookup_invoice"]}
    )
    assert response.status_code == 409, response.text
    assert response.json()["error"]["code"] == "client_driven_run"


async def trio_thread(fn, *args):
    return await trio.to_thread.run_sync(lambda: fn(*args))
