"""How many long-lived streams (``/v1/ws`` connections, ``GET /v1/runs/{id}/events`` streams) one
client holds open at once, capped.

A client is its peer address: the IP of a TCP peer, and on a Unix socket the socket itself (its
peers have no address; every local process allowed to open it is one client). On the loopback
default every local process is one client too: the cap bounds what the daemon holds for one
address (a file descriptor, a buffer and about a page of log each), not who is behind it. A
stream over the cap is refused before it starts (``too_many_requests``, 429, with
``Retry-After``), so nothing is subscribed and nothing read.
"""

from __future__ import annotations

from collections import Counter

from quart import Response
from salvor.protocol import ErrorCode

from ..runs import MAX_STREAMS_PER_CLIENT
from ..web import OperationRefused
from ._http import error_response
from ._operation import error

# What a refused client is told to wait before it tries again: a slot frees when one of its own
# streams ends, which it knows better than the daemon.
RETRY_AFTER_SECONDS = 5
_UNIX_PEER = "unix socket"

# The refusal as the OpenAPI document declares it, on every streaming route.
TOO_MANY_STREAMS = {
    **error(
        "The client (its peer address) already holds as many event streams and WebSockets "
        "as `--max-streams-per-client` allows (`too_many_requests`); nothing was opened.",
        "too_many_requests",
    ),
    "headers": {
        "Retry-After": {
            "description": "Seconds to wait before trying again.",
            "schema": {"type": "integer", "minimum": 0},
        }
    },
}


class StreamSlot:
    """One open stream's place; ``release`` gives it back (idempotent)."""

    __slots__ = ("_peer", "_slots")

    def __init__(self, slots: StreamSlots, peer: str) -> None:
        self._slots: StreamSlots | None = slots
        self._peer = peer

    def release(self) -> None:
        if self._slots is not None:
            self._slots._release(self._peer)
            self._slots = None


class StreamSlots:
    """Open streams per peer address, at most ``cap`` each (0: no cap)."""

    def __init__(self, cap: int = MAX_STREAMS_PER_CLIENT) -> None:
        self.cap = cap
        self._open: Counter[str] = Counter()

    def take(self, remote_addr: str | None) -> StreamSlot | Response:
        """A slot for a stream of the peer at ``remote_addr`` (None or empty: a Unix socket's),
        or the 429 answer that refuses it (nothing taken)."""
        peer = remote_addr or _UNIX_PEER
        if self.cap and self._open[peer] >= self.cap:
            response = error_response(
                OperationRefused(
                    ErrorCode.TOO_MANY_REQUESTS,
                    f"this client already has {self.cap} event streams and WebSockets open, "
                    "the most --max-streams-per-client allows; close one first",
                )
            )
            response.headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
            return response
        self._open[peer] += 1
        return StreamSlot(self, peer)

    def open_count(self, remote_addr: str | None) -> int:
        return self._open[remote_addr or _UNIX_PEER]

    def _release(self, peer: str) -> None:
        self._open[peer] -= 1
        if self._open[peer] <= 0:
            del self._open[peer]
