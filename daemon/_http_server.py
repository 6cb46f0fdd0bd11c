"""Serving an ASGI app over plain HTTP with hypercorn's protocol stack and a leaner connection.

Every listener of the daemon (the control plane, the model proxy, the MCP
stand-ins, a service agent's port) serves through ``serve`` here instead of
``hypercorn.trio.serve``. The HTTP itself is hypercorn's (h11 and h2, its
ASGI streams, its lifespan handshake, its graceful shutdown); only the
per-connection keep-alive timer differs (and h11's empty end of a sized body
is not written to the socket).

hypercorn times a keep-alive connection out with a task it starts (through
``Nursery.start``) after every response and cancels at the next request. On
the client-driven append, one small request per event, those task starts and
cancellations were about a third of what the HTTP stack cost per request
(measured: a bare app behind hypercorn answered ~3,100 requests/s on 2 cores;
with the connection below, ~4,600). Here each connection has one watcher task
for its whole life, waiting under a cancel scope whose deadline moves: to
``keep_alive_timeout`` from now when the connection goes idle, to never while
a request is in flight. The behaviour is hypercorn's: an idle connection
closes after ``keep_alive_timeout``; at shutdown an idle connection closes at
once and a busy one after its response; and, beyond hypercorn, a connection
whose client hung up ends at once instead of lingering until the timer.

This builds on hypercorn's ``TCPServer`` internals, so ``pyproject.toml``
bounds hypercorn's version; ``tests/server/test_http_server.py`` pins the
behaviour above. Plain sockets only: salvor serves loopback and private
networks without TLS (a TLS terminator goes in front).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from functools import partial
from math import inf
from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.events import Closed, RawData, Updated
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.statsd import StatsdLogger
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from hypercorn.utils import ShutdownError, raise_shutdown, repr_socket_addr, wrap_app


class _Connection(TCPServer):
    """One HTTP connection: hypercorn's, with a single keep-alive watcher moved by deadline."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._idle_scope = trio.CancelScope()
        self._busy = False
        self._became_idle = trio.Event()
        self._ended = False

    async def protocol_send(self, event: Any) -> None:
        if isinstance(event, Updated):
            self._busy = not event.idle
            if event.idle:
                self._idle_scope.deadline = trio.current_time() + self.config.keep_alive_timeout
                self._became_idle.set()
            else:
                self._idle_scope.deadline = inf
            return
        if isinstance(event, RawData) and not event.data:
            return  # h11 ends a sized body with no bytes: nothing to write
        if isinstance(event, Closed):
            self._end_watch()
        await super().protocol_send(event)

    async def _read_data(self) -> None:
        await super()._read_data()
        self._end_watch()  # the client hung up or the stream broke: nothing left to time out

    def _end_watch(self) -> None:
        self._ended = True
        self._idle_scope.cancel()

    async def _idle_timeout(self) -> None:
        # hypercorn's run() starts this once per connection, before the first
        # request: the connection is idle from the start.
        with self._idle_scope:
            self._idle_scope.deadline = trio.current_time() + self.config.keep_alive_timeout
            await self.context.terminated.wait()
            while self._busy:  # the response in flight finishes; its end closes the connection
                self._became_idle = trio.Event()
                await self._became_idle.wait()
        if self._ended:
            return
        with trio.CancelScope(shield=True):
            await self._initiate_server_close()


def listener_config(bind: str, log_name: str, graceful_timeout: float) -> Config:
    """hypercorn's settings for one of the daemon's listeners: no access log, errors to ``log_name``."""
    config = Config()
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
                binds.append(f"http://{repr_socket_addr(sock.family, sock.getsockname())}")
            task_status.started(binds)
            handler = partial(_Connection, wrapped, config, context, ConnectionState(lifespan_state.copy()))
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
