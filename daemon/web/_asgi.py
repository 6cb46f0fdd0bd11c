"""What every bare ASGI app of the daemon shares (the loopback proxy, the MCP stand-in ports)."""

from __future__ import annotations


async def answer_lifespan(receive, send) -> None:
    """Take part in hypercorn's lifespan handshake: nothing to start, nothing to stop."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
