"""hypercorn's private API, all in one place: what the daemon's listener reuses beyond ``Config``.

hypercorn's public API is ``hypercorn.trio.serve`` and ``Config``. The
listener (``_http_server``) needs a connection hypercorn's does not give, so
it builds on the internals below; everything it touches of them is here,
behind a handful of hooks, so a hypercorn release that moves them breaks this
module alone (``pyproject.toml`` bounds hypercorn's version for it). Each
piece names the upstream code it mirrors or overrides, at hypercorn 0.18.0
(https://github.com/pgjones/hypercorn/tree/0.18.0/src/hypercorn), and the
behaviour of it that the listener cannot live with:

* ``AppTaskGroup`` (``trio/task_group.py``, ``TaskGroup.spawn_app``): the
  app's queue is sent into with an awaited ``send``, so a body chunk (or the
  ``http.disconnect``) for an app that answered without reading its body
  waits forever on a full queue, and the connection is never served again.
* ``DrainingH11Protocol`` (``protocol/h11.py``, ``H11Protocol``):
  ``_maybe_recycle`` closes a connection answered before its request's body
  arrived (the client then reads a reset instead of the answer, and a pooled
  client finds a dead connection); here the body is drained and the next
  request served. ``_send_error_response`` answers h11's refusals with an
  empty body; here they carry the daemon's error envelope. ``_check_protocol``
  takes any ``Upgrade: h2c`` and any ``PRI *`` preface as a switch to HTTP/2,
  and h11 frames a body sent with both ``Content-Length`` and
  ``Transfer-Encoding`` by the latter and keeps the connection; here HTTP/2 is
  spoken only when the listener turns it on, and that request is a 400 that
  closes the connection.
* ``HypercornConnection`` (``trio/tcp_server.py``, ``TCPServer``): ``run``
  and ``protocol_send`` restart an idle task after every response and stop
  it at every request (a third of the stack's cost on small requests); here
  the subclass keeps one watcher. And its close on ``Closed`` runs in the
  app's task unshielded, while quart-trio cancels that task once it has
  answered: ``Connection: close`` and HTTP/1.0 answers leave the socket open
  (until the keep-alive timeout). Here the close is the connection's own
  (``closing``: FIN, then a bounded linger) and shielded.
* ``serve_connections`` (``trio/run.py``, ``worker_serve``): the lifespan
  handshake, the worker context and the graceful shutdown, unchanged, with
  the connection class as a parameter (``worker_serve`` hardcodes
  ``TCPServer``).

``tests/daemon/web/test_http_connection.py`` runs the early answer, the refusal
body and the ``Connection: close`` under quart-trio against hypercorn's own
``serve`` as well as ours: while hypercorn still behaves so, the workaround
is needed, and the day a case passes upstream it can go. The full queue is
``tests/daemon/api/test_bounds.py``'s many-small-sends case (a race, tried
on forty connections).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import h11
import trio
from hypercorn.config import Config
from hypercorn.events import Closed, Event, RawData, Updated
from hypercorn.protocol import ProtocolWrapper
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.protocol.ws_stream import WSStream
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.statsd import StatsdLogger
from hypercorn.trio.task_group import TaskGroup, _handle
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from hypercorn.utils import (
    ShutdownError,
    parse_socket_addr,
    raise_shutdown,
    repr_socket_addr,
    wrap_app,
)

from ._connection_share import ConnectionTally, serve_tallied

__all__ = ["HypercornConnection", "serve_connections"]

# What a refusal of the HTTP layer's own answers with: (status) -> body bytes.
RefusalBody = Callable[[int], bytes]


class _Draining(Event):
    """From the h11 protocol: answered, the request's body is being discarded."""


class _Refused(Exception):
    """From ``DrainingH11Protocol._check_protocol``: a request head this listener refuses with
    ``status``, then closes the connection."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


# What every answer the protocol writes itself carries (``_send_error_response``).
ANSWER_HEADERS = ((b"x-content-type-options", b"nosniff"), (b"cache-control", b"no-store"))


class AppTaskGroup(TaskGroup):
    """hypercorn's, but a body chunk for an app that has returned is dropped, not awaited."""

    async def spawn_app(self, app, config, scope, send):
        to_app, from_client = trio.open_memory_channel(config.max_app_queue_size)

        async def run_app() -> None:
            with from_client:  # closed when the app returns: a put blocked on it gives up
                await _handle(
                    app,
                    config,
                    scope,
                    from_client.receive,
                    send,
                    trio.to_thread.run_sync,
                    trio.from_thread.run,
                )

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


class DrainingH11Protocol(H11Protocol):
    """hypercorn's HTTP/1 protocol, with its refusals in the envelope and early answers drained."""

    def __init__(
        self, *args: Any, drain_bytes: int, refusal_body: RefusalBody, http2: bool
    ) -> None:
        super().__init__(*args)
        self._drain_bytes = drain_bytes
        self._refusal_body = refusal_body
        self._http2 = http2
        self._drain_left: int | None = None  # not None while draining

    async def _check_protocol(self, event: h11.Request) -> None:
        framing = {name for name, _ in event.headers} & {b"content-length", b"transfer-encoding"}
        if len(framing) == 2:
            # h11 would frame the body by Transfer-Encoding and keep the connection; a proxy in
            # front that framed it by Content-Length would then see a different next request
            # (request smuggling). RFC 9112 6.1: refuse it, or at least close after answering.
            raise _Refused(400)
        if self._http2:
            await super()._check_protocol(event)
        elif event.method == b"PRI" and event.target == b"*" and event.http_version == b"2.0":
            # HTTP/2 with prior knowledge, and this listener does not speak it (--http2).
            raise _Refused(505)
        # Else an `Upgrade: h2c` is not taken: the request is answered in HTTP/1.1, as a server
        # that does not offer the upgrade may (RFC 9110 7.8).

    async def _send_error_response(self, status_code: int) -> None:
        body = self._refusal_body(status_code)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
            *ANSWER_HEADERS,
            *self.config.response_headers("h11"),
        ]
        await self._send_h11_event(h11.Response(status_code=status_code, headers=headers))
        await self._send_h11_event(h11.Data(data=body))
        await self._send_h11_event(h11.EndOfMessage())

    async def _maybe_recycle(self) -> None:
        connection = self.connection
        if (
            isinstance(connection, h11.Connection)
            and not self.context.terminated.is_set()
            and connection.our_state is h11.DONE
            and connection.their_state is h11.SEND_BODY
        ):
            # hypercorn would close here; a client that is still sending
            # would then read a reset instead of the answer, and a client
            # that sends the body after reading it finds a dead connection.
            # Draining starts before the first await: closing the stream
            # yields, and the reader, running meanwhile, must drop the body
            # rather than hand it to the stream.
            self._drain_left = self._drain_bytes
            await self._close_stream()
            if (
                self._drain_left is not None
            ):  # else the reader drained it meanwhile and started the next cycle
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
            try:
                await super()._handle_events()
            except _Refused as refused:
                # Answered before any stream (or the app) saw the request; what the client still
                # sends is read and dropped by the close's linger, never served.
                await self._send_error_response(refused.status)
                await self.send(Closed())
                return
            if self._drain_left is None:
                return

    async def _drain(self) -> bool:
        """Discard the answered request's body; True once it has ended and the connection serves.

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


class HypercornConnection(TCPServer):
    """One plain-socket connection on hypercorn's protocol stack, reporting its phases to hooks.

    A subclass provides the hooks: ``opened`` (the protocol is up),
    ``phase_changed(idle)`` (a response ended, or a request began),
    ``draining`` (answered early; the body is being dropped), ``closing``
    (the protocol closes: awaited, shielded), ``ended`` (on every way out),
    and the two tasks ``watch`` (beside the reader) and ``read_loop``.
    """

    def __init__(
        self,
        app,
        config: Config,
        context: WorkerContext,
        state,
        stream,
        *,
        drain_bytes: int,
        refusal_body: RefusalBody,
        http2: bool = False,
    ) -> None:
        super().__init__(app, config, context, state, stream)
        self._drain_bytes = drain_bytes
        self._refusal_body = refusal_body
        self._http2 = http2

    # -- hooks -------------------------------------------------------------------------------

    def opened(self) -> None:
        pass

    def phase_changed(self, *, idle: bool) -> None:
        pass

    def draining(self) -> None:
        pass

    async def closing(self) -> None:
        pass

    def ended(self) -> None:
        pass

    async def watch(self) -> None:
        pass

    async def read_loop(self) -> None:
        raise NotImplementedError

    # -- what the hooks use ------------------------------------------------------------------

    @property
    def shutting_down(self) -> bool:
        return self.context.terminated.is_set()

    async def wait_shutdown(self) -> None:
        await self.context.terminated.wait()

    async def feed(self, data: bytes) -> None:
        """Hand bytes the client sent to the protocol (``b""``: the client's end)."""
        await self.protocol.handle(RawData(data))

    async def feed_closed(self) -> None:
        """Tell the protocol the connection is gone."""
        await self.protocol.handle(Closed())

    async def close_from_server(self) -> None:
        """Close the connection from this end (hypercorn's own idle-timeout close)."""
        await self._initiate_server_close()

    def speaks_http1(self) -> bool:
        return isinstance(self.protocol.protocol, H11Protocol)

    def serves_websocket(self) -> bool:
        """Whether this HTTP/1 connection was upgraded to a WebSocket (hypercorn's ``WSStream``)."""
        protocol = self.protocol.protocol
        return isinstance(protocol, H11Protocol) and isinstance(protocol.stream, WSStream)

    def client_mid_request(self) -> bool:
        """Whether the client is mid-request on HTTP/1: sending a body, or bytes h11 refused."""
        protocol = self.protocol.protocol
        return (
            isinstance(protocol, H11Protocol)
            and isinstance(protocol.connection, h11.Connection)
            and protocol.connection.their_state in (h11.SEND_BODY, h11.ERROR)
        )

    # -- hypercorn's, overridden -------------------------------------------------------------

    async def run(self) -> None:
        # TCPServer.run, for plain sockets, with the draining protocol and the app task group,
        # and no idle task: ``watch`` runs beside the reader instead.
        socket = self.stream.socket
        try:
            client = parse_socket_addr(socket.family, socket.getpeername())
            server = parse_socket_addr(socket.family, socket.getsockname())
            async with AppTaskGroup() as task_group:
                self._task_group = task_group
                args = (
                    self.app,
                    self.config,
                    self.context,
                    task_group,
                    ConnectionState(self.state),
                    False,
                    client,
                    server,
                    self.protocol_send,
                )
                self.protocol = ProtocolWrapper(*args, "http/1.1")
                self.protocol.protocol = DrainingH11Protocol(
                    *args,
                    drain_bytes=self._drain_bytes,
                    refusal_body=self._refusal_body,
                    http2=self._http2,
                )
                self.opened()
                task_group.spawn(self.watch)
                await self.read_loop()
        except OSError:
            pass
        finally:
            self.ended()
            with trio.CancelScope(shield=True):
                await self.stream.aclose()

    async def protocol_send(self, event: Event) -> None:
        if isinstance(event, Updated):
            self.phase_changed(idle=event.idle)
        elif isinstance(event, _Draining):
            self.draining()
        elif isinstance(event, RawData) and not event.data:
            pass  # h11 ends a sized body with no bytes: nothing to write
        elif isinstance(event, Closed):
            # Shielded: the app task that sends this may already be cancelled
            # (quart-trio cancels its own), and an unshielded close then never
            # reaches the socket.
            with trio.CancelScope(shield=True):
                await self.closing()
                await self.protocol.handle(Closed())
        else:
            await super().protocol_send(event)


def _bind_address(sock) -> str:
    """What a listener reports it is bound to: an ``http://`` URL, or ``unix:PATH`` for a Unix
    socket (the form ``--listen`` and the clients take; hypercorn would say ``http://unix:...``)."""
    if sock.family == trio.socket.AF_UNIX:
        return f"unix:{sock.getsockname()}"
    return f"http://{repr_socket_addr(sock.family, sock.getsockname())}"


async def serve_connections(
    app: Any,
    config: Config,
    connection: Callable[..., Awaitable[None]],
    *,
    shutdown_trigger: Callable[[], Awaitable[Any]] | None,
    task_status: trio.TaskStatus[list[str]],
    tally: ConnectionTally | None = None,
) -> None:
    """hypercorn's ``worker_serve`` for plain binds, each accepted stream served by ``connection``.

    ``connection(app, config, context, state, stream)`` is awaited per
    connection (``HypercornConnection`` subclasses are awaitable). Reports
    the bound URLs through ``task_status``; on the way out, connections get
    ``config.graceful_timeout``, then the app's lifespan shutdown runs. ``tally``: a worker of
    ``salvor serve --workers N`` accepts as its siblings' open connections say
    (``_connection_share``).
    """
    config.set_statsd_logger_class(StatsdLogger)
    wrapped = wrap_app(app, config.wsgi_max_body_size, "asgi")
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
                binds.append(_bind_address(sock))
            task_status.started(binds)

            state = ConnectionState(lifespan_state.copy())

            async def handler(stream) -> None:
                await connection(wrapped, config, context, state, stream)

            try:
                async with trio.open_nursery(strict_exception_groups=True) as nursery:
                    if shutdown_trigger is not None:
                        nursery.start_soon(raise_shutdown, shutdown_trigger)
                    nursery.start_soon(raise_shutdown, context.terminate.wait)
                    if tally is None:
                        nursery.start_soon(
                            partial(
                                trio.serve_listeners,
                                handler,
                                listeners,
                                handler_nursery=server_nursery,
                            )
                        )
                    else:
                        for sock in sockets.insecure_sockets:
                            nursery.start_soon(serve_tallied, sock, handler, server_nursery, tally)
                    await trio.sleep_forever()
            except BaseExceptionGroup as error:
                _, others = error.split((ShutdownError, KeyboardInterrupt))
                if others is not None:
                    raise others
            finally:
                await context.terminated.set()
                server_nursery.cancel_scope.deadline = trio.current_time() + config.graceful_timeout
        await lifespan.wait_for_shutdown()
        lifespan_nursery.cancel_scope.cancel(reason="the listener stopped; its lifespan ends")
