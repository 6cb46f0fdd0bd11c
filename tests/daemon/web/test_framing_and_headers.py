"""What the daemon's listener refuses at the HTTP layer, and the headers on every API answer.

Over real loopback sockets to the real daemon (``server``: ``salvor serve`` in-process):

* A request with both ``Content-Length`` and ``Transfer-Encoding`` is a 400 envelope and its
  connection closes: a request pipelined behind it on the same connection is never answered
  (written raw: no client library sends such a request).
* Cleartext HTTP/2 is off by default: a prior-knowledge connection (the ``h2`` package, a real
  HTTP/2 client) is answered one HTTP/1.1 505 envelope and closed, and an ``Upgrade: h2c`` is
  not taken; ``http2=True`` (``--http2``) speaks it.
* ``X-Content-Type-Options: nosniff`` and ``Cache-Control: no-store`` on every API answer:
  JSON, error envelopes (the routes', the caller check's, the HTTP layer's own), the event stream
  and ``/metrics``; the page keeps its own ``Cache-Control``; the loopback model proxy's answers
  carry them too.
"""

from __future__ import annotations

import json
import socket

import h2.config
import h2.connection
import h2.events
import httpx
import pytest
import trio
from salvor.daemon.proxies import open_model_proxy

from tests.support.api_server import TOKEN
from tests.support.backends import SQLITE_ONLY

STORE_BACKENDS = SQLITE_ONLY
WAIT = 20
AGENT = 'model = "demo-planner"\nsystem_prompt = "Nap."\n[llm]\nprovider = "demo"\n'


def address(server) -> tuple[str, int]:
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


async def exchange(server, data: bytes) -> bytes:
    """Send ``data`` on a fresh connection and read until the daemon closes it."""
    stream = await trio.open_tcp_stream(*address(server))
    async with stream:
        await stream.send_all(data)
        received = b""
        with trio.fail_after(WAIT):
            while chunk := await stream.receive_some(65536):
                received += chunk
    return received


def responses(received: bytes) -> list[tuple[str, dict[str, str], bytes]]:
    """The HTTP/1.1 answers in ``received``, each (status line, headers, body by Content-Length)."""
    found = []
    while received:
        head, _, rest = received.partition(b"\r\n\r\n")
        status, *lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
        size = int(headers.get("content-length", "0"))
        found.append((status, headers, rest[:size]))
        received = rest[size:]
    return found


def assert_api_headers(headers) -> None:
    assert headers["x-content-type-options"] == "nosniff", dict(headers)
    assert headers["cache-control"] == "no-store", dict(headers)


# -- Content-Length beside Transfer-Encoding ---------------------------------------------------


@pytest.mark.parametrize(
    "smuggling",
    [
        # Framed by its chunked body it is empty; by its Content-Length, four bytes that start the
        # next request. Either way the next request on this connection must not be served.
        (
            b"POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
        ),
        (
            b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
            b"Content-Length: 0\r\n\r\n0\r\n\r\n"
        ),
    ],
)
async def test_content_length_beside_transfer_encoding_is_400_and_closes(server, smuggling) -> None:
    pipelined = b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    answers = responses(await exchange(server, smuggling + pipelined))
    assert len(answers) == 1, answers  # the pipelined request was never answered
    status, headers, body = answers[0]
    assert status.startswith("HTTP/1.1 400 "), status
    assert headers["connection"] == "close"
    assert json.loads(body)["error"]["code"] == "bad_request"
    assert_api_headers(headers)
    # Nothing was recorded, and the daemon goes on serving other connections.
    assert (await server.client.get("/v1/runs")).json()["runs"] == []


async def test_one_framing_header_alone_is_served_and_keeps_the_connection(server) -> None:
    chunked = (
        b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"0\r\n\r\nGET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    answers = responses(await exchange(server, chunked))
    assert [status.split(" ")[1] for status, _, _ in answers] == ["200", "200"]


# -- cleartext HTTP/2 ----------------------------------------------------------------------------


def h2_get(port: int, path: str) -> tuple[bytes, list[h2.events.Event]]:
    """A prior-knowledge HTTP/2 GET on a blocking socket (run in a thread): what came back, raw,
    and the HTTP/2 events it made (none when the server did not speak HTTP/2)."""
    connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    connection.initiate_connection()
    connection.send_headers(
        1,
        [(":method", "GET"), (":path", path), (":scheme", "http"), (":authority", "127.0.0.1")],
        end_stream=True,
    )
    received, events = b"", []
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as sock:
        sock.sendall(connection.data_to_send())
        while chunk := sock.recv(65536):
            received += chunk
            if received.startswith(b"HTTP/1"):
                continue  # not HTTP/2: read it whole, until the server closes
            events += connection.receive_data(chunk)
            sock.sendall(connection.data_to_send())
            if any(isinstance(event, h2.events.StreamEnded) for event in events):
                break
    return received, events


async def test_prior_knowledge_http2_is_not_spoken_by_default(server) -> None:
    received, events = await trio.to_thread.run_sync(h2_get, address(server)[1], "/v1/health")
    assert events == []
    ((status, headers, body),) = responses(received)
    assert status.startswith("HTTP/1.1 505 "), status
    assert headers["connection"] == "close"
    assert json.loads(body)["error"]["code"] == "http_version_not_supported"


async def test_an_h2c_upgrade_is_answered_in_http1(server) -> None:
    upgrade = (
        b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade, HTTP2-Settings\r\n"
        b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\nConnection: close\r\n\r\n"
    )
    ((status, _, body),) = responses(await exchange(server, upgrade))
    assert status.startswith("HTTP/1.1 200 "), status
    assert json.loads(body)["status"] == "ok"


async def test_http2_when_the_operator_turns_it_on(server_factory) -> None:
    server = await server_factory(http2=True)
    _, events = await trio.to_thread.run_sync(h2_get, address(server)[1], "/v1/health")
    (answer,) = [event for event in events if isinstance(event, h2.events.ResponseReceived)]
    assert dict(answer.headers)[b":status"] == b"200"


# -- headers on every answer ---------------------------------------------------------------------


async def test_every_api_answer_says_nosniff_and_no_store(server) -> None:
    client = server.client
    agent = (
        await client.post("/v1/agents", content=AGENT, headers={"Content-Type": "application/toml"})
    ).json()["agent"]
    run_id = await server.start_run(agent, "hello")
    await server.wait_resting(run_id)
    for method, path in [
        ("GET", "/v1/health"),
        ("GET", "/v1/runs"),
        ("GET", f"/v1/runs/{run_id}"),
        ("GET", "/v1/openapi.json"),
        ("GET", "/metrics"),
        ("GET", "/v1/no-such-route"),  # the 404 envelope
        ("DELETE", "/v1/runs"),  # the 405 envelope
        ("GET", "/v1/runs/not-a-run"),  # a route's own refusal
        ("POST", "/v1/client-runs/00000000-0000-4000-8000-000000000000/events"),  # the front
    ]:
        response = await client.request(method, path)
        assert_api_headers(response.headers)
    async with client.stream("GET", f"/v1/runs/{run_id}/events") as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        assert_api_headers(stream.headers)
    # The HTTP layer's own refusal, before any route.
    ((status, headers, _),) = responses(await exchange(server, b"NOT HTTP AT ALL\r\n\r\n"))
    assert status.startswith("HTTP/1.1 400 ")
    assert_api_headers(headers)
    # The page's files keep their own caching: asked again, never stored blind.
    page = await client.get("/")
    assert page.headers["cache-control"] == "no-cache"
    assert page.headers["x-content-type-options"] == "nosniff"


async def test_the_caller_checks_refusal_says_them_too(server_factory) -> None:
    guarded = await server_factory(auth_token=TOKEN)
    anonymous = guarded.new_client()
    for path in ("/v1/runs", "/metrics"):
        response = await anonymous.get(path)
        assert response.status_code == 401
        assert_api_headers(response.headers)


async def test_the_loopback_model_proxy_says_them_too() -> None:
    async with open_model_proxy() as proxy, httpx.AsyncClient() as client:
        response = await client.post(f"{proxy.url}/r/not-a-capability/v1/messages", json={})
        assert response.status_code >= 400
        assert_api_headers(response.headers)
