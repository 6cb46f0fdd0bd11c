"""``POST /v1/runs/{id}/tools`` with ``mcp_servers`` over a real daemon, and ``salvor tools attach
--mcp``: a server the operator declared attachable, named in the body, reaches the waiting run's
next model call; a URL, a command or a server's table in its place is a 400 with nothing
recorded, and a name the operator did not declare a 404 ``unknown_mcp_server`` with nothing
recorded (the trust rule: an HTTP caller never chooses where the daemon connects, what it
spawns or which secret it sends)."""

from __future__ import annotations

import json

import pytest

from tests.daemon.agents.test_attached_mcp import DESK_TOOLS, desk
from tests.daemon.api.test_run_tools_api import trio_thread, waiting_run
from tests.support.api import snapshot
from tests.support.backends import SQLITE_ONLY
from tests.support.cli import salvor_in_process
from tests.support.flows import tool_results, tool_use
from tests.support.scripted_provider import text_reply

# SQLite alone: the route and the command above the store; the log's side on every backend
# (tests/daemon/agents/test_attached_mcp.py).
STORE_BACKENDS = SQLITE_ONLY


@pytest.fixture
async def attaching_server(server_factory, fx):
    return await server_factory(attachable_mcp=desk(fx))


async def test_a_declared_server_named_in_the_body_reaches_the_next_model_call(
    attaching_server, providers, fx
) -> None:
    server = attaching_server
    run_id, provider = await waiting_run(
        server, providers, tool_use("lookup", {"key": "INV-7"}), text_reply("looked it up")
    )
    response = await server.client.post(f"/v1/runs/{run_id}/tools", json={"mcp_servers": ["desk"]})
    assert response.status_code == 200, response.text
    assert response.json() == {"run": run_id, "tools": ["mcp:desk"], "runs": [run_id], "busy": []}
    events = (await server.client.get(f"/v1/runs/{run_id}/events")).text
    assert "mcp:desk" in events and fx.command()[1] not in events

    resumed = await server.client.post(
        f"/v1/runs/{run_id}/resume", json={"input": {"answer": "INV-7"}}
    )
    assert resumed.status_code == 202, resumed.text
    body = await server.wait_resting(run_id)
    assert body["status"] == {"state": "completed", "output": "looked it up"}
    offered = [tool["name"] for tool in provider.calls[1].request["tools"]]
    assert offered == [*DESK_TOOLS, "ask_user"]
    assert tool_results(provider.calls[2])[-1]["content"] == "value of INV-7"
    assert len(fx.calls_of("lookup")) == 1


async def test_a_url_a_command_or_a_table_for_a_server_is_refused_with_nothing_recorded(
    attaching_server, providers, fx
) -> None:
    server = attaching_server
    run_id, _ = await waiting_run(server, providers)
    before = await snapshot(server)
    bodies = [
        {"mcp_servers": ["http://127.0.0.1:9/mcp"]},
        {"mcp_servers": [{"url": "http://127.0.0.1:9/mcp"}]},
        {"mcp_servers": [{"name": "desk", "command": ["sh", "-c", "id"]}]},
        {"mcp_servers": ["desk"], "url": "http://127.0.0.1:9/mcp"},
        {"mcp_servers": []},
        {"mcp_servers": "desk"},
    ]
    for body in bodies:
        response = await server.client.post(f"/v1/runs/{run_id}/tools", json=body)
        assert response.status_code == 400, (body, response.text)
        assert set(response.json()) == {"error"}
        assert response.json()["error"]["code"] == "bad_request", body
    assert await snapshot(server) == before
    assert "ToolsAttached" not in (await server.client.get(f"/v1/runs/{run_id}/events")).text
    assert fx.starts == []


async def test_an_undeclared_server_is_a_404_with_nothing_recorded(
    attaching_server, providers
) -> None:
    server = attaching_server
    run_id, _ = await waiting_run(server, providers)
    before = await snapshot(server)
    for body in ({"mcp_servers": ["nowhere"]}, {"tools": ["lookup_invoice", "mcp:nowhere"]}):
        response = await server.client.post(f"/v1/runs/{run_id}/tools", json=body)
        assert response.status_code == 404, response.text
        error = response.json()["error"]
        assert error["code"] == "unknown_mcp_server"
        assert "declares no attachable MCP server 'nowhere'" in error["message"]
    assert await snapshot(server) == before


async def test_salvor_tools_attach_mcp_checks_the_name_against_the_file(
    server, providers, store_url, tmp_path, fx
) -> None:
    run_id, _ = await waiting_run(server, providers)
    declared = tmp_path / "attachable.toml"
    declared.write_text(
        f'[[mcp_servers]]\nname = "desk"\ncommand = {json.dumps(fx.command())}\n', encoding="utf-8"
    )
    usage = await trio_thread(
        salvor_in_process, "tools", "attach", run_id, "--mcp", "desk", "--store", store_url
    )
    assert usage.returncode == 2 and "--mcp needs --attachable-mcp FILE" in usage.stderr
    unknown = await trio_thread(
        salvor_in_process,
        "tools",
        "attach",
        run_id,
        "--mcp",
        "nowhere",
        "--attachable-mcp",
        str(declared),
        "--store",
        store_url,
        "--json",
    )
    assert unknown.returncode == 1
    assert json.loads(unknown.stdout)["error"]["code"] == "unknown_mcp_server"
    done = await trio_thread(
        salvor_in_process,
        "tools",
        "attach",
        run_id,
        "--mcp",
        "desk",
        "--attachable-mcp",
        str(declared),
        "--store",
        store_url,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"run {run_id}: attached mcp:desk (recorded in 1 run of its tree)\n"


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "cannot be read"),
        ("[[mcp_servers]\n", "is not a TOML file"),
        ('tools = ["x"]\n', "has the key `tools`; it declares [[mcp_servers]] tables only"),
        ('[[mcp_servers]]\nname = "desk"\n', "give exactly one of `command`"),
        (
            '[[mcp_servers]]\nname = "desk"\nurl = "http://127.0.0.1:9/mcp"\n',
            "is not an MCP origin this daemon's operator declared",
        ),
        (
            '[[mcp_servers]]\nname = "desk"\ncommand = ["mcp-server"]\n',
            "only when the daemon is started with --allow-process-agents",
        ),
    ],
    ids=["missing", "not-toml", "other-key", "bad-server", "undeclared-origin", "command"],
)
def test_serve_refuses_an_attachable_file_it_cannot_use_in_one_sentence(
    tmp_path, store_url, content, says
) -> None:
    path = tmp_path / "attachable.toml"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    done = salvor_in_process("serve", "--attachable-mcp", str(path), "--store", store_url)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("salvor: --attachable-mcp")
