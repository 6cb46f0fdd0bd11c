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
* A WebSocket is pinged every ``websocket_ping_interval`` and closed once
  nothing at all (a message, a pong) has arrived on it for
  ``websocket_idle_timeout``: a live client's library answers the pings, a
  peer that vanished or stopped reading does not, and its connection (and
  what the daemon queued for it) is let go. A message over
  ``websocket_max_message_size`` is closed with 1009 by hypercorn.
* A request with both ``Content-Length`` and ``Transfer-Encoding`` is a 400
  that closes its connection: two parties that frame its body differently
  (a proxy in front, this server) would disagree on where the next request
  starts, and what follows on that connection is never served.
* Cleartext HTTP/2 (prior knowledge, or ``Upgrade: h2c``) only where the
  config's ``http2`` turns it on (``salvor serve --http2``): off, a
  prior-knowledge preface is a 505 that closes the connection and an h2c
  upgrade is not taken (the request is answered in HTTP/1.1). A listener that
  speaks HTTP/2 lets a client open and reset streams faster than their
  handlers can start and stop (CVE-2023-44487, "rapid reset"); hypercorn then
  bounds each connection to ``keep_alive_max_requests`` streams, its only
  guard, so nothing the daemon serves speaks it unless asked.
* Every answer carries ``X-Content-Type-Options: nosniff`` and
  ``Cache-Control: no-store`` unless its handler set its own (the page's
  files do): an answer holds runs' data and is never a cache's to keep.

What this needs of hypercorn's internals (its ``TCPServer``, ``H11Protocol``,
task group and worker) is in ``_hypercorn_seam`` alone; this module uses its
hooks and hypercorn's public ``Config``. ``tests/daemon/web/test_listener.py``
and ``tests/daemon/web/test_http_connection.py`` pin the behaviour above. Plain
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

import trio
from hypercorn.config import Config
from salvor.protocol import ErrorCode

from ._browsers import Browsers, guarded
from ._connection_share import ConnectionTally
from ._hypercorn_seam import ANSWER_HEADERS, HypercornConnection, serve_connections

# The rules of a listener that names none of its own: loopback names, its own pages.
LOOPBACK = Browsers()

MAX_RECV = 2**16
# The server must outlast every common client's pool expiry so that the
# client, which knows whether it is about to send, is the one to retire an
# idle connection: httpx 5 s, aiohttp 15 s, Node 5 s, nginx upstream 60 s,
# Go 90 s (requests/urllib3 keep connections with no expiry and check them
# for a close before reuse). hypercorn's 5 s equals httpx's and raced it.
KEEP_ALIVE_SECONDS = 120.0
# WebSockets (issue 29, streaming bounds): the largest message a client may send (salvor's
# requests are small JSON objects), how often the server pings, and how long a socket on which
# nothing arrives (no message, no pong) stays open.
WEBSOCKET_MAX_MESSAGE_BYTES = 64 * 1024
WEBSOCKET_PING_SECONDS = 20.0
WEBSOCKET_IDLE_SECONDS = 60.0

# status -> (code, message) of the refusals the HTTP layer gives before any
# route sees the request. Fixed sentences: h11's own reasons can quote the
# caller's bytes.
_REFUSALS = {
    code.status: (code, message)
    for code, message in (
        (
            ErrorCode.BAD_REQUEST,
            "the request is not well-formed HTTP/1.1 (its request line, headers or body framing)",
        ),
        (
            ErrorCode.HEADERS_TOO_LARGE,
            "the request line and headers are larger than this server accepts",
        ),
        (ErrorCode.NOT_IMPLEMENTED, "this server implements no transfer-coding but chunked"),
        (
            ErrorCode.HTTP_VERSION_NOT_SUPPORTED,
            "this server speaks HTTP/1.0 and HTTP/1.1 (cleartext HTTP/2 only if turned on)",
        ),
    )
}
_HTTP_VERSIONS = frozenset({"1.0", "1.1", "2"})


def refusal_body(status: int) -> bytes:
    """The error envelope of one of the HTTP layer's own refusals."""
    code, message = _REFUSALS[status]
    return json.dumps({"error": {"code": str(code), "message": message}}).encode()


class ListenerConfig(Config):
    """hypercorn's settings plus the bounds this module's connection
    keeps (all in seconds or bytes)."""

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
    websocket_max_message_size = WEBSOCKET_MAX_MESSAGE_BYTES
    websocket_ping_interval = WEBSOCKET_PING_SECONDS
    websocket_idle_timeout = WEBSOCKET_IDLE_SECONDS
    # Cleartext HTTP/2 (prior knowledge, h2c upgrade): off unless a listener turns it on.
    http2 = False


class _Phase(enum.Enum):
    IDLE = "idle"  # waiting for a request's first byte
    HEADERS = "headers"  # a request head is arriving
    BUSY = "busy"  # a request is in flight
    DRAINING = "draining"  # answered early; the request's body is read and dropped
    CLOSING = "closing"  # FIN sent; reading what the client still sends until it ends


class _IdleConnections:
    """One listener's idle connections, longest idle first; past the
    cap, the first one is closed."""

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


class _Limits:
    """The bounds of ``ListenerConfig``, read once per listener (a plain
    ``Config`` gets the defaults)."""

    def __init__(self, config: Config) -> None:
        defaults = ListenerConfig
        self.keep_alive = config.keep_alive_timeout
        self.headers = getattr(config, "header_timeout", defaults.header_timeout)
        self.drain = getattr(config, "drain_timeout", defaults.drain_timeout)
        self.drain_bytes = getattr(config, "drain_bytes", defaults.drain_bytes)
        self.linger = getattr(config, "linger_timeout", defaults.linger_timeout)
        self.max_idle = getattr(config, "max_idle_connections", defaults.max_idle_connections)
        self.websocket_idle = getattr(
            config, "websocket_idle_timeout", defaults.websocket_idle_timeout
        )
        self.http2 = getattr(config, "http2", defaults.http2)


class _Connection(HypercornConnection):
    """One HTTP connection: hypercorn's protocol under a single watcher whose
    deadline follows the phase."""

    def __init__(
        self, limits: _Limits, idle: _IdleConnections, app, config, context, state, stream
    ) -> None:
        super().__init__(
            app,
            config,
            context,
            state,
            stream,
            drain_bytes=limits.drain_bytes,
            refusal_body=refusal_body,
            http2=limits.http2,
        )
        self._limits = limits
        self._idle = idle
        self._phase = _Phase.IDLE
        self._deadline = trio.current_time() + limits.headers
        self._watch = trio.CancelScope(deadline=self._deadline)
        self._ended = False

    def opened(self) -> None:
        self._idle.add(self)

    def ended(self) -> None:
        self._end_watch()

    def phase_changed(self, *, idle: bool) -> None:
        self._enter(_Phase.IDLE if idle else _Phase.BUSY)

    def draining(self) -> None:
        self._enter(_Phase.DRAINING)

    def _enter(self, phase: _Phase) -> None:
        self._phase = phase
        if phase is _Phase.IDLE:
            self._idle.add(self)
        else:
            self._idle.discard(self)
        if phase is _Phase.IDLE and self.shutting_down:
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
        """Close this idle connection now (its listener keeps too many),
        unless a request is arriving."""
        self._deadline = self._watch.deadline = -inf

    async def closing(self) -> None:
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
        return self.client_mid_request() or self._readable()

    async def read_loop(self) -> None:
        while True:
            try:
                data = await self.stream.receive_some(MAX_RECV)
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                break
            if self._phase is _Phase.CLOSING:
                if not data:
                    break
                continue  # what a closing client still sends is dropped
            # HTTP/2 frames (pings, settings) arrive on an idle connection
            # without a request: only HTTP/1 bytes start a request head.
            if data and self._phase is _Phase.IDLE and self.speaks_http1():
                self._enter(_Phase.HEADERS)
            await self.feed(bytes(data))
            if not data:
                break
            if self._phase is _Phase.BUSY and self.serves_websocket():
                # Anything the client sends (a message, a pong) shows it is there.
                self._deadline = self._watch.deadline = (
                    trio.current_time() + self._limits.websocket_idle
                )
        await self.feed_closed()
        self._end_watch()  # the client hung up, or its close was read: nothing left to time out

    def _end_watch(self) -> None:
        self._ended = True
        self._idle.discard(self)
        self._watch.cancel(reason="the connection ended")

    def _readable(self) -> bool:
        """Whether bytes (or the client's end) wait in the socket,
        unread: polled, never blocking."""
        poller = select.poll()
        poller.register(self.stream.socket.fileno(), select.POLLIN)
        return bool(poller.poll(0))

    async def watch(self) -> None:
        while True:
            self._watch = trio.CancelScope(deadline=self._deadline)
            with self._watch:
                if not self.shutting_down:
                    await self.wait_shutdown()
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
            await self.close_from_server()


def _with_answer_headers(app: Any) -> Any:
    """``app`` with ``ANSWER_HEADERS`` on every answer whose handler did not set them itself (a
    WebSocket handshake's refusal too)."""

    async def guarded(scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await app(scope, receive, send)
            return

        async def send_with_headers(message) -> None:
            if message["type"] in ("http.response.start", "websocket.http.response.start"):
                headers = list(message.get("headers") or ())
                present = {bytes(name).lower() for name, _ in headers}
                headers += [header for header in ANSWER_HEADERS if header[0] not in present]
                message = {**message, "headers": headers}
            await send(message)

        await app(scope, receive, send_with_headers)

    return guarded


def _known_versions_only(app: Any) -> Any:
    """``app`` behind a 505 for a request line h11 parsed but whose version is none of ours."""

    async def guarded(scope, receive, send) -> None:
        if scope["type"] != "http" or scope["http_version"] in _HTTP_VERSIONS:
            await app(scope, receive, send)
            return
        body = refusal_body(505)
        await send(
            {
                "type": "http.response.start",
                "status": 505,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    return guarded


def listener_config(bind: str, log_name: str, graceful_timeout: float) -> Config:
    """The settings of one of the daemon's listeners: no access log, errors
    to ``log_name``, our bounds."""
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
    browsers: Browsers | None = LOOPBACK,
    shutdown_trigger: Callable[[], Awaitable[Any]] | None = None,
    tally: ConnectionTally | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the ASGI ``app`` on ``config``'s plain binds until ``shutdown_trigger`` returns.

    Every request passes ``browsers``' rules first (``_browsers``: its Host, its Origin, a JSON
    body's type); by default only loopback names and the listener's own pages are admitted. None:
    ``app`` holds the rules itself (``guarded``), inside a wrapper that watches every request.

    ``tally``: a worker of ``salvor serve --workers N`` takes its share of the connections of
    the socket it shares with its siblings (``_connection_share``).

    Reports the bound URLs through ``task_status`` once listening. On the way
    out, connections get ``config.graceful_timeout`` to finish their responses,
    then the app's lifespan shutdown runs. A failure to bind raises before
    ``task_status`` is reported, with nothing left listening.
    """
    if config.ssl_enabled or config.quic_bind:
        raise ValueError("salvor's HTTP listeners serve plain HTTP only (no certfile, no QUIC)")
    limits = _Limits(config)
    connection = partial(_Connection, limits, _IdleConnections(limits.max_idle))
    await serve_connections(
        _with_answer_headers(
            _known_versions_only(app if browsers is None else guarded(app, browsers))
        ),
        config,
        connection,
        shutdown_trigger=shutdown_trigger,
        task_status=task_status,
        tally=tally,
    )
