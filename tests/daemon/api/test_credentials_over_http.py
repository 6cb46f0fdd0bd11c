"""Credentials go only where the operator sent them (issue 12, item 1).

A real daemon on loopback and real capture servers that count every
connection: a definition registered over HTTP cannot aim the daemon's keys,
its variables or its outbound requests at a host of the caller's choosing.
Each refusal is the one envelope, stores nothing, and the capture server saw
nothing at all. What the operator declared still works, with exactly the key
bound to it, whether that key sits in a variable, a file or a systemd credential.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

import pytest
from salvor.daemon.agents._credentials import Credentials

from tests.support.api import assert_error, snapshot
from tests.support.api_server import agent_toml
from tests.support.backends import SQLITE_ONLY
from tests.support.capture import CaptureServer
from tests.support.scripted_provider import ScriptedProvider, text_reply
from tests.support.spawn import run_salvor

# SQLite alone (tests/support/backends.py): what it tests is where credentials may and may not go.
STORE_BACKENDS = SQLITE_ONLY

SECRET = "sk-capture-me-7311"
MARKER = "remote-body-marker-5521"
ENDPOINT_HINT = "salvor serve --model-endpoint URL[,key_env=VAR|,key_file=PATH]"


@pytest.fixture
def capture():
    started: list[CaptureServer] = []

    def start(**kwargs) -> CaptureServer:
        server = CaptureServer(**kwargs)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def llm_toml(llm: str) -> str:
    return f'model = "m"\nsystem_prompt = "s"\n[llm]\n{llm}\nmax_retries = 0\n'


# -- what an HTTP caller cannot make the daemon do --------------------------------------


ATTACKS = {
    "a variable of the daemon's as the key": (
        'provider = "anthropic"\nbase_url = "{url}/x"\napi_key_env = "SALVOR_AGENT_KEY"',
        (
            "[llm] base_url '{url}/x' is not a model endpoint this daemon's operator declared; "
            f"the operator allows one with `{ENDPOINT_HINT}`"
        ),
    ),
    "the provider's default key": (
        'provider = "anthropic"\nbase_url = "{url}"',
        (
            "[llm] base_url '{url}' is not a model endpoint this daemon's operator declared; "
            f"the operator allows one with `{ENDPOINT_HINT}`"
        ),
    ),
    "the openai default key": (
        'provider = "openai"\nbase_url = "{url}/v1"',
        (
            "[llm] base_url '{url}/v1' is not a model endpoint this daemon's operator declared; "
            f"the operator allows one with `{ENDPOINT_HINT}`"
        ),
    ),
    "a URL from a variable": (
        'provider = "anthropic"\nbase_url_env = "SALVOR_TEST_AIM"',
        (
            "[llm] base_url_env makes the daemon read a variable of its own, so it is only "
            "honoured in agent files run with `salvor run`; over HTTP name an endpoint the "
            f"operator declared with `{ENDPOINT_HINT}`"
        ),
    ),
    "another key for the public host": (
        (
            'provider = "anthropic"\nbase_url = "https://api.anthropic.com/v1"\n'
            'api_key_env = "SALVOR_AGENT_KEY"'
        ),
        (
            "[llm] api_key_env 'SALVOR_AGENT_KEY' is not the key the operator bound to "
            "'https://api.anthropic.com'; leave it out (the endpoint's own key is used), or the "
            f"operator binds it with `{ENDPOINT_HINT}`"
        ),
    ),
}


@pytest.mark.parametrize("attack", list(ATTACKS))
async def test_an_http_definition_cannot_aim_a_key_at_a_host_of_its_choosing(
    server_factory, capture, monkeypatch, attack
):
    listener = capture()
    for name in ("SALVOR_AGENT_KEY", "ANTHROPIC_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.setenv(name, SECRET)
    monkeypatch.setenv("SALVOR_TEST_AIM", listener.url)
    monkeypatch.delenv("SALVOR_MODEL_BASE_URL", raising=False)
    server = await server_factory()
    before = await snapshot(server)
    llm, message = ATTACKS[attack]

    response = await server.client.post(
        "/v1/agents",
        content=llm_toml(llm.format(url=listener.url)),
        headers={"Content-Type": "application/toml"},
    )

    error = assert_error(response, 400, "bad_request")
    assert error["message"] == "the agent definition does not build: " + message.format(
        url=listener.url
    )
    assert SECRET not in response.text
    assert await snapshot(server) == before
    assert (await server.client.get("/v1/agents")).json() == {"agents": []}
    assert listener.connections == 0


async def test_a_declared_endpoint_gets_exactly_the_key_bound_to_it(
    server_factory, providers, monkeypatch
):
    provider = providers([text_reply("settled")])
    monkeypatch.setenv("DESK_KEY", "sk-desk-1")
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    server = await server_factory(
        credentials=Credentials.for_daemon([f"{provider.base_url},key_env=DESK_KEY"])
    )
    # Named with a trailing /v1/ and the bound variable: the same endpoint.
    agent = await server.register_agent(
        agent_toml(provider.base_url + "/v1/", extra="") + 'api_key_env = "DESK_KEY"\n'
    )
    body = await server.wait_resting(await server.start_run(agent, "go"))
    assert body["status"] == {"state": "completed", "output": "settled"}
    assert [call.api_key for call in provider.calls] == ["sk-desk-1"]


async def test_an_endpoint_declared_without_a_key_is_sent_none(server, providers, monkeypatch):
    # The conftest declares each scripted provider as the operator would: `--model-endpoint URL`.
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    provider = providers([text_reply("ok")])
    agent = await server.register_agent(agent_toml(provider.base_url))
    await server.wait_resting(await server.start_run(agent, "go"))
    assert [call.auth for call in provider.calls] == [{}]


# -- MCP url servers ------------------------------------------------------------------


async def test_an_mcp_server_on_an_undeclared_origin_is_never_contacted(
    server_factory, capture, providers
):
    listener = capture()
    provider = providers([text_reply("ok")])
    server = await server_factory()
    before = await snapshot(server)
    definition = (
        agent_toml(provider.base_url)
        + f'\n[[mcp_servers]]\nname = "web"\nurl = "{listener.url}/mcp"\n'
    )
    response = await server.client.post(
        "/v1/agents", content=definition, headers={"Content-Type": "application/toml"}
    )
    error = assert_error(response, 400, "bad_request")
    assert error["message"] == (
        f"the agent definition does not build: [[mcp_servers]] 'web': `url` '{listener.url}' is "
        "not an MCP origin this daemon's operator declared, so it is not contacted; the operator "
        "allows one with `salvor serve --mcp-origin ORIGIN[,header_env=VAR]`"
    )
    assert listener.connections == 0 and await snapshot(server) == before


@pytest.mark.parametrize(
    ("reply", "fragment"),
    [
        (
            {"status": 403, "body": f"<h1>{MARKER}</h1>".encode(), "content_type": "text/html"},
            "MCP server 'web' did not start a session: it refused initialize with HTTP 403",
        ),
        (
            {"status": 200, "body": f"not json {MARKER}".encode()},
            (
                "MCP server 'web' did not start a session: it answered initialize with a body that "
                "is not JSON, so not a valid MCP initialize result"
            ),
        ),
        (
            {
                "status": 200,
                "body": json.dumps(
                    {"jsonrpc": "2.0", "id": 1, "error": {"code": -32000, "message": MARKER}}
                ).encode(),
            },
            (
                "MCP server 'web' did not start a session: it answered initialize with "
                "a JSON-RPC error (code -32000)"
            ),
        ),
    ],
)
async def test_a_registration_failure_never_quotes_the_remote_body(
    server_factory, capture, providers, operator_declarations, reply, fragment
):
    listener = capture(**reply)
    operator_declarations.mcp_origin(listener.url)
    provider = providers([text_reply("ok")])
    server = await server_factory()
    before = await snapshot(server)
    definition = (
        agent_toml(provider.base_url)
        + f'\n[[mcp_servers]]\nname = "web"\nurl = "{listener.url}/mcp"\n'
    )
    response = await server.client.post(
        "/v1/agents", content=definition, headers={"Content-Type": "application/toml"}
    )
    error = assert_error(response, 400, "bad_request")
    assert listener.connections >= 1
    assert fragment in error["message"]
    assert MARKER not in response.text
    assert await snapshot(server) == before


# -- keys from files and systemd credentials, a real `salvor serve` ------------------------


def store_dump(store_url: str) -> str:
    """Every row of every table, as text."""
    import sqlalchemy
    from salvor.store import normalize_store_url

    engine = sqlalchemy.create_engine(normalize_store_url(store_url))
    try:
        with engine.connect() as connection:
            tables = sqlalchemy.inspect(connection).get_table_names()
            return "\n".join(
                repr(row)
                for table in tables
                for row in connection.execute(sqlalchemy.text(f'SELECT * FROM "{table}"'))
            )
    finally:
        engine.dispose()


def test_keys_from_a_file_and_from_credentials_directory_reach_only_their_endpoints(
    tmp_path, store_url
):
    from tests.chaos.test_kill_serve import Daemon

    flagged = ScriptedProvider([text_reply("from the file")])
    daemon_wide = ScriptedProvider([text_reply("from the credential")])
    key_file = tmp_path / "desk.key"
    key_file.write_text("sk-file-4040\n")
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    (credentials / "anthropic-api-key").write_text("sk-systemd-5050\n")
    daemon = Daemon(tmp_path, store_url, tmp_path / "effects.jsonl")
    daemon.env.pop("ANTHROPIC_API_KEY", None)
    daemon.env.update(
        CREDENTIALS_DIRECTORY=str(credentials), SALVOR_MODEL_BASE_URL=daemon_wide.base_url
    )
    daemon.args += ["--model-endpoint", f"{flagged.base_url},key_file={key_file}"]
    try:
        daemon.start()
        with daemon.client(timeout=30) as client:
            runs = []
            for llm in (f'base_url = "{flagged.base_url}"', ""):
                response = client.post(
                    "/v1/agents",
                    content=llm_toml(llm),
                    headers={"Content-Type": "application/toml"},
                )
                assert response.status_code == 201, response.text
                response = client.post(
                    "/v1/runs", json={"agent": response.json()["agent"], "input": "go"}
                )
                assert response.status_code == 201, response.text
                runs.append(response.json()["run"])
            for run in runs:
                for _ in range(500):
                    body = client.get(f"/v1/runs/{run}").json()
                    if body["status"]["state"] == "completed" and body.get("driver") != "attached":
                        break
                    threading.Event().wait(0.02)
                assert body["status"]["state"] == "completed", body
        code, _ = daemon.terminate()
        assert code == 0
    finally:
        if daemon.alive():
            daemon.kill()
        flagged.stop()
        daemon_wide.stop()
    assert [call.api_key for call in flagged.calls] == ["sk-file-4040"]
    assert [call.api_key for call in daemon_wide.calls] == ["sk-systemd-5050"]
    output = daemon.log()
    dump = store_dump(store_url)
    assert all(run in dump for run in runs)  # the dump does read this test's store
    for key in ("sk-file-4040", "sk-systemd-5050"):
        assert key not in output and key not in dump


def test_an_unreadable_key_file_stops_the_start_in_one_sentence(tmp_path, store_url):
    missing = tmp_path / "nope.key"
    result = run_salvor(
        [
            "serve",
            "--store",
            store_url,
            "--listen",
            "127.0.0.1:0",
            "--model-endpoint",
            f"http://127.0.0.1:9,key_file={missing}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SALVOR_AGENT_KEY_FILE": str(missing)},
    )
    assert result.returncode == 1
    assert result.stderr == (
        "salvor: cannot read the key_file of --model-endpoint "
        f"'{missing}': No such file or directory\n"
    )


# -- the command line keeps the reference format -------------------------------------------


def test_salvor_run_honours_base_url_and_api_key_env_of_an_agent_file(tmp_path, store_url):
    provider = ScriptedProvider([text_reply("cli ok")])
    try:
        path = Path(tmp_path / "agent.toml")
        path.write_text(
            llm_toml(
                'provider = "anthropic"\nbase_url_env = "CLI_AIM"\nbase_url = "http://127.0.0.1:9"\n'
                'api_key_env = "CLI_KEY"'
            )
        )
        env = {
            **os.environ,
            "SALVOR_STORE": store_url,
            "CLI_AIM": provider.base_url,
            "CLI_KEY": "sk-cli-6060",
        }
        result = run_salvor(
            ["run", str(path), "--input", '"go"'],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
    finally:
        provider.stop()
    assert result.returncode == 0, result.stderr
    assert [call.api_key for call in provider.calls] == ["sk-cli-6060"]


# -- the process agents' upstream key from a file ------------------------------------------

UPSTREAM_AGENT = r"""
import json, os, urllib.request

body = {
    "model": "scripted-model",
    "messages": [{"role": "user", "content": os.environ["SALVOR_PROMPT"]}],
}
request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions",
    data=json.dumps(body).encode(),
    headers={
        "Content-Type": "application/json",
        "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
    },
)
print(json.load(urllib.request.urlopen(request, timeout=60))["choices"][0]["message"]["content"])
"""


@pytest.mark.parametrize("source", ["SALVOR_AGENT_KEY_FILE", "CREDENTIALS_DIRECTORY"])
def test_the_process_agents_upstream_key_comes_from_a_file(tmp_path, store_url, source):
    from tests.chaos.test_kill_serve import Daemon

    provider = ScriptedProvider([text_reply("upstream ok")])
    script = tmp_path / "agent.py"
    script.write_text(UPSTREAM_AGENT)
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    key_path = credentials / "agent-key"
    key_path.write_text("sk-upstream-7070\n")
    daemon = Daemon(tmp_path, store_url, tmp_path / "effects.jsonl")
    daemon.env.update(
        {
            "SALVOR_AGENT_UPSTREAM": f"{provider.base_url}/v1",
            source: str(key_path if source == "SALVOR_AGENT_KEY_FILE" else credentials),
        }
    )
    daemon.allow_process_agents()
    definition = json.dumps({"kind": "process", "command": [sys.executable, str(script)]})
    try:
        daemon.start()
        with daemon.client(timeout=30) as client:
            response = client.post(
                "/v1/agents", content=definition, headers={"Content-Type": "application/json"}
            )
            assert response.status_code == 201, response.text
            run = client.post(
                "/v1/runs", json={"agent": response.json()["agent"], "input": "go"}
            ).json()["run"]
            for _ in range(1500):
                body = client.get(f"/v1/runs/{run}").json()
                if body["status"]["state"] not in ("running", "awaiting_model", "awaiting_tool"):
                    break
                threading.Event().wait(0.02)
        assert body["status"]["state"] == "completed", body
        assert daemon.terminate()[0] == 0
    finally:
        if daemon.alive():
            daemon.kill()
        provider.stop()
    assert [call.api_key for call in provider.calls] == ["sk-upstream-7070"]
    dump = store_dump(store_url)
    assert run in dump and "sk-upstream-7070" not in dump
    assert "sk-upstream-7070" not in daemon.log()
