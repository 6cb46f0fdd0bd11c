"""The daemon's connections close when HTTP says so, and only then: raw
sockets against a real daemon.

Every case speaks bytes over ``socket.create_connection`` (in a thread: the
daemon runs in the test's trio loop) to ``salvor serve`` on loopback, so
nothing a client library does (reconnecting, pooling) hides what the server
did. After ``Connection: close`` or an HTTP/1.0 exchange (the event stream
included) the server closes; an answer given before its request's body
arrived leaves the connection serving the next request; a slow request head
is closed within its bound; an idle connection past a listener's cap is the
one closed; and the HTTP layer's own refusals carry the error envelope.

The last cases run an app (a bare one, and a quart-trio one) behind
hypercorn's own ``serve`` too: what ``_hypercorn_seam`` works around is
asserted to be still what hypercorn does, so the day it is not, the
workaround can go.
"""

from __future__ import annotations

import json
import shutil
import socket
import time
from functools import partial

import httpx
import hypercorn.trio
import pytest
import trio
from quart_trio import QuartTrio
from salvor.daemon.web._asgi import answer_lifespan
from salvor.daemon.web._listener import ListenerConfig, listener_config
from salvor.daemon.web._listener import serve as serve_listener

from tests.daemon.client_runs.test_client_runs import append, envelope, head, open_run
from tests.support.api_server import TOKEN
from tests.support.backends import SQLITE_ONLY

# SQLite alone (tests/support/backends.py): what it tests is the connection, bytes on a socket;
# the requests behind it reach the store through the same calls on either backend.
STORE_BACKENDS = SQLITE_ONLY

END_FRAME = b'event: end\ndata: {"status": {"state": "completed", "output": 7}}\n\n'
WAIT = 10.0  # the bound on any one read: a hang fails the test instead of holding it


class Raw:
    """A blocking client socket, each call run in a thread so the daemon's loop keeps serving."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock: socket.socket | None = None
        self.buffer = b""

    async def connect(self) -> Raw:
        self.sock = await trio.to_thread.run_sync(
            socket.create_connection, ("127.0.0.1", self.port), WAIT
        )
        self.sock.settimeout(WAIT)
        return self

    async def send(self, data: bytes) -> None:
        await trio.to_thread.run_sync(self.sock.sendall, data)

    async def response(self) -> tuple[bytes, bytes]:
        """The next (head, body) of a sized response; fails if the connection ends first."""
        return await trio.to_thread.run_sync(self._response)

    def _response(self) -> tuple[bytes, bytes]:
        while b"\r\n\r\n" not in self.buffer:
            self._more("a response head")
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        length = int(header(head, b"content-length"))
        while len(self.buffer) < length:
            self._more("a response body")
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return head, body

    def _more(self, what: str) -> None:
        data = self.sock.recv(65536)
        assert data, f"the server closed the connection before sending {what}"
        self.buffer += data

    async def until_closed(self) -> bytes:
        """Everything the server sends until it closes (within ``WAIT``, else a socket timeout)."""
        return await trio.to_thread.run_sync(self._until_closed)

    def _until_closed(self) -> bytes:
        while data := self.sock.recv(65536):
            self.buffer += data
        rest, self.buffer = self.buffer, b""
        return rest

    async def closed_within(self, seconds: float) -> float:
        """How long after now the server closed; fails past ``seconds``."""
        began = time.monotonic()
        self.sock.settimeout(seconds)
        try:
            await self.until_closed()
        except TimeoutError:
            pytest.fail(f"the server kept the connection open past {seconds} s")
        return time.monotonic() - began

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()


def header(head: bytes, name: bytes) -> bytes:
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name:
            return value.strip()
    raise AssertionError(f"no {name!r} header in {head!r}")


def status(head: bytes) -> int:
    return int(head.split(b" ", 2)[1])


@pytest.fixture
async def raw(server):
    opened: list[Raw] = []

    async def connect() -> Raw:
        client = await Raw(int(server.url.rsplit(":", 1)[1])).connect()
        opened.append(client)
        return client

    yield connect
    for client in opened:
        client.close()


@pytest.fixture
def header_bound(monkeypatch) -> float:
    """The header bound shortened, for a daemon started after this
    fixture (name it before ``raw``)."""
    monkeypatch.setattr(ListenerConfig, "header_timeout", 0.5)
    return 0.5


@pytest.fixture
def idle_cap(monkeypatch) -> int:
    monkeypatch.setattr(ListenerConfig, "max_idle_connections", 2)
    return 2


def get(path: str, *headers: str, version: str = "1.1") -> bytes:
    lines = [f"GET {path} HTTP/{version}", "Host: 127.0.0.1", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def test_a_body_sent_after_an_early_answer_is_discarded_and_the_next_request_answered(
    raw,
) -> None:
    client = await raw()
    await client.send(
        b"POST /v1/runs/not-a-uuid/resume HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    )
    head, body = await client.response()  # answered before its body was sent
    assert status(head) == 400 and json.loads(body)["error"]["code"] == "bad_request"
    await client.send(b"x" * 100)
    await client.send(get("/v1/runs/not-a-uuid"))
    head, body = await client.response()
    assert status(head) == 400 and json.loads(body)["error"]["code"] == "bad_request"


async def test_an_early_answer_whose_body_exceeds_the_drain_bound_closes_the_connection(
    raw,
) -> None:
    client = await raw()
    await client.send(
        b"POST /v1/runs/not-a-uuid/resume HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Length: 100000000\r\n\r\n"
    )
    head, _ = await client.response()
    assert status(head) == 400
    await client.send(b"x" * (ListenerConfig.drain_bytes + 65536))
    await client.closed_within(WAIT)


async def test_connection_close_is_answered_then_closed(raw) -> None:
    client = await raw()
    await client.send(get("/v1/runs/not-a-uuid", "Connection: close"))
    head, _ = await client.response()
    assert status(head) == 400 and header(head, b"connection").lower() == b"close"
    await client.closed_within(WAIT)


async def test_an_http_1_0_request_is_answered_then_closed(raw) -> None:
    client = await raw()
    await client.send(get("/v1/runs/not-a-uuid", version="1.0"))
    head, _ = await client.response()
    assert status(head) == 400
    await client.closed_within(WAIT)


async def finished_run(server) -> str:
    opened = await open_run(server.client)
    run_id = opened["run"]
    response = await append(
        server.client,
        run_id,
        opened["drive_token"],
        [head(run_id), envelope(run_id, 1, "RunCompleted", {"output": 7})],
    )
    assert response.status_code == 200, response.text
    return run_id


async def test_an_http_1_0_event_stream_of_a_finished_run_ends_at_its_end_frame(
    server, raw
) -> None:
    run_id = await finished_run(server)
    client = await raw()
    await client.send(get(f"/v1/runs/{run_id}/events", version="1.0"))
    sent = await client.until_closed()  # EOF, not a socket timeout
    assert sent.startswith(b"HTTP/1.1 200")
    assert sent.endswith(END_FRAME)


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl (apt-get install curl)")
async def test_curl_over_http_1_0_exits_after_the_end_frame(server) -> None:
    run_id = await finished_run(server)
    done = await trio.run_process(
        [
            "curl",
            "--http1.0",
            "-N",
            "-sS",
            "--max-time",
            str(WAIT),
            f"{server.url}/v1/runs/{run_id}/events",
        ],
        capture_stdout=True,
        check=False,
    )
    assert done.returncode == 0  # 28 would be curl giving up at --max-time on an open connection
    assert done.stdout.endswith(END_FRAME)


async def test_a_request_head_that_trickles_is_closed_within_the_header_bound(
    header_bound, raw
) -> None:
    client = await raw()
    await client.send(b"GET /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\n")

    async def trickle() -> None:
        for _ in range(100):  # one header byte at a time, never the blank line
            await client.send(b"X")
            await trio.sleep(0.05)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trickle)
        await client.closed_within(WAIT / 2)  # well inside the default bound
        nursery.cancel_scope.cancel(reason="the server closed the connection")


async def test_a_connection_that_sends_nothing_is_closed_within_the_header_bound(
    header_bound, raw
) -> None:
    client = await raw()
    await client.closed_within(WAIT / 2)  # well inside the default bound


async def test_a_request_head_within_the_bound_is_served(header_bound, raw) -> None:
    client = await raw()
    request = get("/v1/runs/not-a-uuid")
    for index in range(0, len(request), 16):  # in pieces, but whole well within its bound
        await client.send(request[index : index + 16])
        await trio.sleep(header_bound / 100)
    head, _ = await client.response()
    assert status(head) == 400


async def test_past_the_idle_cap_the_longest_idle_connection_is_closed(idle_cap, raw) -> None:
    clients = []
    for _ in range(
        idle_cap + 1
    ):  # each answered, then idle in turn; the third idle one is one too many
        clients.append(client := await raw())
        await client.send(get("/v1/runs/not-a-uuid"))
        await client.response()
    await clients[0].closed_within(WAIT)
    for client in clients[1:]:
        await client.send(get("/v1/runs/not-a-uuid"))
        head, _ = await client.response()
        assert status(head) == 400


# Each sent whole before the answer is read: 1 MB of header is still arriving when the server
# refuses it, so the answer is readable only if the close lingers instead of resetting.
REFUSALS = {
    "a malformed request line": (b"GARBAGE\r\n\r\n", 400, "bad_request"),
    "no Host header": (b"GET /v1/runs HTTP/1.1\r\n\r\n", 400, "bad_request"),
    "headers over the limit": (
        b"GET /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * 1_000_000,
        431,
        "headers_too_large",
    ),
    "an unknown transfer-coding": (
        b"POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: gzip\r\n\r\n",
        501,
        "not_implemented",
    ),
    "HTTP/1.2": (get("/v1/runs", version="1.2"), 505, "http_version_not_supported"),
    "HTTP/3.0": (get("/v1/runs", version="3.0"), 505, "http_version_not_supported"),
}


@pytest.mark.parametrize("case", REFUSALS)
async def test_the_http_layers_own_refusals_carry_the_envelope_then_close(raw, case) -> None:
    request, code, name = REFUSALS[case]
    client = await raw()
    await client.send(request)
    head, body = await client.response()
    assert status(head) == code
    assert header(head, b"content-type") == b"application/json"
    error = json.loads(body)["error"]
    assert error["code"] == name and set(error) == {"code", "message"}
    assert b"aaaa" not in body and b"GARBAGE" not in body  # nothing the caller sent is quoted
    await client.closed_within(WAIT)


async def test_a_pooled_client_whose_upload_was_refused_at_once_is_answered_next_on_that_connection(
    server_factory,
) -> None:
    server = await server_factory(auth_token=TOKEN)
    # No token: every request is a 401, answered before its body is read;
    # one connection, so the next request goes where the refused body went.
    client = server.new_client(limits=httpx.Limits(max_connections=1))

    async def slow_body():
        for _ in range(5):  # the body goes on arriving after the answer
            await trio.sleep(0.05)
            yield b"x" * 1000

    with trio.fail_after(WAIT):
        refused = await client.post(
            "/v1/runs", content=slow_body(), headers={"Content-Length": "5000"}
        )
        assert refused.status_code == 401
        following = await client.get("/v1/runs")
    assert following.status_code == 401 and following.json()["error"]["code"] == "unauthorized"


async def test_an_upload_refused_at_once_and_past_the_drain_bound_still_reads_its_answer(
    raw,
) -> None:
    # The whole body is written before the answer is read, as most clients
    # do: had the server closed without lingering, the rest of the body
    # would meet a reset, and the reset would take the unread answer with it.
    size = ListenerConfig.drain_bytes * 32
    client = await raw()
    try:
        await client.send(
            f"POST /v1/runs/not-a-uuid/resume HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Length: {size}\r\n\r\n".encode()
            + b"x" * size
        )
    except OSError as error:
        pytest.fail(f"the server reset the connection under the body: {error}")
    head, body = await client.response()
    assert status(head) == 400 and json.loads(body)["error"]["code"] == "bad_request"
    await client.closed_within(WAIT)


# -- what _hypercorn_seam works around, against hypercorn's own serve --------------------------


async def bare_app(scope, receive, send) -> None:
    """``/early`` answers 401 without reading its body (as an auth check does); the rest ``ok``."""
    if scope["type"] == "lifespan":
        await answer_lifespan(receive, send)
        return
    if scope["path"] != "/early":
        while (await receive()).get("more_body"):
            pass
    status_code, body = (401, b"no") if scope["path"] == "/early" else (200, b"ok")
    await send(
        {
            "type": "http.response.start",
            "status": status_code,
            "headers": [(b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


quart_app = QuartTrio("salvor-seam-test")


@quart_app.get("/")
async def quart_index() -> str:
    return "ok"


@pytest.fixture(params=["salvor", "hypercorn"])
async def behind(request, nursery):
    """Serve apps behind our listener, or behind hypercorn's public
    ``serve`` with the same settings."""
    stop = trio.Event()
    opened: list[Raw] = []

    async def serve_app(app):
        config = listener_config("127.0.0.1:0", "salvor.test.http", graceful_timeout=1.0)
        config.linger_timeout = 60.0  # far away: a close that waits for it fails the case
        serve = serve_listener if request.param == "salvor" else hypercorn.trio.serve
        binds = await nursery.start(partial(serve, app, config, shutdown_trigger=stop.wait))

        async def connect() -> Raw:
            client = await Raw(int(binds[0].rsplit(":", 1)[1])).connect()
            opened.append(client)
            return client

        return connect

    yield request.param, serve_app
    for client in opened:
        client.close()
    stop.set()


@pytest.fixture
async def bare(behind):
    which, serve_app = behind
    return which, await serve_app(bare_app)


async def test_h11s_refusal_carries_the_envelope_where_hypercorn_sends_an_empty_body(bare) -> None:
    which, connect = bare
    client = await connect()
    await client.send(b"GARBAGE\r\n\r\n")
    head, body = await client.response()
    assert status(head) == 400
    if which == "hypercorn":  # DrainingH11Protocol._send_error_response is needed while this holds
        assert body == b""
    else:
        assert json.loads(body)["error"]["code"] == "bad_request"


async def test_an_early_answer_keeps_the_connection_where_hypercorn_closes_it(bare) -> None:
    which, connect = bare
    client = await connect()
    await client.send(b"POST /early HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\n\r\n")
    head, body = await client.response()
    assert (status(head), body) == (401, b"no")
    if which == "hypercorn":  # DrainingH11Protocol._maybe_recycle is needed while this holds
        # Closed under the body it has not read: a pooled client's next request finds it dead.
        await client.closed_within(WAIT)
        return
    await client.send(b"xxxxx" + get("/next"))
    head, body = await client.response()
    assert (status(head), body) == (200, b"ok")


async def test_a_connection_close_answer_closes_at_once_where_hypercorn_leaves_it_open(
    behind,
) -> None:
    which, serve_app = behind
    client = await (await serve_app(quart_app))()
    await client.send(get("/", "Connection: close"))
    head, body = await client.response()
    assert (status(head), body) == (200, b"ok")
    if (
        which == "hypercorn"
    ):  # HypercornConnection.protocol_send's shielded close is needed while this holds
        # quart-trio cancels the app task that sends hypercorn's close: the socket stays open.
        client.sock.settimeout(2.0)
        with pytest.raises(TimeoutError):
            await client.until_closed()
        return
    await client.closed_within(WAIT)
