"""Serving an ASGI app over plain HTTP with hypercorn's protocol stack and a stricter connection.

Every listener of the daemon (the control plane, the model proxy, the MCP
stand-ins, a service agent's port) serves through ``serve`` here instead of
``hypercorn.trio.serve``. The HTTP itself is hypercorn's (h11 and h2, its
ASGI streams, its lifespan handshake, its graceful shutdown); the connection
around it is ours, for speed and so that it never drops a request or hangs:

* One watcher task per connection, waiting under a cancel scope whose
  deadline moves with the connection's phase, instead of hypercorn's task
  started after every response and cancelled at the next request (on the
  client-driven append, one small request per event, those starts were a
  third of the HTTP stack's cost: a bare app answered ~3,100 requests/s on 2
  cores behind hypercorn, ~4,600 behind this). The phases and their bounds:
  idle (``keep_alive_timeout`` after a response, ``header_timeout`` on a
  fresh connection), a request head arriving (``header_timeout`` from its
  first byte), a request in flight (no bound here: bodies and responses
  have their own), an early answer's body being discarded
  (``drain_timeout``), and a close lingering for the client's end
  (``linger_timeout``).
* An idle connection is closed only when nothing has arrived on it: at the
  deadline the socket is polled, and a request on its way gets the header
  bound instead of a close. The keep-alive timeout outlives the pool expiry
  of common clients (see ``KEEP_ALIVE_SECONDS``), so it is the client that
  retires an idle connection, never the server under a request in flight.
* A listener keeps at most ``max_idle_connections`` idle; past that the
  longest idle is closed (by the same poll-guarded path).
* A close while the client may still be sending (a body, bytes h11
  refused) lingers: FIN after the last response byte, then what the client
  still sends is read and discarded until its end or the linger bound, so
  the close does not reset a response the client has not read yet.
  hypercorn's close could also be lost: quart-trio cancels the app task that
  sends it, so ``Connection: close`` and HTTP/1.0 left the socket open; it
  is shielded here.
* An answer given before the request's body arrived (a 401, a bad run id)
  does not strand the connection: the rest of the body is read and
  discarded, within ``drain_bytes`` and ``drain_timeout``, and the next
  request is served; past either bound the connection closes.
* The HTTP layer's own refusals (h11's 400, 431 and 501, and 505 for an HTTP
  version other than 1.0, 1.1 and 2) carry the daemon's error envelope.

This builds on hypercorn's ``TCPServer`` and ``H11Protocol`` internals, so
``pyproject.toml`` bounds hypercorn's version; ``tests/server/test_http_server.py``
and ``tests/server/test_http_connection.py`` pin the behaviour above. Plain
sockets only: salvor serves loopback and private networks without TLS (a
TLS terminator goes in front).
"""

from __future__ import annotations

import enum
import json
import logging
import resource
import select
from collections.abc import Awaitable, Callable
from functools import partial
from math import inf
from typing import Any

import h11
import trio
from hypercorn.config import Config
from hypercorn.events import Closed, Event, RawData, Updated
from hypercorn.protocol import ProtocolWrapper
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.statsd import StatsdLogger
from hypercorn.trio.task_group import TaskGroup, _handle
from hypercorn.trio.tcp_server import MAX_RECV, TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from hypercorn.utils import (
    ShutdownError,
    parse_socket_addr,
    raise_shutdown,
    repr_socket_addr,
    wrap_app,
)
from salvor.protocol import ErrorCode

# The server must outlast every common client's pool expiry so that the
# client, which knows whether it is about to send, is the one to retire an
# idle connection: httpx 5 s, aiohttp 15 s, Node 5 s, nginx upstream 60 s,
# Go 90 s (requests/urllib3 keep connections with no expiry and check them
# for a close before reuse). hypercorn's 5 s equals httpx's and raced it.
KEEP_ALIVE_SECONDS = 120.0

# status -> (code, message) of the refusals the HTTP layer gives before any
# route sees the request. Fixed sentences: h11's own reasons can quote the
# caller's bytes.
_REFUSALS = {
    code.status: (code, message)
    for code, message in (
        (ErrorCode.BAD_REQUEST,
         "the request is not well-formed HTTP/1.1 (its request line, headers or body framing)"),
        (ErrorCode.HEADERS_TOO_LARGE, "the request line and headers are larger than this server accepts"),
        (ErrorCode.NOT_IMPLEMENTED, "this server implements no transfer-coding but chunked"),
        (ErrorCode.HTTP_VERSION_NOT_SUPPORTED, "this server speaks HTTP/1.0, HTTP/1.1 and HTTP/2 only"),
    )
}
_HTTP_VERSIONS = frozenset({"1.0", "1.1", "2"})


def refusal_body(status: int) -> bytes:
    """The error envelope of one of the HTTP layer's own refusals."""
    code, message = _REFUSALS[status]
    return json.dumps({"error": {"code": str(code), "message": message}}).encode()


class ListenerConfig(Config):
    """hypercorn's settings plus the bounds this module's connection keeps (all in seconds or bytes)."""

    keep_alive_timeout = KEEP_ALIVE_SECONDS
    # From a request's first byte to its last header; a fresh connection gets
    # as long for its first byte.
    header_timeout = 10.0
    drain_timeout = 10.0
    drain_bytes = 1024 * 1024
    linger_timeout = 2.0
    # Idle connections hold file descriptors for up to the keep-alive
    # timeout: a quarter of the process's limit keeps the rest for the
    # store, agents and busy connections.
    max_idle_connections = max(64, resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 4)


class _Phase(enum.Enum):
    IDLE = "idle"          # waiting for a request's first byte
    HEADERS = "headers"    # a request head is arriving
    BUSY = "busy"          # a request is in flight
    DRAINING = "draining"  # answered early; the request's body is read and dropped
    CLOSING = "closing"    # FIN sent; reading what the client still sends until it ends


class _Draining(Event):
    """From the h11 protocol: answered, the request's body is being discarded."""


class _IdleConnections:
    """One listener's idle connections, longest idle first; past the cap, the first one is closed."""

    def __init__(self, cap: int) -> None:
        self._cap = cap
        self._idle: dict[_Connection, None] = {}

    def add(self, connection: _Connection) -> None:
        self._idle.pop(connection, None)
        self._idle[connection] = None
        if len(self._idle) > self._cap:
            oldest = next(iter(self._idle))
            del self._idle[oldest]
            oldest.evict()

    def discard(self, connection: _Connection) -> None:
        self._idle.pop(connection, None)


class _TaskGroup(TaskGroup):
    """hypercorn's, except that a body chunk for an app that has returned is dropped, not waited on."""

    async def spawn_app(self, app, config, scope, send):
        to_app, from_client = trio.open_memory_channel(config.max_app_queue_size)

        async def run_app() -> None:
            with from_client:  # closed when the app returns: a put blocked on it gives up
                await _handle(app, config, scope, from_client.receive, send,
                              trio.to_thread.run_sync, trio.from_thread.run)

        async def put(message) -> None:
            try:
                if message["type"] == "http.disconnect":
                    # Never waited for: an app that answered without reading its body is the one
                    # closing its stream (from its own send), with the queue full of that body;
                    # waiting there is waiting on itself, and the connection is never served again.
                    to_app.send_nowait(message)
                else:
                    await to_app.send(message)
            except trio.WouldBlock:
                pass  # unread body fills the queue: the app is past reading it
            except trio.BrokenResourceError:
                pass  # the app answered and returned without reading this

        self._nursery.start_soon(run_app)
        return put


class _H11Protocol(H11Protocol):
    """hypercorn's HTTP/1 protocol, with its refusals in the envelope and early answers drained."""

    def __init__(self, *args: Any, drain_bytes: int) -> None:
        super().__init__(*args)
        self._drain_bytes = drain_bytes
        self._drain_left: int | None = None  # not None while draining

    async def _send_error_response(self, status_code: int) -> None:
        body = refusal_body(status_code)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close"), *self.config.response_headers("h11")]
        await self._send_h11_event(h11.Response(status_code=status_code, headers=headers))
        await self._send_h11_event(h11.Data(data=body))
        await self._send_h11_event(h11.EndOfMessage())

    async def _maybe_recycle(self) -> None:
        connection = self.connection
        if (isinstance(connection, h11.Connection) and not self.context.terminated.is_set()
                and connection.our_state is h11.DONE and connection.their_state is h11.SEND_BODY):
            # hypercorn would close here; a client that is still sending
            # would then read a reset instead of the answer, and a client
            # that sends the body after reading it finds a dead connection.
            # Draining starts before the first await: closing the stream
            # yields, and the reader, running meanwhile, must drop the body
            # rather than hand it to the stream.
            self._drain_left = self._drain_bytes
            await self._close_stream()
            if self._drain_left is not None:  # else the reader drained it meanwhile and started the next cycle
                await self.send(_Draining())
                if connection.their_state is h11.DONE:
                    # The reader took the body's end while we awaited (before it saw the drain) and
                    # now waits, paused, for a next cycle that only the drain starts: start it here,
                    # or the next request on this connection is never answered.
                    await self._drain()
            await self.can_read.set()
            return
        await super()._maybe_recycle()

    async def _handle_events(self) -> None:
        while True:
            if self._drain_left is not None and not await self._drain():
                return
            await super()._handle_events()
            if self._drain_left is None:
                return

    async def _drain(self) -> bool:
        """Discard the answered request's body; True once it has ended and the connection serves again.

        Past the byte bound, or on a body that breaks HTTP, the connection
        closes (False); False too while more of the body is to come.
        """
        connection = self.connection
        while connection.their_state is not h11.DONE:
            try:
                event = connection.next_event()
            except h11.RemoteProtocolError:
                await self.send(Closed())
                return False
            if event is h11.NEED_DATA:
                return False
            if isinstance(event, h11.Data):
                self._drain_left -= len(event.data)
                if self._drain_left < 0:
                    await self.send(Closed())
                    return False
        self._drain_left = None
        if self.context.terminated.is_set():
            await self.send(Closed())
            return False
        connection.start_next_cycle()
        await self.send(Updated(idle=True))
        return True


class _Limits:
    """The bounds of ``ListenerConfig``, read once per listener (a plain ``Config`` gets the defaults)."""

    def __init__(self, config: Config) -> None:
        defaults = ListenerConfig
        self.keep_alive = config.keep_alive_timeout
        self.headers = getattr(config, "header_timeout", defaults.header_timeout)
        self.drain = getattr(config, "drain_timeout", defaults.drain_timeout)
        self.drain_bytes = getattr(config, "drain_bytes", defaults.drain_bytes)
        self.linger = getattr(config, "linger_timeout", defaults.linger_timeout)
        self.max_idle = getattr(config, "max_idle_connections", defaults.max_idle_connections)


class _Connection(TCPServer):
    """One HTTP connection: hypercorn's protocol under a single watcher whose deadline follows the phase."""

    def __init__(self, app, config, context, state, limits: _Limits, idle: _IdleConnections, stream) -> None:
        super().__init__(app, config, context, state, stream)
        self._limits = limits
        self._idle = idle
        self._phase = _Phase.IDLE
        self._deadline = trio.current_time() + limits.headers
        self._watch = trio.CancelScope(deadline=self._deadline)
        self._ended = False

    async def run(self) -> None:
        # hypercorn's run, for plain sockets, with our h11 protocol and task group.
        socket = self.stream.socket
        try:
            client = parse_socket_addr(socket.family, socket.getpeername())
            server = parse_socket_addr(socket.family, socket.getsockname())
            async with _TaskGroup() as task_group:
                self._task_group = task_group
                args = (self.app, self.config, self.context, task_group, ConnectionState(self.state),
                        False, client, server, self.protocol_send)
                self.protocol = ProtocolWrapper(*args, "http/1.1")
                self.protocol.protocol = _H11Protocol(*args, drain_bytes=self._limits.drain_bytes)
                self._idle.add(self)
                task_group.spawn(self._watch_deadlines)
                await self._read_data()
        except OSError:
            pass
        finally:
            self._end_watch()
            with trio.CancelScope(shield=True):
                await self.stream.aclose()

    def _enter(self, phase: _Phase) -> None:
        self._phase = phase
        if phase is _Phase.IDLE:
            self._idle.add(self)
        else:
            self._idle.discard(self)
        if phase is _Phase.IDLE and self.context.terminated.is_set():
            deadline = -inf  # shutting down: an idle connection closes now
        elif phase is _Phase.IDLE:
            deadline = trio.current_time() + self._limits.keep_alive
        elif phase is _Phase.HEADERS:
            deadline = trio.current_time() + self._limits.headers
        elif phase is _Phase.DRAINING:
            deadline = trio.current_time() + self._limits.drain
        elif phase is _Phase.CLOSING:
            deadline = trio.current_time() + self._limits.linger
        else:
            deadline = inf
        self._deadline = self._watch.deadline = deadline

    def evict(self) -> None:
        """Close this idle connection now (its listener keeps too many), unless a request is arriving."""
        self._deadline = self._watch.deadline = -inf

    async def protocol_send(self, event: Event) -> None:
        if isinstance(event, Updated):
            self._enter(_Phase.IDLE if event.idle else _Phase.BUSY)
        elif isinstance(event, _Draining):
            self._enter(_Phase.DRAINING)
        elif isinstance(event, RawData) and not event.data:
            pass  # h11 ends a sized body with no bytes: nothing to write
        elif isinstance(event, Closed):
            # Shielded: the app task that sends this may already be cancelled
            # (quart-trio cancels its own), and an unshielded close then never
            # reaches the socket.
            with trio.CancelScope(shield=True):
                await self._begin_close()
                await self.protocol.handle(Closed())
        else:
            await super().protocol_send(event)

    async def _begin_close(self) -> None:
        if self._phase is _Phase.CLOSING or self._ended:
            return
        self._enter(_Phase.CLOSING)
        try:
            await self.stream.send_eof()
        except (trio.BrokenResourceError, trio.BusyResourceError, trio.ClosedResourceError):
            await self.stream.aclose()
            return
        if not self._client_may_still_send():
            await self.stream.aclose()  # nothing to linger for: a close now resets nothing

    def _client_may_still_send(self) -> bool:
        """Whether the client is mid-request (a body, or bytes h11 refused) or has bytes waiting."""
        protocol = self.protocol.protocol
        if (isinstance(protocol, H11Protocol) and isinstance(protocol.connection, h11.Connection)
                and protocol.connection.their_state in (h11.SEND_BODY, h11.ERROR)):
            return True
        return self._readable()

    def _http1(self) -> bool:
        # HTTP/2 frames (pings, settings) arrive on an idle connection
        # without a request: only HTTP/1 bytes start a request head.
        return isinstance(self.protocol.protocol, H11Protocol)

    async def _read_data(self) -> None:
        while True:
            try:
                data = await self.stream.receive_some(MAX_RECV)
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                break
            if self._phase is _Phase.CLOSING:
                if not data:
                    break
                continue  # what a closing client still sends is dropped
            if data and self._phase is _Phase.IDLE and self._http1():
                self._enter(_Phase.HEADERS)
            await self.protocol.handle(RawData(bytes(data)))
            if not data:
                break
        await self.protocol.handle(Closed())
        self._end_watch()  # the client hung up, or its close was read: nothing left to time out

    def _end_watch(self) -> None:
        self._ended = True
        self._idle.discard(self)
        self._watch.cancel()

    def _readable(self) -> bool:
        """Whether bytes (or the client's end) wait in the socket, unread: polled, never blocking."""
        poller = select.poll()
        poller.register(self.stream.socket.fileno(), select.POLLIN)
        return bool(poller.poll(0))

    async def _watch_deadlines(self) -> None:
        while True:
            self._watch = trio.CancelScope(deadline=self._deadline)
            with self._watch:
                if not self.context.terminated.is_set():
                    await self.context.terminated.wait()
                    if self._phase is _Phase.IDLE:
                        self._deadline = -inf  # shutdown closes an idle connection now
                        continue
                await trio.sleep_forever()
            if self._ended:
                return
            if trio.current_time() < self._deadline:
                continue  # the phase changed and moved the deadline on
            if self._phase is _Phase.IDLE and self._readable():
                self._enter(_Phase.HEADERS)  # a request arrived at the deadline: it is served
                continue
            break
        with trio.CancelScope(shield=True):
            await self._initiate_server_close()


def _known_versions_only(app: Any) -> Any:
    """``app`` behind a 505 for a request line h11 parsed but whose version is none of ours."""

    async def guarded(scope, receive, send) -> None:
        if scope["type"] != "http" or scope["http_version"] in _HTTP_VERSIONS:
            await app(scope, receive, send)
            return
        body = refusal_body(505)
        await send({"type": "http.response.start", "status": 505,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})

    return guarded


def listener_config(bind: str, log_name: str, graceful_timeout: float) -> Config:
    """The settings of one of the daemon's listeners: no access log, errors to ``log_name``, our bounds."""
    config = ListenerConfig()
    config.bind = [bind]
    config.graceful_timeout = graceful_timeout
    config.accesslog = None
    config.errorlog = logging.getLogger(log_name)
    return config


async def serve(
    app: Any,
    config: Config,
    *,
    shutdown_trigger: Callable[[], Awaitable[Any]] | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the ASGI ``app`` on ``config``'s plain binds until ``shutdown_trigger`` returns.

    Reports the bound URLs through ``task_status`` once listening. On the way
    out, connections get ``config.graceful_timeout`` to finish their responses,
    then the app's lifespan shutdown runs. A failure to bind raises before
    ``task_status`` is reported, with nothing left listening.
    """
    if config.ssl_enabled or config.quic_bind:
        raise ValueError("salvor's HTTP listeners serve plain HTTP only (no certfile, no QUIC)")
    config.set_statsd_logger_class(StatsdLogger)
    wrapped = wrap_app(_known_versions_only(app), config.wsgi_max_body_size, "asgi")
    lifespan_state: dict = {}
    lifespan = Lifespan(wrapped, config, lifespan_state)
    context = WorkerContext(None)
    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        async with trio.open_nursery() as server_nursery:
            sockets = config.create_sockets()
            listeners, binds = [], []
            for sock in sockets.insecure_sockets:
                sock.listen(config.backlog)
                listeners.append(trio.SocketListener(trio.socket.from_stdlib_socket(sock)))
                binds.append(f"http://{repr_socket_addr(sock.family, sock.getsockname())}")
            task_status.started(binds)
            limits = _Limits(config)
            handler = partial(_Connection, wrapped, config, context, ConnectionState(lifespan_state.copy()),
                              limits, _IdleConnections(limits.max_idle))
            try:
                async with trio.open_nursery(strict_exception_groups=True) as nursery:
                    if shutdown_trigger is not None:
                        nursery.start_soon(raise_shutdown, shutdown_trigger)
                    nursery.start_soon(raise_shutdown, context.terminate.wait)
                    nursery.start_soon(partial(trio.serve_listeners, handler, listeners,
                                               handler_nursery=server_nursery))
                    await trio.sleep_forever()
            except BaseExceptionGroup as error:
                _, others = error.split((ShutdownError, KeyboardInterrupt))
                if others is not None:
                    raise others
            finally:
                await context.terminated.set()
                server_nursery.cancel_scope.deadline = trio.current_time() + config.graceful_timeout
        await lifespan.wait_for_shutdown()
        lifespan_nursery.cancel_scope.cancel()
