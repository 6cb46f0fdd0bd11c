"""What every bare ASGI app of the daemon shares (the append front, the loopback proxy,
the MCP stand-in ports): the lifespan handshake and a request's body chunks."""

from __future__ import annotations

from collections.abc import AsyncIterator


class Disconnected(Exception):
    """The client went away before its body was whole: nobody is left to answer."""


async def asgi_chunks(receive) -> AsyncIterator[bytes]:
    """The chunks of an ASGI request's body, in order, until the last one.

    Raises:
        Disconnected: the client left first.
    """
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Disconnected
        yield message.get("body", b"")
        if not message.get("more_body", False):
            return


async def answer_lifespan(receive, send) -> None:
    """Take part in hypercorn's lifespan handshake: nothing to start, nothing to stop."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
