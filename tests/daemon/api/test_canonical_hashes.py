"""Hashes over real HTTP are RFC 8785: what a client recomputes with the ``rfc8785`` package.

A caller's integer beyond ±(2**53 - 1) has no RFC 8785 form, so every body
that holds one is refused (400 ``bad_request`` naming the number) before
anything is recorded. What a model answers is recorded, not refused: a big
integer in a tool call's input is carried exactly and the run completes.
"""

from __future__ import annotations

import functools
import hashlib
import json
import sys
import tomllib

import pytest
import rfc8785
from salvor.protocol import Suspended, decode_envelope, sha256_hash

from tests.daemon.agents.test_process_agent import SECRET
from tests.daemon.api.test_process_agents import definition as process_definition
from tests.support.api import assert_error, read_log_independently, seed_run, snapshot
from tests.support.api_server import agent_toml
from tests.support.mcp_servers import FixtureServer
from tests.support.mcp_standin_agents import AGENT as MCP_AGENT
from tests.support.scripted_provider import tool_loop_script

BIG = 2**53  # the first integer RFC 8785 (and the `rfc8785` package) cannot write
ONE_IN_RANGE = 2**53 - 1
APPROVAL = {"type": "object", "required": ["approved"]}


def jcs_hash(document: object) -> str:
    return "sha256:" + hashlib.sha256(rfc8785.dumps(document)).hexdigest()


async def test_every_body_holding_a_big_integer_is_refused_and_changes_nothing(
    server, providers
) -> None:
    client = server.client
    provider = providers(tool_loop_script([]))
    agent = await server.register_agent(agent_toml(provider.base_url))
    suspended = await seed_run(server, agent, Suspended(reason="approve?", input_schema=APPROVAL))
    opened = (await client.post("/v1/client-runs", json={})).json()
    client_run, token = opened["run"], {"X-Drive-Token": opened["drive_token"]}
    started = {
        "run_id": client_run,
        "seq": 0,
        "schema_version": 1,
        "recorded_at": "1970-01-01T00:00:00Z",
        "event": {"kind": "RunStarted", "payload": {"agent_def_hash": agent, "input": None}},
    }
    response = await client.post(
        f"/v1/client-runs/{client_run}/events", json={"events": [started]}, headers=token
    )
    assert response.status_code == 200, response.text
    definition = {
        "model": "scripted-model",
        "llm": {"base_url": provider.base_url},
        "output_schema": {
            "type": "object",
            "properties": {"n": {"type": "integer", "maximum": BIG}},
        },
    }
    completed = {
        **started,
        "seq": 1,
        "event": {"kind": "RunCompleted", "payload": {"output": {"n": -BIG}}},
    }
    model_request = {
        "model": "scripted-model",
        "max_tokens": BIG,
        "messages": [{"role": "user", "content": "hi"}],
    }
    refusals = [
        (
            "/v1/agents",
            {"content": json.dumps(definition), "headers": {"Content-Type": "application/json"}},
            BIG,
        ),
        (
            "/v1/agents",
            {
                "content": agent_toml(provider.base_url, extra=f"max_response_tokens = {BIG + 1}"),
                "headers": {"Content-Type": "application/toml"},
            },
            BIG + 1,
        ),
        ("/v1/runs", {"json": {"agent": agent, "input": {"invoice": "INV-1", "cents": BIG}}}, BIG),
        (
            f"/v1/runs/{suspended}/resume",
            {"json": {"input": {"approved": True, "ticket": -BIG}}},
            -BIG,
        ),
        (
            f"/v1/client-runs/{client_run}/events",
            {"json": {"events": [completed]}, "headers": token},
            -BIG,
        ),
        (
            f"/v1/client-runs/{client_run}/model-step",
            {"json": {"seq": 1, "request": model_request}, "headers": token},
            BIG,
        ),
        (
            f"/v1/client-runs/{client_run}/tool-step",
            {
                "json": {
                    "seq": 1,
                    "tool": "lookup_invoice",
                    "input": {"invoice_id": "INV-1", "n": 2**64},
                },
                "headers": token,
            },
            2**64,
        ),
    ]
    for path, request, number in refusals:
        before = await snapshot(server)
        response = await client.post(path, **request)
        error = assert_error(response, 400, "bad_request")
        assert (
            f"holds the integer {number}, outside ±{ONE_IN_RANGE} (2**53 - 1)" in error["message"]
        ), path
        assert error["message"].endswith("send it as a string"), path
        assert await snapshot(server) == before, path
    # One below the bound is an ordinary integer, accepted and hashed as RFC 8785 writes it.
    response = await client.post(
        "/v1/runs", json={"agent": agent, "input": {"cents": ONE_IN_RANGE}}
    )
    assert response.status_code == 201, response.text


async def test_agent_def_hash_is_the_rfc8785_hash_of_the_definition_without_its_name(
    server, providers
) -> None:
    provider = providers(tool_loop_script([]))
    # Floats JavaScript writes its own way; keys whose UTF-16 order is not their code-point order.
    definition = {
        "name": "jcs-check",
        "model": "scripted-model",
        "system_prompt": 'Say "hi"\n\ttab \u2028 \U0001f600 \x7f',
        "max_response_tokens": 512,
        "llm": {
            "provider": "anthropic",
            "base_url": provider.base_url,
            "timeout_seconds": 120.0,
            "max_retries": 0,
        },
        "budgets": {"cost_usd": 1e21, "wall_time_seconds": 0.000001, "tokens": ONE_IN_RANGE},
        "pricing": {"input_per_mtok": 3.0, "output_per_mtok": 5e-7},
        "output_schema": {
            "type": "object",
            "properties": {
                "\U0001f600": {"type": "string"},
                "\ue000": {"type": "number", "minimum": -0.0},
                "\uffff": {"type": "integer"},
                "b": {"type": "boolean"},
            },
        },
    }
    hashed = {key: value for key, value in definition.items() if key != "name"}
    response = await server.client.post(
        "/v1/agents",
        content=json.dumps(definition, ensure_ascii=False).encode(),
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 201, response.text
    assert response.json()["agent"] == jcs_hash(hashed)

    # TOML: the hash is over the parsed document, as JSON, without its name.
    text = agent_toml(
        provider.base_url,
        name="toml-check",
        extra="[budgets]\ncost_usd = 2.5\nsteps = 24\n[pricing]\ninput_per_mtok = 3.0\n"
        "output_per_mtok = 1e-7\n",
    )
    response = await server.client.post(
        "/v1/agents", content=text, headers={"Content-Type": "application/toml"}
    )
    assert response.status_code == 201, response.text
    parsed = tomllib.loads(text)
    del parsed["name"]
    assert response.json()["agent"] == jcs_hash(parsed)


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (
            '[output_schema]\ntype = "object"\ndefault = 1979-05-27\n',
            "holds 1979-05-27 (a date), which JSON cannot",
        ),
        (
            '[output_schema]\ntype = "number"\nmaximum = inf\n',
            "holds inf, which is not a JSON number",
        ),
    ],
    ids=["date", "inf"],
)
async def test_a_toml_value_json_cannot_carry_is_refused_400(
    server, providers, extra: str, fragment: str
) -> None:
    provider = providers(tool_loop_script([]))
    before = await snapshot(server)
    response = await server.client.post(
        "/v1/agents",
        content=agent_toml(provider.base_url, extra=extra),
        headers={"Content-Type": "application/toml"},
    )
    error = assert_error(response, 400, "bad_request")
    assert fragment in error["message"]
    assert await snapshot(server) == before


async def test_a_models_big_integer_is_recorded_exactly_and_the_run_completes(
    server, providers
) -> None:
    # Snowflake-style ids run past 2**53: a model may well put one in a tool call.
    order = 1234567890123456789012
    provider = providers(
        tool_loop_script([("lookup_invoice", {"invoice_id": "INV-7", "order": order})])
    )
    agent = await server.register_agent(agent_toml(provider.base_url, tools=["lookup_invoice"]))
    run_id = await server.start_run(agent, {"task": "look it up"})
    body = await server.wait_resting(run_id)
    assert body["status"] == {"state": "completed", "output": "done"}, body

    log = await read_log_independently(server.store_url, run_id)
    (requested,) = [e.event for e in log if e.event.KIND.value == "ToolCallRequested"]
    assert requested.input == {"invoice_id": "INV-7", "order": order}
    # The second model call carried the model's own tool_use back, big integer and all.
    assert json.dumps(order) in json.dumps(provider.calls[-1].request)

    # The stream reads back with the one envelope parser, the integer to the digit.
    response = await server.client.get(f"/v1/runs/{run_id}/events")
    frames = [frame for frame in response.text.split("\n\n") if frame.startswith("id: ")]
    envelopes = [decode_envelope(frame.split("data: ", 1)[1]) for frame in frames]
    assert [e.seq for e in envelopes] == [e.seq for e in log]
    assert [e.event for e in envelopes] == [e.event for e in log]


async def test_a_process_agent_relays_a_models_big_integer_through_the_proxy(
    server_factory, providers, tmp_path, monkeypatch
) -> None:
    # The agent sends the model's tool_use back in its next request: the proxy reads it exactly
    # (refusing it, as the control plane would, would fail the run over the model's own words).
    order = 2**70
    server = await server_factory(allow_process_agents=True)
    plan = [("lookup_invoice", {"invoice": "A-1", "order": order})]
    provider = providers(tool_loop_script(plan, final_text="settled"))
    monkeypatch.setenv("SALVOR_AGENT_UPSTREAM", provider.base_url)
    monkeypatch.setenv("SALVOR_AGENT_KEY", SECRET)
    agent = await server.register_agent(process_definition(tmp_path, "anthropic"))
    run_id = await server.start_run(agent, "settle A-1")
    body = await server.wait_resting(run_id)
    assert body["status"] == {"state": "completed", "output": {"reply": "settled", "exit_code": 0}}
    assert provider.call_count == 2
    assert json.dumps(order) in json.dumps(provider.calls[-1].body)


@pytest.mark.parametrize("fmt", ["toml", "json"])
async def test_an_agent_stored_before_the_rule_still_runs_under_its_old_hash(
    server, providers, fmt: str
) -> None:
    # An older daemon accepted (and hashed, with all the digits) a definition with an integer past
    # 2**53. A new registration of it is refused, but the stored copy loads, so its runs go on.
    provider = providers(tool_loop_script([]))
    if fmt == "toml":
        text = agent_toml(provider.base_url, extra=f"[budgets]\ntokens = {BIG + 1}\n")
        old_hash = sha256_hash(tomllib.loads(text))
    else:
        document = {
            "model": "scripted-model",
            "budgets": {"tokens": 2**60},
            "llm": {"base_url": provider.base_url, "max_retries": 0},
        }
        text, old_hash = json.dumps(document), sha256_hash(document)
    response = await server.client.post(
        "/v1/agents", content=text, headers={"Content-Type": f"application/{fmt}"}
    )
    assert_error(response, 400, "bad_request")
    store = server.state.runtime.access.store
    put = functools.partial(
        store.definitions.put_agent, old_hash, format=fmt, definition=text, name=None
    )
    await server.state.runtime.access.read(put)

    run_id = await server.start_run(old_hash, {"task": "go"})
    body = await server.wait_resting(run_id)
    assert body["status"] == {"state": "completed", "output": "done"}, body
    log = await read_log_independently(server.store_url, run_id)
    assert log[0].event.agent_def_hash == old_hash


async def test_a_process_agent_passes_a_models_big_integer_to_an_mcp_server_through_its_stand_in(
    server_factory, providers, tmp_path, monkeypatch
) -> None:
    # The model's tool call arguments go to the stand-in endpoint as a JSON-RPC body: read
    # exactly there too, recorded, and handed to the real server to the digit.
    order = 2**70
    server = await server_factory(allow_process_agents=True)
    provider = providers(
        tool_loop_script([("lookup", {"key": "a", "n": order})], final_text="found")
    )
    monkeypatch.setenv("SALVOR_AGENT_UPSTREAM", provider.base_url)
    monkeypatch.setenv("SALVOR_AGENT_KEY", SECRET)
    (tmp_path / "fx").mkdir()
    fx = FixtureServer(tmp_path / "fx")
    script = tmp_path / "mcp_agent.py"
    script.write_text(MCP_AGENT)
    text = (
        f'kind = "process"\ncommand = {json.dumps([sys.executable, str(script), "http"])}\n'
        f"cwd = {json.dumps(str(tmp_path))}\ntimeout = 60\n"
        f'[[mcp_servers]]\nname = "fix"\ncommand = {fx.toml_command()}\n'
        'effects = { lookup = "read" }\n'
    )
    agent = await server.register_agent(text)
    run_id = await server.start_run(agent, "look it up")
    body = await server.wait_resting(run_id)
    assert body["status"] == {"state": "completed", "output": {"reply": "found", "exit_code": 0}}
    assert [call["arguments"] for call in fx.calls_of("lookup")] == [{"key": "a", "n": order}]
    log = await read_log_independently(server.store_url, run_id)
    calls = [e.event.input for e in log if e.event.KIND.value == "ToolCallRequested"]
    assert calls[-1]["arguments"] == {"key": "a", "n": order}
