"""Built-in agents with MCP servers over the HTTP API: registration builds them, runs call them.

``POST /v1/agents`` starts (or reaches) every declared server, lists its
tools, checks the definition against them and closes the sessions; one that
will not build is a 400 in the one envelope, with nothing stored.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from salvor.protocol import EventKind

from tests.support.api import assert_error, read_log_independently, snapshot
from tests.support.api_server import agent_toml
from tests.support.backends import SQLITE_ONLY
from tests.support.mcp_servers import FixtureServer, HttpFixtureServer
from tests.support.scripted_provider import tool_loop_script

# SQLite alone (tests/support/backends.py): what it tests is registration building the agent
# from its servers and a run calling them; the log they record is the store's on either backend.
STORE_BACKENDS = SQLITE_ONLY


@pytest.fixture(autouse=True)
def declared(operator_declarations) -> None:
    # The address the refusal cases aim at, declared so each reaches the refusal it is about.
    operator_declarations.provider("http://127.0.0.1:9")
    operator_declarations.mcp_origin("http://127.0.0.1:9")


@pytest.fixture
def fx(tmp_path: Path) -> FixtureServer:
    directory = tmp_path / "fx"
    directory.mkdir()
    return FixtureServer(directory)


def stdio_table(fx: FixtureServer, body: str = "", *, name: str = "fx", extra=()) -> str:
    return f'\n[[mcp_servers]]\nname = "{name}"\ncommand = {fx.toml_command(*extra)}\n{body}'


async def test_registration_builds_the_agent_and_closes_its_servers(server_factory, providers, fx):
    server = await server_factory(allow_process_agents=True)
    provider = providers(
        tool_loop_script([("lookup", {"key": "a"}), ("write_note", {"text": "n"})], final_text="ok")
    )
    definition = agent_toml(provider.base_url) + stdio_table(fx, 'effects = { lookup = "read" }\n')
    agent = await server.register_agent(definition)

    assert len(fx.starts) == 1
    with pytest.raises(ProcessLookupError):
        os.kill(fx.starts[0]["pid"], 0)  # the build's session is closed, its process gone
    assert fx.ledger == []

    run_id = await server.start_run(agent, "go")
    body = await server.wait_resting(run_id)
    assert body["status"] == {"state": "completed", "output": "ok"}
    log = await read_log_independently(server.store_url, run_id)
    intents = [e.event for e in log if e.event.KIND is EventKind.TOOL_CALL_REQUESTED]
    assert [(i.tool, i.effect) for i in intents] == [
        ("mcp:fx/tools/list", "read"),
        ("lookup", "read"),
        ("write_note", "write"),
    ]
    assert [e["tool"] for e in fx.ledger] == ["lookup", "write_note"]


async def test_an_http_server_on_a_declared_origin_needs_no_opt_in_without_header_secrets(
    server, providers, fx, operator_declarations
):
    http = HttpFixtureServer(fx, sse=True)
    operator_declarations.mcp_origin(http.url)
    try:
        provider = providers(tool_loop_script([("lookup", {"key": "h"})], final_text="ok"))
        definition = (
            agent_toml(provider.base_url) + f'\n[[mcp_servers]]\nname = "web"\nurl = "{http.url}"\n'
        )
        agent = await server.register_agent(definition)
        body = await server.wait_resting(await server.start_run(agent, "go"))
    finally:
        http.stop()
    assert body["status"] == {"state": "completed", "output": "ok"}
    assert [e["tool"] for e in fx.ledger] == ["lookup"]


@pytest.mark.parametrize(
    ("servers", "fragment"),
    [
        (
            lambda fx, tmp: (
                f'\n[[mcp_servers]]\nname = "gone"\ncommand = ["{tmp}/no-such-server"]\n'
            ),
            "MCP server 'gone' could not be started",
        ),
        (
            lambda fx, tmp: stdio_table(fx, 'effects = { lookup = "read", lokup = "write" }\n'),
            "MCP server 'fx' lists no tool 'lokup' (named in its `effects`)",
        ),
        (
            lambda fx, tmp: stdio_table(fx, "results = { wipe = 1 }\n"),
            "MCP server 'fx' lists no tool 'wipe' (named in its `results`)",
        ),
        (
            lambda fx, tmp: stdio_table(fx, 'tools = ["lookup", "nope"]\n'),
            "MCP server 'fx' lists no tool 'nope' (named in its `tools`)",
        ),
        (
            lambda fx, tmp: stdio_table(fx, name="one") + stdio_table(fx, name="two"),
            (
                "the tool 'lookup' of MCP server 'two' has the same name "
                "as the tool of MCP server 'one'"
            ),
        ),
        (
            lambda fx, tmp: stdio_table(fx, extra=("--extra-tool", "lookup_invoice")),
            (
                "the tool 'lookup_invoice' of MCP server 'fx' has the same name as the "
                "registry tool 'lookup_invoice'"
            ),
        ),
        (
            lambda fx, tmp: stdio_table(fx, extra=("--extra-tool", "files.read")),
            "the tool 'files.read' of MCP server 'fx' cannot be offered to a model",
        ),
        (
            lambda fx, tmp: (
                '\n[[mcp_servers]]\nname = "shy"\ncommand = ["sh", "-c", "echo '
                'starting; sleep 30"]\ntimeout = 2\n'
            ),
            "MCP server 'shy' did not start a session: it wrote a line to stdout that is not JSON",
        ),
        (
            lambda fx, tmp: '\n[[mcp_servers]]\nname = "web"\nurl = "http://127.0.0.1:9/mcp"\n',
            "MCP server 'web' could not be reached",
        ),
    ],
)
async def test_a_definition_that_will_not_build_is_refused_and_nothing_is_stored(
    server_factory, fx, tmp_path, servers, fragment
):
    server = await server_factory(allow_process_agents=True)
    before = await snapshot(server)
    definition = agent_toml("http://127.0.0.1:9", tools=["lookup_invoice"]) + servers(fx, tmp_path)
    response = await server.client.post(
        "/v1/agents", content=definition, headers={"Content-Type": "application/toml"}
    )

    error = assert_error(response, 400, "bad_request")
    assert error["message"].startswith("the agent definition does not build: ")
    assert fragment in error["message"]
    assert await snapshot(server) == before
    assert fx.ledger == []


async def test_a_stdio_server_over_http_needs_the_process_opt_in(server, fx):
    before = await snapshot(server)
    definition = agent_toml("http://127.0.0.1:9") + stdio_table(fx)
    response = await server.client.post(
        "/v1/agents", content=definition, headers={"Content-Type": "application/toml"}
    )

    error = assert_error(response, 400, "bad_request")
    assert (
        "[[mcp_servers]] 'fx': an MCP server with `command` makes the daemon run a command"
        in error["message"]
    )
    assert "--allow-process-agents" in error["message"]
    assert fx.starts == [] and await snapshot(server) == before


@pytest.mark.parametrize("opt_in", [False, True])
async def test_a_header_secret_over_http_needs_the_operator_to_bind_it(
    server_factory, operator_declarations, opt_in
):
    # --allow-process-agents does not cover it: only the origin's own header_env does.
    server = await server_factory(allow_process_agents=opt_in)
    operator_declarations.mcp_origin("https://tools.example.com", "DESK_TOKEN")
    definition = agent_toml("http://127.0.0.1:9") + (
        '\n[[mcp_servers]]\nname = "web"\nurl = "https://tools.example.com/mcp"\n'
        'headers = { Authorization = "Bearer ${ANTHROPIC_API_KEY}" }\n'
    )
    response = await server.client.post(
        "/v1/agents", content=definition, headers={"Content-Type": "application/toml"}
    )
    error = assert_error(response, 400, "bad_request")
    assert error["message"] == (
        "the agent definition does not build: [[mcp_servers]] 'web': the headers name "
        "${ANTHROPIC_API_KEY}, which the operator did not bind to https://tools.example.com:443; "
        "the operator binds it with `salvor serve --mcp-origin ORIGIN[,header_env=VAR]`"
    )


async def test_a_json_definition_with_servers_registers_too(server_factory, fx):
    server = await server_factory(allow_process_agents=True)
    definition = {
        "model": "m",
        "llm": {"base_url": "http://127.0.0.1:9"},
        "mcp_servers": [
            {"name": "fx", "command": fx.command(), "results": {"delete_everything": {"ok": True}}}
        ],
    }
    response = await server.client.post(
        "/v1/agents", content=json.dumps(definition), headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 201, response.text
    assert fx.ledger == []
