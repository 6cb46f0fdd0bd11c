"""Markdown agent files over HTTP: registered as ``text/markdown``, kept verbatim as format
``md``, hashed as their TOML twin, held to the same opt-in rules, and run like any agent."""

from __future__ import annotations

import json

from tests.support.api import assert_error, snapshot
from tests.support.api_server import Server
from tests.support.scripted_provider import tool_loop_script

MARKDOWN = {"Content-Type": "text/markdown"}


def reviewer_md(base_url: str, extra: str = "") -> str:
    return (
        "---\n"
        "name: reviewer\n"
        "description: Looks an invoice up and says what it found.\n"
        "model: scripted-model\n"
        "tools: lookup_invoice\n"
        f"llm:\n  provider: anthropic\n  base_url: {json.dumps(base_url)}\n  max_retries: 0\n"
        f"{extra}"
        "---\n"
        "You settle refunds.\n"
    )


def reviewer_toml(base_url: str) -> str:
    return (
        'name = "reviewer"\n'
        'description = "Looks an invoice up and says what it found."\n'
        'model = "scripted-model"\nsystem_prompt = "You settle refunds."\n'
        f'[llm]\nprovider = "anthropic"\nbase_url = "{base_url}"\nmax_retries = 0\n'
        '[[tools]]\nname = "lookup_invoice"\n'
    )


async def test_a_markdown_agent_registers_reads_back_and_runs(server: Server, providers):
    provider = providers(
        tool_loop_script([("lookup_invoice", {"invoice_id": "INV-1"})], final_text="found it")
    )
    text = reviewer_md(provider.base_url)
    response = await server.client.post("/v1/agents", content=text, headers=MARKDOWN)
    assert response.status_code == 201, response.text
    agent = response.json()["agent"]
    read = await server.client.get(f"/v1/agents/{agent}")
    assert read.json() == {
        "agent": agent,
        "format": "md",
        "definition": text,
        "name": "reviewer",
        "kind": "builtin",
    }
    # Its TOML twin is the same agent: registering it stores nothing new.
    twin = await server.client.post(
        "/v1/agents",
        content=reviewer_toml(provider.base_url),
        headers={"Content-Type": "application/toml"},
    )
    assert twin.json() == {"agent": agent, "created": False}

    run_id = await server.start_run(agent, {"invoice_id": "INV-1"})
    rested = await server.wait_resting(run_id)
    assert rested["status"] == {"state": "completed", "output": "found it"}
    assert len(provider.calls) == 2
    assert provider.calls[0].body["system"] == "You settle refunds."


async def test_a_markdown_agent_is_held_to_the_opt_in_rules_and_its_refusals_change_nothing(
    server: Server, providers
):
    provider = providers(tool_loop_script([]))
    before = await snapshot(server)
    spawning = reviewer_md(provider.base_url, 'mcp_servers:\n  - name: fs\n    command: ["npx"]\n')
    response = await server.client.post("/v1/agents", content=spawning, headers=MARKDOWN)
    error = assert_error(response, 400, "bad_request")
    assert "--allow-process-agents" in error["message"]
    for bad, fragment in (
        ("no front matter\n", "opens with `---`"),
        (reviewer_md(provider.base_url).replace("tools:", "toolz:"), "did you mean `tools`?"),
        (reviewer_md(provider.base_url).replace("model: scripted-model\n", ""), "`model`"),
    ):
        response = await server.client.post("/v1/agents", content=bad, headers=MARKDOWN)
        error = assert_error(response, 400, "bad_request")
        assert fragment in error["message"]
    assert await snapshot(server) == before


async def test_the_document_describes_a_markdown_body(server: Server):
    document = (await server.client.get("/v1/openapi.json")).json()
    content = document["paths"]["/v1/agents"]["post"]["requestBody"]["content"]
    assert content["text/markdown"]["schema"]["type"] == "string"
    agent = document["components"]["schemas"]["Agent"]["properties"]["format"]
    assert agent["enum"] == ["toml", "json", "md"]
