"""The browser rules over real HTTP on the control plane (``web.Browsers`` at the listener), with a
token or without: a ``Host`` that does not name the daemon and an ``Origin`` that is not its own
are 403 ``forbidden`` on every path, the page's shell and the WebSocket included; a body read as
JSON that does not say so is 415 ``unsupported_media_type`` on every operation the document says
takes one; ``--allow-host`` and ``--allow-origin`` admit what they list and nothing else. Every
refusal is the one envelope and the store is unchanged after it.

The same in a real browser: tests/daemon/dashboard/test_cross_site.py; the rules as a table:
tests/daemon/web/test_browsers.py.
"""

from __future__ import annotations

import json

import pytest
import trio
from trio_websocket import ConnectionRejected, open_websocket_url

from tests.daemon.client_runs.test_client_runs import open_run
from tests.support.api import assert_error, snapshot
from tests.support.api_server import TOKEN, Server
from tests.support.backends import BOTH
from tests.support.contract import DOCUMENT

AGENT = (
    'name = "desk"\nmodel = "demo-planner"\nsystem_prompt = "Settle."\n[llm]\nprovider = "demo"\n'
)
TOML = {"Content-Type": "application/toml"}
EVIL = "http://evil.example"


@pytest.fixture(params=[None, TOKEN], ids=["no-token", "token"])
async def daemon(request, server_factory) -> Server:
    return await server_factory(auth_token=request.param)


def bearer(server: Server) -> dict[str, str]:
    return {} if server.auth_token is None else {"Authorization": f"Bearer {server.auth_token}"}


async def registered(server: Server) -> str:
    client = server.new_client(headers=bearer(server))
    response = await client.post("/v1/agents", content=AGENT, headers=TOML)
    assert response.status_code in (200, 201), response.text
    return response.json()["agent"]


@pytest.mark.parametrize("store_url", BOTH, indirect=True)
async def test_a_host_that_does_not_name_the_daemon_is_refused_everywhere(daemon: Server) -> None:
    agent = await registered(daemon)
    before = await snapshot(daemon)
    port = daemon.url.rsplit(":", 1)[1]
    for host in (f"rebound.test:{port}", "attacker.example", f"app.localhost:{port}", ""):
        client = daemon.new_client(headers={**bearer(daemon), "Host": host})
        for method, path, kwargs in (
            ("GET", "/", {}),
            ("GET", "/ui/app.js", {}),
            ("GET", "/v1/runs", {}),
            ("GET", "/v1/health", {}),
            ("GET", "/metrics", {}),
            ("POST", "/v1/runs", {"json": {"agent": agent, "input": "x"}}),
            ("POST", "/v1/agents", {"content": AGENT.replace("desk", "other"), "headers": TOML}),
            ("POST", "/v1/session", {"json": {"token": TOKEN}}),
            ("POST", "/v1/client-runs", {}),
            ("POST", "/v1/client-runs/00000000-0000-4000-8000-000000000000/events", {"json": {}}),
        ):
            response = await client.request(method, path, **kwargs)
            error = assert_error(response, 403, "forbidden")
            assert "Host" in error["message"] and "--allow-host" in error["message"], error
            assert "set-cookie" not in response.headers
    assert await snapshot(daemon) == before
    # Its own names, with any port, are the daemon's.
    for host in (f"localhost:{port}", "127.0.0.1", f"[::1]:{port}", "LOCALHOST:9000"):
        client = daemon.new_client(headers={**bearer(daemon), "Host": host})
        assert (await client.get("/v1/runs")).status_code == 200, host


@pytest.mark.parametrize("store_url", BOTH, indirect=True)
async def test_a_change_from_another_origin_is_refused_with_the_token_too(daemon: Server) -> None:
    agent = await registered(daemon)
    client = daemon.new_client(headers=bearer(daemon))
    run_id = (await client.post("/v1/runs", json={"agent": agent, "input": "x"})).json()["run"]
    await daemon.wait_resting(run_id)
    before = await snapshot(daemon)
    for origin in (
        EVIL,
        "null",
        daemon.url.replace("127.0.0.1", "localhost"),
        "http://127.0.0.1:1",
    ):
        foreign = {"Origin": origin}
        for method, path, kwargs in (
            ("POST", "/v1/runs", {"json": {"agent": agent, "input": "x"}}),
            ("POST", "/v1/agents", {"content": AGENT.replace("desk", "d2"), "headers": TOML}),
            ("POST", f"/v1/runs/{run_id}/abandon", {}),
            ("PUT", "/v1/settings/edit-mode", {"json": {"enabled": True}}),
            ("POST", "/v1/session", {"json": {"token": TOKEN}}),
            ("DELETE", "/v1/session", {}),
            ("POST", "/v1/client-runs", {}),
            ("GET", "/v1/runs", {}),  # a cross-origin fetch: refused rather than answered
        ):
            headers = {**foreign, **kwargs.pop("headers", {})}
            response = await client.request(method, path, headers=headers, **kwargs)
            error = assert_error(response, 403, "forbidden")
            assert "another origin" in error["message"], error
    assert await snapshot(daemon) == before
    assert (await client.get("/v1/settings/edit-mode")).json() == {"enabled": False}
    # From the daemon's own origin (http, or https behind a proxy ending TLS), it goes through.
    for origin in (daemon.url, daemon.url.replace("http://", "https://")):
        response = await client.post(
            "/v1/runs", json={"agent": agent, "input": "y"}, headers={"Origin": origin}
        )
        assert response.status_code == 201, response.text


async def handshake(server: Server, headers: dict[str, str]) -> tuple[int, dict | None]:
    """Open ``/v1/ws`` with ``headers``; (101, the answer to an unknown op) when it
    upgrades, else (the status, the refusal's body)."""
    url = server.url.replace("http://", "ws://", 1) + "/v1/ws"
    try:
        with trio.fail_after(10):
            async with open_websocket_url(url, extra_headers=list(headers.items())) as socket:
                await socket.send_message(json.dumps({"op": "ping"}))
                return 101, json.loads(await socket.get_message())
    except ConnectionRejected as rejected:
        return rejected.status_code, json.loads(rejected.body)


async def test_a_websocket_from_another_origin_or_host_never_upgrades(daemon: Server) -> None:
    agent = await registered(daemon)
    client = daemon.new_client(headers=bearer(daemon))
    assert (await client.post("/v1/runs", json={"agent": agent, "input": "x"})).status_code == 201
    port = daemon.url.rsplit(":", 1)[1]
    for headers in ({"Origin": EVIL}, {"Origin": f"http://localhost:{port}"}):
        status, body = await handshake(daemon, {**bearer(daemon), **headers})
        assert (status, body["error"]["code"]) == (403, "forbidden"), (headers, body)
    # A rebound name's handshake (the client above always sends the URL's own Host).
    upgrade = (
        f"Host: rebound.test:{port}\r\nOrigin: http://rebound.test:{port}\r\n"
        "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    )
    status, body = await raw_get(daemon, "/v1/ws", upgrade)
    assert (status, body["error"]["code"]) == (403, "forbidden"), body
    # The bearer token (or no token at all) from the daemon's own origin, or from no page.
    for headers in ({"Origin": daemon.url}, {}):
        status, body = await handshake(daemon, {**bearer(daemon), **headers})
        assert status == 101 and (body["type"], body["op"]) == ("error", "ping"), body


async def test_the_operators_host_and_origin_are_admitted_and_no_other(server_factory) -> None:
    daemon = await server_factory(
        allow_hosts=("salvor.example.com",), allow_origins=("https://ops.example.com",)
    )
    agent = await registered(daemon)
    proxied = daemon.new_client(headers={"Host": "salvor.example.com"})
    assert (await proxied.get("/v1/runs")).status_code == 200
    # Behind the proxy, the page on its public name is the daemon's own.
    own = {"Origin": "https://salvor.example.com"}
    response = await proxied.post("/v1/runs", json={"agent": agent, "input": "x"}, headers=own)
    assert response.status_code == 201, response.text
    await daemon.wait_resting(response.json()["run"])
    listed = {"Origin": "https://ops.example.com"}
    response = await daemon.client.post(
        "/v1/runs", json={"agent": agent, "input": "x"}, headers=listed
    )
    assert response.status_code == 201, response.text
    await daemon.wait_resting(response.json()["run"])
    before = await snapshot(daemon)
    for client, headers in (
        (daemon.new_client(headers={"Host": "other.example.com"}), {}),
        (daemon.new_client(headers={"Host": "ops.example.com"}), {}),
        (daemon.client, {"Origin": "http://ops.example.com"}),
        (daemon.client, {"Origin": "https://ops.example.com:8443"}),
        (daemon.client, {"Origin": "https://salvor.example.com"}),
    ):
        response = await client.post(
            "/v1/runs", json={"agent": agent, "input": "x"}, headers=headers
        )
        assert_error(response, 403, "forbidden")
    assert await snapshot(daemon) == before


def _body_operations() -> list[tuple[str, str]]:
    return [
        (method, path)
        for path, operations in DOCUMENT["paths"].items()
        for method, operation in operations.items()
        if "requestBody" in operation
    ]


@pytest.mark.parametrize("store_url", BOTH, indirect=True)
async def test_every_body_not_sent_as_json_is_415_and_records_nothing(daemon: Server) -> None:
    """Every operation the document says takes a body, sent one as a page of another site can
    send it: with no type, or as text/plain or a form. The shared 415 it documents is answered,
    naming a type the operation takes, and nothing is recorded."""
    agent = await registered(daemon)
    client = daemon.new_client(headers=bearer(daemon))
    run_id = (await client.post("/v1/runs", json={"agent": agent, "input": "x"})).json()["run"]
    await daemon.wait_resting(run_id)
    opened = await open_run(client)
    drive = {"X-Drive-Token": opened["drive_token"]}
    before = await snapshot(daemon)
    operations = _body_operations()
    assert len(operations) >= 20, operations
    for method, path in operations:
        documented = DOCUMENT["paths"][path][method]["responses"]
        assert documented.get("415") == {"$ref": "#/components/responses/UnsupportedMediaType"}
        target = path.format(run_id=opened["run"] if "client-runs" in path else run_id)
        body = json.dumps({"input": {"approved": True}, "agent": agent, "token": TOKEN}).encode()
        for content_type in (None, "text/plain;charset=UTF-8", "application/x-www-form-urlencoded"):
            headers = {**drive, **({"Content-Type": content_type} if content_type else {})}
            response = await client.request(method, target, content=body, headers=headers)
            error = assert_error(response, 415, "unsupported_media_type")
            # It names a type the operation takes (JSON, but an upload's gzipped tar).
            taken = DOCUMENT["paths"][path][method]["requestBody"]["content"]
            assert any(kind in error["message"] for kind in taken), (method, path, error)
            assert "set-cookie" not in response.headers
    assert await snapshot(daemon) == before
    assert (await client.get(f"/v1/client-runs/{opened['run']}/log")).json()["log"] == []
    # An empty body needs no type (the README's `curl -X POST .../resume`), and JSON with a
    # charset is JSON.
    response = await client.post(f"/v1/runs/{run_id}/resume")
    assert response.status_code == 200, response.text  # completed: nothing left to do
    response = await client.post(f"/v1/runs/{run_id}/abandon")
    assert response.status_code == 409, response.text  # completed: a state refusal, not a 415
    response = await client.put(
        "/v1/settings/edit-mode",
        content=b'{"enabled": false}',
        headers={"Content-Type": "application/json; charset=utf-8"},
    )
    assert response.status_code == 200, response.text


async def raw_get(server: Server, path: str, headers: str) -> tuple[int, dict]:
    """GET ``path`` over a raw socket with ``headers`` (CRLF-ended lines) as they are: the
    status and the JSON body answered."""
    port = int(server.url.rsplit(":", 1)[1])
    auth = "".join(f"{k}: {v}\r\n" for k, v in bearer(server).items())
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(
            f"GET {path} HTTP/1.1\r\n{headers}{auth}Connection: close\r\n\r\n".encode()
        )
        answer = b""
        with trio.fail_after(10):
            while chunk := await stream.receive_some():
                answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)


async def test_a_request_with_two_hosts_or_two_origins_is_refused(daemon: Server) -> None:
    """No browser sends either; a proxy and the daemon could each read a different one. (Two
    Hosts are h11's refusal, before any app.)"""
    status, body = await raw_get(daemon, "/v1/runs", "Host: 127.0.0.1\r\nHost: rebound.test\r\n")
    assert (status, body["error"]["code"]) == (400, "bad_request"), body
    origins = f"Host: 127.0.0.1\r\nOrigin: {daemon.url}\r\nOrigin: {EVIL}\r\n"
    status, body = await raw_get(daemon, "/v1/runs", origins)
    assert (status, body["error"]["code"]) == (403, "forbidden"), body
