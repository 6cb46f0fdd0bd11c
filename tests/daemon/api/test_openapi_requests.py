"""The OpenAPI document is true of the request bodies the daemon takes.

* Every request body the daemon takes is validated against the document the daemon serves
  (``Contract.check_request``), for every agent kind; a body it refuses for its shape must be
  one the document refuses too.
* The fields each handler takes (as its refusal of an unknown one lists them) are exactly the
  document's properties, body by body and table by table of an agent definition.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import httpx

from tests.support.backends import SQLITE_ONLY
from tests.support.contract import (
    GATED,
    GRAPH_PATHS,
    MISSING_RUN,
    REFUND_DESK,
    Contract,
    pointer,
)

# SQLite alone (tests/support/backends.py): what it tests is the document against the answers,
# which the handlers build the same way over either backend (tests/daemon/api/test_api keeps both).
STORE_BACKENDS = SQLITE_ONLY


def _agent_kinds(tmp_path: Path) -> dict[str, dict]:
    """One JSON definition of every agent kind, each field of its kind given at least once."""
    from tests.support.mcp_servers import FixtureServer

    fixture = tmp_path / "fx"
    fixture.mkdir()
    stdio = FixtureServer(fixture).command()
    return {
        "built-in": {
            **GATED,
            "max_response_tokens": 512,
            "record_prompts": True,
            "output_schema": None,
            "budgets": {"steps": 5, "cost_usd": 0.5},
            "pricing": {"input_per_mtok": 1, "output_per_mtok": 2},
            "llm": {"provider": "demo", "max_retries": 1, "timeout_seconds": 30, "stream": False},
            "description": "Settles refunds.",
            "flow_tools": ["ask_user", "finish"],
            "inputs": ["invoice_id", {"name": "reason", "description": "Why"}],
            "outputs": [
                "verdict",
                {"name": "amount", "type": "number", "description": "Cents", "required": False},
            ],
        },
        "built-in with MCP servers": {
            "model": "demo-planner",
            "llm": {"provider": "demo"},
            "tools": [{"name": "lookup_invoice"}],
            "mcp_servers": [
                {
                    "name": "fx",
                    "command": stdio[0],
                    "args": stdio[1:],
                    "env": {"FX": "1"},
                    "cwd": str(tmp_path),
                    "effects": {"lookup": "read"},
                    "results": {"delete_everything": {"ok": True}},
                    "tools": ["lookup", "write_note", "delete_everything"],
                    "timeout": 20,
                },
                {
                    "name": "fx2",
                    "command": " ".join(stdio),
                    "effect_overrides": {"hang": "idempotent"},
                    "tools": ["hang"],
                },
            ],
        },
        "process": {
            "kind": "process",
            "name": "p",
            "command": [sys.executable, "-c", "pass"],
            "cwd": str(tmp_path),
            "env": {"AGENT_MODE": "test"},
            "timeout": 30,
            "record_prompts": False,
            "description": "A local agent.",
            "inputs": ["task"],
            "outputs": [{"name": "answer", "type": "object"}],
            "salvor_mcp": False,
            "output_from": "stdout",
        },
        "process with MCP servers": {
            "kind": "process",
            "command": "python3 agent.py",
            "mcp_servers": [
                {"name": "fx", "command": stdio},
                {"name": "web", "url": "http://127.0.0.1:9/mcp", "port": 47001},
            ],
        },
        "service": {
            "kind": "service",
            "name": "s",
            "url": "http://127.0.0.1:9/trigger",
            "proxy_port": 47002,
            "headers": {"X-Team": "refunds"},
            "timeout": 10,
            "record_prompts": True,
        },
    }


async def test_every_agent_kind_is_a_request_the_document_admits(
    server_factory, operator_declarations, tmp_path
) -> None:
    """Each kind registers (201) and the served document admits the very body; a daemon without
    --allow-process-agents serves a document that does not admit a process or service agent,
    and refuses them."""
    operator_declarations.mcp_origin("http://127.0.0.1:9")
    operator_declarations.service_origin("http://127.0.0.1:9")
    kinds = _agent_kinds(tmp_path)
    server = await server_factory(allow_process_agents=True)
    contract = await Contract.served(server.client)
    for definition in kinds.values():
        await contract.call(server.client, "POST", "/v1/agents", expect=201, json=definition)
    # TOML says the same in another syntax, and is held to the same schema.
    await contract.call(
        server.client,
        "POST",
        "/v1/agents",
        expect=201,
        content=REFUND_DESK,
        headers={"Content-Type": "application/toml"},
    )
    assert contract.requests == {("/v1/agents", "post")}
    # `effects` and `effect_overrides` are one table under two names: the daemon takes one, and so
    # does the document.
    schema_pointer = pointer(
        "paths", "/v1/agents", "post", "requestBody", "content", "application/json", "schema"
    )
    both = {
        "model": "m",
        "llm": {"provider": "demo"},
        "mcp_servers": [{"name": "fx", "command": ["fx"], "effects": {}, "effect_overrides": {}}],
    }
    assert not contract.admits(schema_pointer, both)
    await contract.call(server.client, "POST", "/v1/agents", expect=400, json=both)
    # The flow fields' enums and names are the parser's: what it refuses, the document does not
    # admit.
    for flow_field in (
        {"flow_tools": ["ask_usr"]},
        {"flow_tools": ["finish", "finish"]},
        {"outputs": [{"name": "a", "type": "date"}]},
        {"outputs": ["summary"]},
        {"inputs": ["not a name"]},
        {"description": "x" * 1025},
    ):
        refused = {"model": "m", "llm": {"provider": "demo"}, **flow_field}
        assert not contract.admits(schema_pointer, refused), flow_field
        await contract.call(server.client, "POST", "/v1/agents", expect=400, json=refused)
    for process_field in ({"output_from": "stdin"}, {"salvor_mcp": "no"}):
        refused = {"kind": "process", "command": ["true"], **process_field}
        assert not contract.admits(schema_pointer, refused), process_field
        await contract.call(server.client, "POST", "/v1/agents", expect=400, json=refused)
    await server.stop()  # one daemon per store

    plain = await server_factory()
    narrow = await Contract.served(plain.client)
    for kind in ("process", "service", "process with MCP servers"):
        assert not narrow.admits(schema_pointer, kinds[kind]), kind
        await narrow.call(plain.client, "POST", "/v1/agents", expect=400, json=kinds[kind])
    assert narrow.admits(schema_pointer, kinds["built-in"])


_TAKES = re.compile(r"unknown field `zz_undocumented`; this endpoint takes (.+)$")
_ALLOWED = re.compile(r"unknown field `zz_undocumented` in .+; allowed: (.+)$")


def _properties(document: dict, schema: dict) -> set[str]:
    while "$ref" in schema:
        schema = document["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    if "oneOf" in schema and "properties" not in schema:  # a nullable object
        schema = next(s for s in schema["oneOf"] if s.get("type") != "null")
        return _properties(document, schema)
    return set(schema["properties"])


async def _taken(
    client: httpx.AsyncClient, path: str, body: dict, pattern: re.Pattern, **kwargs: Any
) -> set[str]:
    """The fields the handler takes, as its refusal of an unknown one names them."""
    response = await client.post(path, json=body, **kwargs)
    assert response.status_code == 400, f"{path}: {response.text}"
    found = pattern.search(response.json()["error"]["message"])
    assert found, f"{path}: {response.text}"
    return set(found.group(1).split(", "))


async def test_the_document_names_exactly_the_fields_each_handler_takes(server_factory) -> None:
    """Every JSON body, every table of an agent definition, and the run list's query: the names the
    handler lists when it refuses an unknown one are the document's, no more, no fewer. The two
    fields a file on disk may give and HTTP refuses are refused here."""
    server = await server_factory(allow_process_agents=True)
    api, document = server.client, (await server.client.get("/v1/openapi.json")).json()
    schemas = document["components"]["schemas"]
    opened = (await api.post("/v1/client-runs")).json()
    token = {"X-Drive-Token": opened["drive_token"]}
    probe = {"zz_undocumented": 1}

    checked = 0
    for template, operations in document["paths"].items():
        body = operations.get("post", {}).get("requestBody")
        # A graph document's fields are the validator's (tests/daemon/api/test_openapi_graphs.py).
        if template in ("/v1/agents", *GRAPH_PATHS) or body is None:
            continue
        if "application/json" not in body["content"]:
            continue  # an upload's body is an archive (tests/daemon/api/test_flow_uploads.py)
        run_id = opened["run"] if template.startswith("/v1/client-runs/") else MISSING_RUN
        taken = await _taken(api, template.format(run_id=run_id), probe, _TAKES, headers=token)
        assert taken == _properties(document, body["content"]["application/json"]["schema"]), (
            template
        )
        checked += 1
    assert checked == 17
    # A model step's request, checked whole by the step itself.
    taken = await _taken(
        api,
        f"/v1/client-runs/{opened['run']}/model-step",
        {"seq": 0, "request": probe},
        re.compile(r"`request` has an unknown field `zz_undocumented`; it takes (.+)$"),
        headers=token,
    )
    assert taken == set(schemas["ModelStep"]["properties"]["request"]["properties"])
    # The one query that refuses a name it does not take.
    response = await api.get("/v1/runs", params=probe)
    assert response.status_code == 400, response.text
    taken = re.fullmatch(
        r"unknown query parameter `zz_undocumented`; use (.+)", response.json()["error"]["message"]
    )
    assert taken, response.text
    assert set(taken.group(1).split(", ")) == {
        p["name"] for p in document["paths"]["/v1/runs"]["get"]["parameters"] if p["in"] == "query"
    }

    agents = "/v1/agents"
    tables = {
        "BuiltinAgent": ({}, {"system_prompt_path", "kind"}),
        "ProcessAgent": ({"kind": "process"}, set()),
        "ServiceAgent": ({"kind": "service"}, set()),
    }
    for name, (head, besides) in tables.items():
        assert (
            await _taken(api, agents, {**head, **probe}, _ALLOWED)
            == set(schemas[name]["properties"]) | besides
        )
    builtin = schemas["BuiltinAgent"]["properties"]
    for field in ("llm", "budgets", "pricing"):
        taken = await _taken(api, agents, {"model": "m", field: probe}, _ALLOWED)
        assert taken - {"base_url_env"} == _properties(document, builtin[field]), field
    assert await _taken(api, agents, {"model": "m", "tools": [probe]}, _ALLOWED) == _properties(
        document, builtin["tools"]["items"]
    )
    servers = _properties(document, schemas["McpServer"])
    assert await _taken(
        api, agents, {"model": "m", "mcp_servers": [probe]}, _ALLOWED
    ) == servers - {"port"}
    assert (
        await _taken(
            api, agents, {"kind": "process", "command": "x", "mcp_servers": [probe]}, _ALLOWED
        )
        == servers
    )

    # What the parser takes from a file but the document leaves out: HTTP refuses it.
    for definition, refusal in (
        (
            {"model": "m", "system_prompt_path": "prompt.txt"},
            "only read from agent files on the daemon's own disk",
        ),
        ({"model": "m", "llm": {"base_url_env": "HOME"}}, "only honoured in agent files"),
    ):
        response = await api.post(agents, json=definition)
        assert response.status_code == 400 and refusal in response.json()["error"]["message"], (
            response.text
        )
