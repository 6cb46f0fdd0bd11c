"""What a caller sends is bounded before it is parsed or compiled, and each bound refused with the
one envelope naming it, storing nothing: an agent definition's size, a YAML document's events,
a JSON Schema's values, enum and patterns, a graph's approval schemas together.

The payloads of ``test_stall.py`` at their worst, here at just past each bound (a gate's
catastrophic pattern is there: what it refuses is unchanged, only how long that takes).
"""

from __future__ import annotations

import json

import httpx
from salvor.daemon.agents import MAX_DEFINITION_BYTES
from salvor.protocol._graph_shape import MAX_GRAPH_SCHEMA_BYTES
from salvor.protocol._schema import MAX_SCHEMA_BYTES, MAX_SCHEMA_ENUM, MAX_SCHEMA_VALUES
from salvor.protocol._yaml import MAX_YAML_EVENTS

from tests.bench.bench_stall import gate_graph
from tests.support.api import assert_error, snapshot
from tests.support.api_server import Server

TOML = {"content-type": "application/toml"}
MARKDOWN = {"content-type": "text/markdown"}
YAML = {"content-type": "application/yaml"}


async def stored(server: Server) -> tuple:
    """Every run, agent and graph the store holds."""
    graphs = (await server.client.get("/v1/graphs")).json()["graphs"]
    return await snapshot(server), sorted(g["graph"] for g in graphs)


def toml_agent(**extra: str) -> str:
    lines = ['model = "claude-sonnet-4-5"', 'system_prompt = "You answer."']
    return "\n".join(lines + [f"{key} = {value}" for key, value in extra.items()]) + "\n"


async def post_agent(server: Server, text: str, headers: dict) -> httpx.Response:
    return await server.client.post("/v1/agents", content=text.encode(), headers=headers)


async def test_an_agent_definition_over_its_bound_is_413_naming_it(server: Server) -> None:
    before = await stored(server)
    prompt = "x" * MAX_DEFINITION_BYTES
    cases = {
        "TOML": (toml_agent(description='"d"').replace("You answer.", prompt), TOML),
        "JSON": (
            json.dumps({"model": "m", "system_prompt": prompt}),
            {"content-type": "application/json"},
        ),
        "markdown": ("---\nname: big\nmodel: m\n---\n" + prompt + "\n", MARKDOWN),
    }
    for case, (text, headers) in cases.items():
        error = assert_error(await post_agent(server, text, headers), 413, "payload_too_large")
        assert error["message"] == (
            f"an agent definition may be at most {MAX_DEFINITION_BYTES} bytes; this body is over it"
        ), case
    assert await stored(server) == before
    # Just under it, the same definition is parsed and stored.
    response = await post_agent(server, toml_agent().replace("You answer.", "x" * 1000), TOML)
    assert response.status_code == 201, response.text


async def test_a_front_matter_of_too_many_yaml_events_is_refused_naming_the_bound(
    server: Server,
) -> None:
    before = await stored(server)
    values = ", ".join("a" for _ in range(MAX_YAML_EVENTS))
    text = f"---\nname: many\nmodel: m\ntools: [{values}]\n---\nYou answer.\n"
    assert len(text.encode()) < MAX_DEFINITION_BYTES
    error = assert_error(await post_agent(server, text, MARKDOWN), 400, "bad_request")
    assert f"more than {MAX_YAML_EVENTS} YAML values" in error["message"], error
    assert await stored(server) == before


async def test_an_output_schema_over_a_bound_is_refused_naming_it(server: Server) -> None:
    before = await stored(server)
    cases = {
        "enum": (
            "[output_schema]\nenum = ["
            + ", ".join(str(i) for i in range(MAX_SCHEMA_ENUM + 1))
            + "]",
            f"an enum may have at most {MAX_SCHEMA_ENUM}",
        ),
        "values": (
            "[output_schema]\ntype = 'object'\nrequired = ["
            + ", ".join(f"'p{i}'" for i in range(MAX_SCHEMA_VALUES))
            + "]",
            f"more than {MAX_SCHEMA_VALUES} values",
        ),
        "text": (
            f"[output_schema]\ndescription = '{'x' * MAX_SCHEMA_BYTES}'",
            f"a schema may have at most {MAX_SCHEMA_BYTES}",
        ),
        "backreference": (
            "[output_schema]\ntype = 'string'\npattern = '^(a)\\1$'",
            "the pattern at $.pattern",
        ),
        "lookahead": (
            "[output_schema.patternProperties.'(?=x)y']\ntype = 'string'",
            "the pattern at $.patternProperties ('(?=x)y') does not compile",
        ),
    }
    for case, (table, named) in cases.items():
        response = await post_agent(server, toml_agent() + table + "\n", TOML)
        error = assert_error(response, 400, "bad_request")
        assert named in error["message"], (case, error)
    assert await stored(server) == before


async def test_a_graph_over_a_bound_is_invalid_naming_it(server: Server) -> None:
    before = await stored(server)
    enum = gate_graph({"enum": [f"value-{i}" for i in range(300_000)]})
    many_yaml = (
        "schema_version: 1\nedges: []\nnodes: [" + ", ".join(["1"] * MAX_YAML_EVENTS) + "]\n"
    )
    # Distinct schemas, each within its own bound, that together are over the graph's.
    filler = "x" * (MAX_SCHEMA_BYTES - 1024)
    schemas = {
        "schema_version": 1,
        "nodes": [
            {
                "id": f"g{i}",
                "kind": "gate",
                "prompt": "Approve?",
                "approval_schema": {"description": filler, "minProperties": i},
            }
            for i in range(MAX_GRAPH_SCHEMA_BYTES // len(filler) + 1)
        ],
        "edges": [],
    }
    cases = {
        "enum": (json.dumps(enum), {}, f"an enum may have at most {MAX_SCHEMA_ENUM}"),
        "YAML events": (many_yaml, YAML, f"more than {MAX_YAML_EVENTS} YAML values"),
        "schemas together": (json.dumps(schemas), {}, f"more than {MAX_GRAPH_SCHEMA_BYTES} bytes"),
    }
    for case, (body, headers, named) in cases.items():
        for route in ("/v1/graphs/validate", "/v1/graphs"):
            response = await server.client.post(
                route,
                content=body.encode(),
                headers={"content-type": "application/json", **headers},
            )
            if route == "/v1/graphs":
                errors = assert_error(response, 400, "invalid_graph")["details"]["errors"]
            else:
                assert response.status_code == 200, response.text
                assert response.json()["valid"] is False
                errors = response.json()["errors"]
            assert any(named in e["message"] for e in errors), (case, route, errors)
    assert await stored(server) == before
