"""Every duration an agent definition sets has a finite upper bound, refused over HTTP with a 400
that names the field and the bound: a process or service agent's ``timeout``, ``[llm]
timeout_seconds``, ``[budgets] wall_time_seconds`` and an MCP server's ``timeout``. The bound
itself is accepted; past it (by a second, or by 1e300) and numbers JSON cannot hold are not."""

from __future__ import annotations

import json
import sys

import pytest

from tests.support.backends import SQLITE_ONLY

# SQLite alone (tests/support/backends.py): what it tests is a definition's refusal.
STORE_BACKENDS = SQLITE_ONLY

BUILTIN = 'model = "scripted-model"\n[llm]\nprovider = "demo"\n'
MCP = f'[[mcp_servers]]\nname = "notes"\ncommand = {json.dumps(sys.executable)}\n'

# (field as a refusal names it, the bound in seconds, how it says it, the TOML that sets it to X)
FIELDS = [
    ("`timeout`", 604800, "7 days", 'kind = "process"\ncommand = ["true"]\ntimeout = X\n'),
    (
        "`timeout`",
        604800,
        "7 days",
        'kind = "service"\nurl = "http://127.0.0.1:9/run"\nproxy_port = 47001\ntimeout = X\n',
    ),
    ("`[llm] timeout_seconds`", 3600, "1 hour", BUILTIN + "timeout_seconds = X\n"),
    (
        "`[budgets] wall_time_seconds`",
        31536000,
        "365 days",
        BUILTIN + "[budgets]\nwall_time_seconds = X\n",
    ),
    # A process agent's server: one registration does not start (it is reached through a stand-in).
    ("`timeout`", 86400, "1 day", 'kind = "process"\ncommand = ["true"]\n' + MCP + "timeout = X\n"),
]
IDS = ["process", "service", "llm", "wall_time", "mcp_server"]


async def register(server, text: str, content_type: str = "application/toml"):
    return await server.client.post(
        "/v1/agents", content=text, headers={"Content-Type": content_type}
    )


@pytest.mark.parametrize(("field", "bound", "said", "toml"), FIELDS, ids=IDS)
async def test_a_duration_past_its_bound_is_a_400_naming_the_field_and_the_bound(
    server_factory, operator_declarations, field, bound, said, toml
):
    operator_declarations.service_origin("http://127.0.0.1:9")  # the service agent's trigger
    server = await server_factory(allow_process_agents=True)
    for value in ("1e300", str(bound + 1), f"{bound}.001"):
        response = await register(server, toml.replace("X", value))
        assert response.status_code == 400, (value, response.text)
        error = response.json()["error"]
        assert error["code"] == "bad_request"
        assert field in error["message"] and f"at most {bound} ({said})" in error["message"], (
            value,
            error,
        )
    # inf, -inf and nan as TOML spells them: not JSON numbers, refused before any bound.
    for value in ("inf", "+inf", "nan"):
        response = await register(server, toml.replace("X", value))
        assert response.status_code == 400, (value, response.text)
        assert response.json()["error"]["code"] == "bad_request"
    assert (await server.client.get("/v1/agents")).json() == {"agents": []}
    response = await register(server, toml.replace("X", str(bound)))
    assert response.status_code == 201, response.text


async def test_json_numbers_past_a_double_are_refused_too(server_factory):
    server = await server_factory(allow_process_agents=True)
    for value, said in (("1e400", "out of range"), ("1e300", "at most"), ("604801", "at most")):
        text = f'{{"kind": "process", "command": ["true"], "timeout": {value}}}'
        response = await register(server, text, "application/json")
        assert response.status_code == 400, (value, response.text)
        assert response.json()["error"]["code"] == "bad_request"
        assert said in response.json()["error"]["message"], response.text


async def test_the_api_document_states_each_bound(server):
    schemas = (await server.client.get("/v1/openapi.json")).json()["components"]["schemas"]
    builtin = schemas["BuiltinAgent"]["properties"]
    stated = {
        "process timeout": schemas["ProcessAgent"]["properties"]["timeout"],
        "service timeout": schemas["ServiceAgent"]["properties"]["timeout"],
        "llm timeout_seconds": builtin["llm"]["properties"]["timeout_seconds"],
        "wall_time_seconds": builtin["budgets"]["properties"]["wall_time_seconds"],
        "mcp server timeout": schemas["McpServer"]["properties"]["timeout"],
    }
    assert {name: schema["maximum"] for name, schema in stated.items()} == {
        "process timeout": 604800,
        "service timeout": 604800,
        "llm timeout_seconds": 3600,
        "wall_time_seconds": 31536000,
        "mcp server timeout": 86400,
    }
