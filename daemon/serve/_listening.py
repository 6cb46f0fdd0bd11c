"""Where a serving daemon listens: the API's listener and the loopback model proxy's port.

A bind that fails is refused in one sentence naming the address and the flag that moves it
(``listen_failed``), before anything is served; a failure once serving leaves as itself.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio
from salvor.protocol import ErrorCode

from ..api import AppendFront, ServerState, create_app
from ..metrics import DaemonMetrics
from ..proxies import ModelProxy, open_model_proxy
from ..web import (
    Browsers,
    OperationRefused,
    TrustedProxies,
    UnixSocketRefused,
    claim_unix_socket,
    inherited_bind,
    listener_config,
)
from ..web import serve as serve_asgi
from ._serve_config import ServeConfig


async def listen_api(
    root: trio.Nursery, config: ServeConfig, state: ServerState, stop: trio.Event
) -> tuple[list[str], InFlight]:
    """Start the HTTP server in ``root``; the addresses it bound and its in-flight counter.

    Raises:
        OperationRefused: listen_failed, the address could not be bound (nothing was served).
    """
    bind, unix_socket = await _bind_spec(config)
    hyper = _listener_config(config, bind)
    in_flight = InFlight(
        TrustedProxies(AppendFront(create_app(state), state), config.trusted_proxies)
    )

    browsers = Browsers.of(config.allow_hosts, config.allow_origins, listen=config.host)

    async def serve_http(task_status=trio.TASK_STATUS_IGNORED) -> None:
        try:
            await serve_asgi(
                in_flight,
                hyper,
                browsers=browsers,
                shutdown_trigger=stop.wait,
                # A worker takes its share of the connections (``_connection_share``).
                tally=None if config.worker is None else config.worker.connection_tally(),
                task_status=task_status,
            )
        finally:
            if unix_socket is not None:
                # A clean stop leaves no socket file behind (a kill leaves one the next start
                # finds stale and removes).
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(unix_socket.release)

    try:
        binds = await root.start(serve_http)
    except (OSError, BaseExceptionGroup) as exc:
        failed = _bind_failure(exc)
        if failed is None:
            raise
        raise OperationRefused(
            ErrorCode.LISTEN_FAILED,
            f"cannot listen on {config.listen} ({failed.strerror or failed}); "
            "stop what holds it, or pick another address with --listen",
        ) from None
    return binds, in_flight


async def _bind_spec(config: ServeConfig):
    """What the listener binds (hypercorn's spelling), and the Unix socket claimed for it, if
    any (released when serving ends).

    Raises:
        OperationRefused: listen_failed, a worker's inherited descriptor is no listening socket,
            or the Unix socket cannot be claimed.
    """
    if config.worker is not None:
        # The supervisor bound the address (and owns a Unix socket's file): serve its socket.
        try:
            return inherited_bind(config.worker.listen_fd), None
        except ValueError as exc:
            raise OperationRefused(ErrorCode.LISTEN_FAILED, str(exc)) from None
    if config.unix_socket is not None:
        try:
            unix_socket = await trio.to_thread.run_sync(claim_unix_socket, config.unix_socket)
        except UnixSocketRefused as exc:
            raise OperationRefused(ErrorCode.LISTEN_FAILED, str(exc)) from None
        return unix_socket.bind_spec(), unix_socket
    return f"{config.host}:{config.port}", None


def _listener_config(config: ServeConfig, bind: str):
    """hypercorn's settings for the API listener on ``bind``."""
    hyper = listener_config(bind, "salvor.http", graceful_timeout=config.shutdown_seconds)
    if config.ws_idle_seconds is not None:
        hyper.websocket_idle_timeout = config.ws_idle_seconds
        hyper.websocket_ping_interval = min(
            hyper.websocket_ping_interval, config.ws_idle_seconds / 3
        )
    hyper.http2 = config.http2
    return hyper


@asynccontextmanager
async def model_proxy(port: int, metrics: DaemonMetrics) -> AsyncIterator[ModelProxy]:
    """The loopback model proxy on ``port`` (0: a free one), for the block.

    Raises:
        OperationRefused: listen_failed, the port could not be bound (nothing was served); a
            failure inside the block leaves as itself.
    """
    entered = False
    try:
        async with open_model_proxy(port, metrics=metrics) as proxy:
            entered = True
            yield proxy
    except (OSError, BaseExceptionGroup) as exc:
        failed = None if entered else _bind_failure(exc)
        if failed is None:
            raise
        raise OperationRefused(
            ErrorCode.LISTEN_FAILED,
            f"the model proxy cannot listen on 127.0.0.1:{port} ({failed.strerror or failed}); "
            "stop what holds that port, or give salvor serve another --proxy-port (0 picks a "
            "free one)",
        ) from None


def _bind_failure(exc: BaseException) -> OSError | None:
    """The OSError a failed bind raised, out of the nurseries it came
    through; None for anything else."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc if isinstance(exc, OSError) else None


class InFlight:
    """ASGI wrapper counting HTTP requests and WebSockets in progress, so a stop can wait for them
    alone."""

    def __init__(self, app) -> None:
        self._app = app
        self._count = 0
        self._idle = trio.Event()
        self._idle.set()

    async def __call__(self, scope, receive, send) -> None:
        # A WebSocket counts too: it closes (1001) as the stop begins, and its close frame must
        # go out before the listener is torn down.
        if scope["type"] not in ("http", "websocket"):
            await self._app(scope, receive, send)
            return
        if self._count == 0:
            self._idle = trio.Event()
        self._count += 1
        try:
            await self._app(scope, receive, send)
        finally:
            self._count -= 1
            if self._count == 0:
                self._idle.set()

    async def wait_idle(self) -> None:
        await self._idle.wait()
