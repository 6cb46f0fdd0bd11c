"""Registering agents over real HTTP: a definition stored and read back by its hash, an unknown
hash a 404, and a definition that does not build a 400 that registers nothing.

Each test talks to the real daemon (``serve``) on a loopback port, over a real SQLite file and,
when ``SALVOR_TEST_POSTGRES_URL`` is set, a real PostgreSQL. Every refusal is checked for the one
envelope, no traceback, and that the store is exactly as it was.
"""

from __future__ import annotations

import json
import re

from tests.support.api import assert_error, snapshot
from tests.support.api_server import Server, agent_toml
from tests.support.scripted_provider import tool_loop_script

# -- agents ------------------------------------------------------------------------


async def test_agents_register_list_and_read_back(server: Server, providers):
    provider = providers(tool_loop_script([]))
    plain = agent_toml(provider.base_url, tools=["lookup_invoice"])
    response = await server.client.post(
        "/v1/agents", content=plain, headers={"Content-Type": "application/toml"}
    )
    assert response.status_code == 201
    body = response.json()
    assert set(body) == {"agent", "created"} and body["created"] is True
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", body["agent"])
    anonymous = body["agent"]

    again = await server.client.post(
        "/v1/agents", content=plain, headers={"Content-Type": "application/toml"}
    )
    assert again.status_code == 201 and again.json() == {"agent": anonymous, "created": False}

    read = await server.client.get(f"/v1/agents/{anonymous}")
    assert read.status_code == 200
    assert read.json() == {
        "agent": anonymous,
        "format": "toml",
        "definition": plain,
        "kind": "builtin",
    }  # no `name` key at all

    # The same fields as JSON, with a display name: the name plays no part in the hash.
    fields = {
        "name": "support-triage",
        "model": "scripted-model",
        "system_prompt": "Triage.",
        "llm": {"provider": "anthropic", "base_url": provider.base_url, "max_retries": 0},
    }
    named_json = json.dumps(fields)
    response = await server.client.post(
        "/v1/agents", content=named_json, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 201 and response.json()["created"] is True
    named = response.json()["agent"]
    read = await server.client.get(f"/v1/agents/{named}")
    assert read.json() == {
        "agent": named,
        "format": "json",
        "definition": named_json,
        "name": "support-triage",
        "kind": "builtin",
    }
    # The same definition under another name: the same identity, renamed (its stored text is
    # the one that names it). One that names nothing leaves the name as it is.
    renamed = (
        'name = "billing desk"\nmodel = "scripted-model"\nsystem_prompt = "Triage."\n[llm]\n'
        f'provider = "anthropic"\nbase_url = "{provider.base_url}"\nmax_retries = 0\n'
    )
    response = await server.client.post(
        "/v1/agents", content=renamed, headers={"Content-Type": "application/toml"}
    )
    assert response.status_code == 201 and response.json() == {"agent": named, "created": False}
    unnamed = json.dumps({k: v for k, v in fields.items() if k != "name"})
    response = await server.client.post(
        "/v1/agents", content=unnamed, headers={"Content-Type": "application/json"}
    )
    assert response.json() == {"agent": named, "created": False}

    read = await server.client.get(f"/v1/agents/{named}")
    assert read.json() == {
        "agent": named,
        "format": "toml",
        "definition": renamed,
        "name": "billing desk",
        "kind": "builtin",
    }

    listing = (await server.client.get("/v1/agents")).json()
    assert set(listing) == {"agents"}
    assert listing["agents"] == [
        {"agent": anonymous},
        {"agent": named, "name": "billing desk"},
    ]  # still in the order they were first registered

    # A 64-character name is the longest allowed.
    response = await server.client.post(
        "/v1/agents",
        content=agent_toml(provider.base_url, name="n" * 64),
        headers={"Content-Type": "application/toml"},
    )
    assert response.status_code == 201


async def test_an_unregistered_agent_is_404(server: Server):
    assert_error(await server.client.get("/v1/agents/sha256:" + "0" * 64), 404, "unknown_agent")
    assert_error(await server.client.get("/v1/agents/not-even-a-hash"), 404, "unknown_agent")


def _bad_definitions(base_url: str) -> list[tuple[str | None, bytes]]:
    good = agent_toml(base_url)
    toml = "application/toml"
    return [
        ("text/plain", good.encode()),
        (None, good.encode()),
        ("application/x-www-form-urlencoded", good.encode()),
        (toml, b"model = "),
        (toml, b"\xff\xfe not utf-8"),
        (toml, b""),
        (toml, (good + "\nsurprise = 1\n").encode()),
        (toml, b'model = "m"\n[[tools]]\nname = "no_such_tool"\n'),
        (toml, agent_toml(base_url, name="n" * 65).encode()),
        (toml, agent_toml(base_url, name="   ").encode()),
        (toml, agent_toml(base_url, name="").encode()),
        (toml, b'name = 3\nmodel = "m"\n'),
        (toml, b'system_prompt = "no model"\n'),
        (toml, b'model = "m"\nkind = "process"\n'),
        (toml, b'model = "m"\n[budgets]\ntokens = inf\n'),
        (toml, b"a = " + b"[" * 5000 + b"]" * 5000),
        ("application/json", b'{"model": "m",'),
        ("application/json", b"[]"),
        ("application/json", b'"model"'),
        ("application/json", b'{"model": "m", "system_prompt": "\\ud800"}'),
        ("application/json", b'{"model": "m", "budgets": {"tokens": Infinity}}'),
        ("application/json", b"[" * 5000 + b"]" * 5000),
    ]


async def test_agent_definitions_that_do_not_build_are_400_and_register_nothing(
    server: Server, providers
):
    provider = providers(tool_loop_script([]))
    for content_type, body in _bad_definitions(provider.base_url):
        headers = {"Content-Type": content_type} if content_type else {}
        response = await server.client.post("/v1/agents", content=body, headers=headers)
        if content_type in ("application/toml", "application/json"):
            assert_error(response, 400, "bad_request")
        else:  # sent as none of the definition's types (or as none at all)
            assert_error(response, 415, "unsupported_media_type")
    assert (await server.client.get("/v1/agents")).json() == {"agents": []}
    assert await snapshot(server) == ([], [])
