"""The daemon's HTTP listener: hypercorn's protocol with one keep-alive watcher per connection.

``salvor.daemon.web._listener.serve`` replaces hypercorn's per-request
keep-alive task with one watcher per connection whose deadline moves. These
tests pin what that must keep from hypercorn, over real loopback sockets:
keep-alive reuse, the idle timeout (and never during a slow response, nor
under a request that arrived by the deadline while the loop was busy), the
graceful shutdown (idle connections close at once, a response in flight
finishes first), bodies whole whether sized or chunked, and connections
whose client hung up ending without waiting for the timer.
"""

from __future__ import annotations

import ast
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest
import salvor.daemon
import trio
from salvor.daemon.web._asgi import answer_lifespan
from salvor.daemon.web._listener import listener_config, serve

KEEP_ALIVE = 0.5


HOLDING = threading.Event()
# Each event here is set by the next ``/slow`` request once it is inside the app.
SLOW_ENTERED: list[trio.Event] = []


async def app(scope, receive, send) -> None:
    """``/slow?s`` answers after s seconds; ``/chunks`` streams three
    chunks; anything else answers ``ok``.

    ``/hold?s`` holds the whole event loop for s seconds (what a saturated
    machine does to it), saying so through ``HOLDING`` first.
    """
    if scope["type"] == "lifespan":
        await answer_lifespan(receive, send)
        return
    while (await receive()).get("more_body"):
        pass
    if scope["path"] == "/hold":
        HOLDING.set()
        # Blocking on purpose: the whole loop stalls, as on a saturated machine.
        time.sleep(float(scope["query_string"]))  # noqa: ASYNC251 -- the stall is the point
    if scope["path"] == "/chunks":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for chunk in (b"one,", b"two,", b"three"):
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    if scope["path"] == "/slow":
        while SLOW_ENTERED:
            SLOW_ENTERED.pop().set()
        await trio.sleep(float(scope["query_string"]))
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
    )
    await send({"type": "http.response.body", "body": b"ok"})


class Listener:
    def __init__(
        self, nursery: trio.Nursery, url: str, stop: trio.Event, finished: trio.Event
    ) -> None:
        self.nursery, self.url, self.stop, self.finished = nursery, url, stop, finished
        self.port = int(url.rsplit(":", 1)[1])


@pytest.fixture
async def listener(nursery, request):
    stop, finished = trio.Event(), trio.Event()
    config = listener_config("127.0.0.1:0", "salvor.test.http", graceful_timeout=30.0)
    config.keep_alive_timeout = KEEP_ALIVE
    # ``@pytest.mark.parametrize("listener", [{"http2": True}], indirect=True)``: its settings.
    for name, value in getattr(request, "param", {}).items():
        setattr(config, name, value)

    async def run(task_status=trio.TASK_STATUS_IGNORED) -> None:
        try:
            await serve(app, config, shutdown_trigger=stop.wait, task_status=task_status)
        finally:
            finished.set()

    binds = await nursery.start(run)
    yield Listener(nursery, binds[0], stop, finished)
    stop.set()


async def request(stream: trio.SocketStream, path: str) -> tuple[bytes, bytes]:
    """One GET on a kept-alive connection: (head, body), the body de-chunked when chunked."""
    await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        more = await stream.receive_some(65536)
        assert more, f"the connection closed before answering {path}"
        data += more
    head, rest = data.split(b"\r\n\r\n", 1)
    if b"transfer-encoding: chunked" in head.lower():
        while not rest.endswith(b"0\r\n\r\n"):
            rest += await stream.receive_some(65536)
        body, remaining = b"", rest
        while True:
            size_line, remaining = remaining.split(b"\r\n", 1)
            size = int(size_line, 16)
            if size == 0:
                return head, body
            body, remaining = body + remaining[:size], remaining[size + 2 :]
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    while len(rest) < length:
        rest += await stream.receive_some(65536)
    return head, rest


async def closed_by_server(stream: trio.SocketStream, within: float) -> bool:
    with trio.move_on_after(within):
        return await stream.receive_some(1) == b""
    return False


def connection_handlers() -> int:
    """How many of the listener's connection handlers are running in this trio run."""
    count, pending = 0, [trio.lowlevel.current_root_task()]
    while pending:
        task = pending.pop()
        count += task.coro.cr_code.co_name == "_run_handler"
        pending.extend(child for nursery in task.child_nurseries for child in nursery.child_tasks)
    return count


async def test_a_connection_serves_many_requests_sized_and_chunked(listener) -> None:
    stream = await trio.open_tcp_stream("127.0.0.1", listener.port)
    for _ in range(3):
        head, body = await request(stream, "/")
        assert head.startswith(b"HTTP/1.1 200") and body == b"ok"
        head, body = await request(stream, "/chunks")
        assert head.startswith(b"HTTP/1.1 200") and body == b"one,two,three"
    await stream.aclose()


async def test_an_idle_connection_closes_after_the_keep_alive_timeout_and_not_before(
    listener,
) -> None:
    stream = await trio.open_tcp_stream("127.0.0.1", listener.port)
    for _ in range(
        4
    ):  # each request moves the deadline on: 4 × KEEP_ALIVE / 2 outlives one timeout
        await request(stream, "/")
        await trio.sleep(KEEP_ALIVE / 2)
    assert await closed_by_server(stream, within=KEEP_ALIVE * 20)


async def test_a_response_slower_than_the_keep_alive_timeout_is_not_cut(listener) -> None:
    stream = await trio.open_tcp_stream("127.0.0.1", listener.port)
    head, body = await request(stream, f"/slow?{KEEP_ALIVE * 3}")
    assert head.startswith(b"HTTP/1.1 200") and body == b"ok"
    head, body = await request(stream, "/")  # and the connection is still kept alive after it
    assert body == b"ok"


def answered(sock: socket.socket) -> bool:
    """Whether an ``ok`` answer arrives before the server closes or resets the connection."""
    data = b""
    while not data.endswith(b"ok"):
        try:
            more = sock.recv(65536)
        except OSError:  # reset: the server closed with the request unread
            return False
        if not more:
            return False
        data += more
    return True


def answered_after_a_held_loop(port: int, connections: int) -> int:
    """How many idle connections answer a request sent while the loop
    is held past their deadline."""
    idle = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(connections)]
    holder = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        for sock in idle:  # each answered, then idle with its deadline KEEP_ALIVE away
            sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert answered(sock)
        HOLDING.clear()
        holder.sendall(f"GET /hold?{KEEP_ALIVE * 3} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        assert HOLDING.wait(30)
        # Sent while the loop is held: when it runs again, each request and
        # its connection's expired deadline are there together.
        for sock in idle:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        return sum(answered(sock) for sock in idle)
    finally:
        for sock in (*idle, holder):
            sock.close()


async def test_a_request_that_arrived_by_the_idle_deadline_is_answered(listener) -> None:
    connections = 8
    answered = await trio.to_thread.run_sync(answered_after_a_held_loop, listener.port, connections)
    assert answered == connections


async def test_a_hung_up_client_ends_its_connection_without_waiting_for_the_timer(nursery) -> None:
    stop = trio.Event()
    config = listener_config("127.0.0.1:0", "salvor.test.http", graceful_timeout=30.0)
    config.keep_alive_timeout = 3600  # hypercorn's own task would wait out this hour
    binds = await nursery.start(
        lambda task_status: serve(app, config, shutdown_trigger=stop.wait, task_status=task_status)
    )
    stream = await trio.open_tcp_stream("127.0.0.1", int(binds[0].rsplit(":", 1)[1]))
    await request(stream, "/")
    await trio.sleep(
        0.3
    )  # the server has recycled the connection: idle, its keep-alive timer running
    assert connection_handlers() == 1
    await stream.aclose()
    with trio.fail_after(10):
        while connection_handlers():
            await trio.sleep(0.01)
    stop.set()


async def test_shutdown_closes_idle_connections_and_finishes_the_response_in_flight(
    listener,
) -> None:
    idle = await trio.open_tcp_stream("127.0.0.1", listener.port)
    await request(idle, "/")
    busy = await trio.open_tcp_stream("127.0.0.1", listener.port)
    answers: list[tuple[bytes, bytes]] = []
    entered = trio.Event()
    SLOW_ENTERED.append(entered)

    async def slow_request() -> None:
        answers.append(await request(busy, "/slow?1.0"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(slow_request)
        with trio.fail_after(30):
            await entered.wait()  # the slow request is in the app
        listener.stop.set()
        assert await closed_by_server(idle, within=5)
    [(head, body)] = answers
    assert head.startswith(b"HTTP/1.1 200") and body == b"ok"
    assert await closed_by_server(busy, within=5)
    with trio.fail_after(10):
        await listener.finished.wait()


async def test_a_tls_bind_is_refused_with_nothing_listening(tmp_path) -> None:
    config = listener_config("127.0.0.1:0", "salvor.test.http", graceful_timeout=1.0)
    config.certfile, config.keyfile = str(tmp_path / "cert.pem"), str(tmp_path / "key.pem")
    with trio.fail_after(10), pytest.raises(ValueError, match="plain HTTP only"):
        await serve(app, config)


@pytest.mark.parametrize("listener", [{"http2": True}], indirect=True)
async def test_http2_streams_share_a_connection_and_it_times_out_when_all_are_done(
    listener,
) -> None:
    # Prior-knowledge HTTP/2 over the plain socket: hypercorn's h2 protocol
    # reports the connection idle only when no stream is open.
    async with httpx.AsyncClient(http1=False, http2=True, base_url=listener.url) as client:
        answers: list[httpx.Response] = []

        async def get(path: str) -> None:
            answers.append(await client.get(path))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                get, f"/slow?{KEEP_ALIVE * 3}"
            )  # open longer than one keep-alive timeout
            for _ in range(5):
                nursery.start_soon(get, "/chunks")
        assert sorted(response.text for response in answers) == ["ok"] + ["one,two,three"] * 5
        assert {response.http_version for response in answers} == {"HTTP/2"}
        assert (
            connection_handlers() == 1
        )  # six streams, one connection, still open after the slow one
        with trio.fail_after(KEEP_ALIVE * 20):
            while connection_handlers():
                await trio.sleep(0.05)


def test_hypercorns_private_api_is_used_in_the_seam_alone() -> None:
    """Outside ``_hypercorn_seam``, the daemon imports only hypercorn's ``Config`` and ``serve``."""
    public = {"hypercorn.config", "hypercorn.trio"}
    daemon = Path(salvor.daemon.__file__).resolve().parent
    outside = []
    for path in sorted(daemon.rglob("*.py")):
        if path.name == "_hypercorn_seam.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            outside += [
                f"{path.name}: {name}"
                for name in names
                if name.split(".")[0] == "hypercorn" and name not in public
            ]
    assert outside == []
