"""The daemon's live WebSocket (``/v1/ws``) from Python: runs' events and the run list on one
connection, every event once, across drops. trio only (``trio-websocket`` underneath)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio
from trio_websocket import (
    ConnectionClosed,
    ConnectionRejected,
    HandshakeError,
    WebSocketConnection,
    connect_websocket_url,
    wrap_client_stream,
)

from ._address import unix_socket_of
from ._errors import SalvorError

# What the daemon's close codes mean to a client: 1013 (it could not keep up), 1001 (the daemon
# stopped) and 1006 (the connection dropped) are worth a reconnect; 1008 (a bad message) and 1009
# (a message over the daemon's 64 KiB limit) are not: the same message would be refused again.
_GIVE_UP = frozenset({1008, 1009})


class Live:
    """One live connection to a daemon, kept open: it reconnects with backoff and re-subscribes
    each run from the seq after the last one it handed over, so its reader sees every event of a
    subscribed run exactly once, in order. trio only.

    Open it with ``open_live`` (or ``Salvor.live``)::

        async with open_live("http://127.0.0.1:8420") as live:
            await live.subscribe(run_id)
            await live.watch_runs()
            async for message in live:
                if message["type"] == "event":
                    print(message["run"], message["event"]["seq"])

    Messages are the daemon's, as JSON objects: ``event``, ``status``, ``run`` and ``error``.
    ``cursors`` maps each subscribed run to the last seq handed over (-1 before the first).

    Error handling: a refused handshake (a wrong token) raises ``SalvorError`` from the
    iteration; a close for a bad or oversized message (1008, 1009) raises ``ConnectionClosed``;
    anything else that ends the connection is retried, waiting ``backoff`` seconds, doubling up
    to ``max_backoff``.
    """

    def __init__(
        self,
        url: str,
        *,
        headers: list[tuple[bytes, bytes]],
        backoff: float,
        max_backoff: float,
        buffer: int,
        unix_socket: str | None = None,
    ) -> None:
        self._url = url
        self._unix_socket = unix_socket
        self._headers = headers
        self._backoff, self._max_backoff = backoff, max_backoff
        self.cursors: dict[str, int] = {}
        self.watching = False
        self.connections = 0
        self._socket: WebSocketConnection | None = None
        self._send, self._receive = trio.open_memory_channel[dict | BaseException](buffer)
        self._lock = trio.Lock()

    # -- what the caller asks for --------------------------------------------------------------

    async def subscribe(self, run: str, from_seq: int = 0) -> None:
        """Receive ``run``'s events from ``from_seq`` on (then its status, then live)."""
        self.cursors[run] = from_seq - 1
        await self._request({"op": "subscribe", "run": run, "from_seq": from_seq})

    async def unsubscribe(self, run: str) -> None:
        self.cursors.pop(run, None)
        await self._request({"op": "unsubscribe", "run": run})

    async def watch_runs(self) -> None:
        """Receive a ``run`` message whenever a run's state or status changes."""
        self.watching = True
        await self._request({"op": "watch_runs"})

    async def unwatch_runs(self) -> None:
        self.watching = False
        await self._request({"op": "unwatch_runs"})

    async def _request(self, body: dict) -> None:
        # Without a connection the request waits for the next one, which sends it from state.
        async with self._lock:
            if self._socket is not None:
                try:
                    await self._socket.send_message(json.dumps(body))
                except ConnectionClosed:
                    pass

    def __aiter__(self) -> AsyncIterator[dict]:
        return self._messages()

    async def _messages(self) -> AsyncIterator[dict]:
        async for item in self._receive:
            if isinstance(item, BaseException):
                raise item
            yield item

    # -- the connection ------------------------------------------------------------------------

    async def _run(self) -> None:
        """Connect, resume, read; again after every drop, until cancelled or refused."""
        delay = self._backoff
        while True:
            connected, ended = await self._connect_once()
            if ended is not None:
                await self._send.send(ended)
                return
            delay = self._backoff if connected else delay
            await trio.sleep(delay)
            delay = min(self._max_backoff, delay * 2)

    async def _connect_once(self) -> tuple[bool, BaseException | None]:
        """One connection, until it ends: whether it was made, and what ends the iteration (a
        refusal, a close for a bad message), if anything."""
        outcome: tuple[bool, BaseException | None] = (False, None)
        # trio-websocket raises a refused handshake from its reader task too: out of the nursery.
        try:
            async with trio.open_nursery() as nursery:
                outcome = await self._session(nursery)
        except* ConnectionRejected as group:
            outcome = (False, _refusal(group.exceptions[0]))
        except* (HandshakeError, OSError):
            outcome = (False, None)
        return outcome

    async def _session(self, nursery: trio.Nursery) -> tuple[bool, BaseException | None]:
        if self._unix_socket is not None:
            stream = await trio.open_unix_socket(self._unix_socket)
            socket = await wrap_client_stream(
                nursery, stream, "localhost", "/v1/ws", extra_headers=self._headers
            )
        else:
            socket = await connect_websocket_url(nursery, self._url, extra_headers=self._headers)
        try:
            await self._resume(socket)
            await self._read(socket)
        except ConnectionClosed as closed:
            if closed.reason is not None and closed.reason.code in _GIVE_UP:
                return True, closed
            return True, None
        finally:
            self._socket = None
            await socket.aclose()
        return True, None

    async def _resume(self, socket: WebSocketConnection) -> None:
        """Subscribe again from each cursor (``last + 1``): no gap, no duplicate."""
        async with self._lock:
            self.connections += 1
            for run, last in list(self.cursors.items()):
                body = {"op": "subscribe", "run": run, "from_seq": last + 1}
                await socket.send_message(json.dumps(body))
            if self.watching:
                await socket.send_message(json.dumps({"op": "watch_runs"}))
            self._socket = socket

    async def _read(self, socket: WebSocketConnection) -> None:
        while True:
            message = json.loads(await socket.get_message())
            if message.get("type") == "event":
                run, seq = message.get("run"), message["event"]["seq"]
                last = self.cursors.get(run)
                if last is None or seq != last + 1:
                    # Not subscribed (any more), or already handed over before a drop.
                    continue
                await self._send.send(message)
                self.cursors[run] = seq
                continue
            await self._send.send(message)


@asynccontextmanager
async def open_live(
    base_url: str,
    *,
    auth_token: str | None = None,
    backoff: float = 0.1,
    max_backoff: float = 5.0,
    buffer: int = 256,
) -> AsyncIterator[Live]:
    """A ``Live`` connection to the daemon at ``base_url`` (``http://``, ``https://``, or
    ``unix:PATH`` for a daemon on a Unix socket), open for the block. trio only.

    Args:
      auth_token: the daemon's bearer token, when it was started with ``--auth-token``.
      backoff, max_backoff: the first wait before a reconnect, and the longest.
      buffer: messages held for the reader; a reader slower than that stops the connection's
        reading, and the daemon (which never waits on a reader) closes it: it is then resumed.
    """
    unix_socket = unix_socket_of(base_url)
    if unix_socket is not None:
        url = "ws://localhost/v1/ws"
    else:
        scheme, rest = base_url.rstrip("/").split("://", 1)
        url = f"{'wss' if scheme == 'https' else 'ws'}://{rest}/v1/ws"
    headers = [(b"authorization", f"Bearer {auth_token}".encode())] if auth_token else []
    live = Live(
        url,
        headers=headers,
        backoff=backoff,
        max_backoff=max_backoff,
        buffer=buffer,
        unix_socket=unix_socket,
    )
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(live._run)
            try:
                yield live
            finally:
                nursery.cancel_scope.cancel(reason="the live connection's block ended")
    except BaseExceptionGroup as group:
        # The block's own error (a refusal the iteration raised, say) comes out as itself.
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise


def _refusal(rejected: ConnectionRejected) -> SalvorError:
    try:
        error = json.loads(rejected.body or b"{}")["error"]
        return SalvorError(rejected.status_code, error["code"], error["message"])
    except (ValueError, KeyError, TypeError):
        return SalvorError(rejected.status_code, "handshake_refused", str(rejected))
