"""No secret leaves through a definition (issue 29, item 3): one rule for every kind.

A real daemon on loopback and a capture server that records every connection and every byte
sent to it. Whatever the kind (built-in, process, service) and whatever the MCP server form, a
definition that names a URL on an origin the operator did not declare, or a header variable the
operator did not bind, is refused at registration (the one envelope, naming the field, quoting
no secret, storing nothing) and, stored before the operator changed the flags, fails its run
with a sentence: the capture server sees no connection at all, so no secret.
"""

from __future__ import annotations

import json
import sys

import pytest
from salvor.daemon.agents import parse_definition
from salvor.daemon.agents._credentials import Credentials

from tests.support.api import assert_error, snapshot
from tests.support.api_server import agent_toml
from tests.support.capture import CaptureServer
from tests.support.scripted_provider import text_reply

SECRET_VAR, SECRET = "DESK_VAULT_TOKEN", "tok-vault-8d21c0"
UPSTREAM = "sk-upstream-3f7a55"
ORIGIN_HINT = "salvor serve --mcp-origin ORIGIN[,header_env=VAR]"
SERVICE_HINT = "salvor serve --service-origin ORIGIN[,header_env=VAR]"


@pytest.fixture
def capture():
    server = CaptureServer()
    yield server
    server.stop()


@pytest.fixture
def secrets(monkeypatch):
    """The daemon's secrets: a variable a definition might name, and the agents' upstream key."""
    monkeypatch.setenv(SECRET_VAR, SECRET)
    monkeypatch.setenv("SALVOR_AGENT_KEY", UPSTREAM)


# An agent that speaks MCP to its `web` server through the stand-in endpoint salvor gives it.
MCP_AGENT = r"""
import json, os, urllib.request
body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {},
    "clientInfo": {"name": "probe", "version": "1"}}}
request = urllib.request.Request(
    os.environ["SALVOR_MCP_URL_WEB"], data=json.dumps(body).encode(),
    headers={"Content-Type": "application/json",
             "Accept": "application/json, text/event-stream"})
try:
    urllib.request.urlopen(request, timeout=20).read()
except Exception as exc:
    print(exc)
"""


def _process(server_toml: str) -> str:
    command = json.dumps([sys.executable, "-c", MCP_AGENT])
    return f'kind = "process"\ncommand = {command}\ntimeout = 30\nsalvor_mcp = false\n' + (
        f'[[mcp_servers]]\nname = "web"\n{server_toml}'
    )


def _service(url: str, headers: str = "") -> str:
    return f'kind = "service"\nurl = "{url}/trigger"\nproxy_port = 47311\ntimeout = 10\n{headers}'


# Each hole: the definition (aimed at the capture server), and the refusal's sentence.
def _holes(url: str, provider: str) -> dict[str, tuple[str, str]]:
    origin = url
    return {
        "a service agent's url on an undeclared origin": (
            _service(url),
            (
                f"`url` '{origin}' is not a service origin this daemon's operator declared, so it "
                f"is not contacted; the operator allows one with `{SERVICE_HINT}`"
            ),
        ),
        "a service agent's header naming any variable": (
            _service(url, f'[headers]\nX-Desk = "Bearer ${{{SECRET_VAR}}}"\n'),
            (
                f"`headers` value of X-Desk names ${{{SECRET_VAR}}}, which the operator did not "
                f"bind to {origin}; the operator binds it with `{SERVICE_HINT}`"
            ),
        ),
        "a process agent's MCP url server": (
            _process(f'url = "{url}/mcp"\n'),
            (
                f"[[mcp_servers]] 'web': `url` '{origin}' is not an MCP origin this daemon's "
                f"operator declared, so it is not contacted; the operator allows one with "
                f"`{ORIGIN_HINT}`"
            ),
        ),
        "a process agent's MCP header naming any variable": (
            _process(f'url = "{url}/mcp"\nheaders = {{ X-Desk = "${{{SECRET_VAR}}}" }}\n'),
            (
                f"[[mcp_servers]] 'web': the headers name ${{{SECRET_VAR}}}, which the operator "
                f"did not bind to {origin}; the operator binds it with `{ORIGIN_HINT}`"
            ),
        ),
        "a process agent's MCP bearer_token_env": (
            _process(f'url = "{url}/mcp"\nbearer_token_env = "SALVOR_AGENT_KEY"\n'),
            (
                f"[[mcp_servers]] 'web': the headers name ${{SALVOR_AGENT_KEY}}, which the "
                f"operator did not bind to {origin}; the operator binds it with `{ORIGIN_HINT}`"
            ),
        ),
    }


# Which origins each hole's definition needs declared to get past the URL check to its header.
_DECLARED = {
    "a service agent's header naming any variable": ("service",),
    "a process agent's MCP header naming any variable": ("mcp",),
    "a process agent's MCP bearer_token_env": ("mcp",),
}
HOLES = list(_holes("http://x", "http://p"))


@pytest.mark.parametrize("hole", HOLES)
async def test_registration_refuses_what_the_operator_did_not_declare(
    server_factory, operator_declarations, capture, secrets, hole
):
    for dialled_by in _DECLARED.get(hole, ()):
        # The origin alone, with no variable bound to it.
        getattr(operator_declarations, f"{dialled_by}_origin")(capture.url)
    server = await server_factory(allow_process_agents=True)
    before = await snapshot(server)
    definition, message = _holes(capture.url, "")[hole]

    response = await server.client.post(
        "/v1/agents", content=definition, headers={"Content-Type": "application/toml"}
    )

    error = assert_error(response, 400, "bad_request")
    assert error["message"] == f"the agent definition does not build: {message}"
    assert SECRET not in response.text and UPSTREAM not in response.text
    assert await snapshot(server) == before
    assert capture.connections == 0


async def test_what_the_operator_declared_is_dialled_with_exactly_the_bound_variable(
    server_factory, operator_declarations, capture, secrets
):
    # The other side of the same rule: a service on a declared origin, its header bound.
    operator_declarations.service_origin(capture.url, SECRET_VAR)
    server = await server_factory(allow_process_agents=True)
    definition = _service(capture.url, f'[headers]\nX-Desk = "Bearer ${{{SECRET_VAR}}}"\n')
    agent = await server.register_agent(definition)
    body = await server.wait_resting(await server.start_run(agent, "settle it"))
    assert body["status"]["state"] == "failed"  # it answered without a model call
    assert capture.connections == 1
    assert f"X-Desk: Bearer {SECRET}".encode() in capture.seen
    assert b"settle it" in capture.seen and UPSTREAM.encode() not in capture.seen


# -- stored before the flags changed: the run fails, nothing is dialled --------------------------


def _stored(url: str, provider: str) -> dict[str, tuple[str, str]]:
    """Definitions a daemon once accepted, each with what its run's failure must say."""
    return {
        **{hole: (text, message) for hole, (text, message) in _holes(url, provider).items()},
        "a built-in agent's key sent to an undeclared endpoint": (
            (
                'model = "m"\nsystem_prompt = "s"\n[llm]\nprovider = "anthropic"\n'
                f'base_url = "{url}"\napi_key_env = "{SECRET_VAR}"\nmax_retries = 0\n'
            ),
            f"[llm] base_url '{url}' is not a model endpoint this daemon's operator declared",
        ),
        "a built-in agent's MCP header naming any variable": (
            agent_toml(provider)
            + f'\n[[mcp_servers]]\nname = "web"\nurl = "{url}/mcp"\n'
            + f'headers = {{ X-Desk = "${{{SECRET_VAR}}}" }}\n',
            (
                f"[[mcp_servers]] 'web': `url` '{url}' is not an MCP origin this daemon's operator "
                "declared"
            ),
        ),
    }


STORED = list(_stored("http://x", "http://p"))


@pytest.mark.parametrize("hole", STORED)
async def test_a_definition_stored_before_the_flags_changed_fails_its_run_unsent(
    server_factory, operator_declarations, capture, secrets, providers, hole
):
    provider = providers([text_reply("done")])
    for dialled_by in _DECLARED.get(hole, ()):
        # The origin is still declared; the variable's binding is what the operator took back.
        getattr(operator_declarations, f"{dialled_by}_origin")(capture.url)
    server = await server_factory(allow_process_agents=True)
    text, message = _stored(capture.url, provider.base_url)[hole]
    # Straight into the store, as a daemon with other flags once accepted it.
    agent = parse_definition(text, "toml")
    await server.state.runtime.definitions.register_agent(agent)

    run = await server.start_run(agent.agent_def_hash, "settle it")
    body = await server.wait_resting(run)

    assert body["status"]["state"] == "failed", body
    error = body["status"]["error"]
    assert error.startswith(
        "the run's agent names what this daemon's operator has not declared: "
    ), error
    assert message in error
    assert SECRET not in error and UPSTREAM not in error
    assert capture.connections == 0 and capture.seen == b""
    assert provider.calls == []
    events = (await server.client.get(f"/v1/runs/{run}/events")).text
    assert SECRET not in events and UPSTREAM not in events


async def test_the_command_line_still_drives_what_its_own_file_names(capture, monkeypatch):
    # Outside the daemon (`salvor run`, a bare Credentials) an operator's file is trusted:
    # the one rule is the daemon's, not the parser's.
    agent = parse_definition(_service(capture.url), "toml")
    assert Credentials().strict is False
    with pytest.raises(Exception, match="service origin"):
        Credentials.for_daemon().check_reach(agent)


async def test_a_graph_run_whose_agent_names_an_undeclared_endpoint_fails_unsent(
    server_factory, capture, secrets
):
    server = await server_factory()
    text, message = _stored(capture.url, "")[
        "a built-in agent's key sent to an undeclared endpoint"
    ]
    agent = parse_definition(text, "toml")
    await server.state.runtime.definitions.register_agent(agent)
    document = {
        "schema_version": 1,
        "nodes": [{"id": "ask", "kind": "agent", "agent": agent.agent_def_hash}],
        "edges": [],
    }
    response = await server.client.post("/v1/graphs", json=document)
    assert response.status_code == 201, response.text
    response = await server.client.post(
        "/v1/graph-runs", json={"graph_hash": response.json()["graph"], "input": "settle it"}
    )
    assert response.status_code == 201, response.text

    body = await server.wait_resting(response.json()["run"])

    assert body["status"]["state"] == "failed", body
    assert message in body["status"]["error"] and SECRET not in body["status"]["error"]
    assert capture.connections == 0 and capture.seen == b""
