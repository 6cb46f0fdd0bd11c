"""The HTTP clients model calls go out on, kept between drives: a run's calls reuse the
connections earlier runs opened, so a provider is not dialled (TCP and TLS) once per run.

A client is lent to one gateway at a time, whose calls go one after another, and is given back
when the gateway closes. One client shared by every drive at once was tried and cost more than
it saved: its connection pool's bookkeeping grows with its connections (1.9-2.0 ms a call
against 1.1-1.2 for a client per drive, 32 drives at once); a client per drive, kept for the
next, cost 0.8 ms.

A lent client carries nothing of a caller's: the key and the headers go with each request, and
its cookies are cleared when it comes back, so one agent's provider session never rides along
with another's calls. A client given back while a call of its was cut off holds no half-read
connection: httpx closes a connection whose request was cancelled.
"""

from __future__ import annotations

import httpx

from ..web import tls_context

# Idle clients kept at most: more drives than this at once make clients that are closed when
# they come back.
IDLE_AT_MOST = 64


class ModelClients:
    """Idle model HTTP clients, lent one to a gateway at a time."""

    def __init__(self, *, idle_at_most: int = IDLE_AT_MOST) -> None:
        self._idle: list[httpx.AsyncClient] = []
        self._idle_at_most = idle_at_most
        self._closed = False

    def lend(self) -> httpx.AsyncClient:
        """The most recently given back client (its connections the likeliest still open), or a
        new one. The timeout of each call is the gateway's, given with the request."""
        if self._idle:
            return self._idle.pop()
        return httpx.AsyncClient(verify=tls_context())

    async def give_back(self, client: httpx.AsyncClient) -> None:
        """Keep ``client`` for the next gateway, or close it (too many idle, or the pool closed)."""
        client.cookies.clear()
        if self._closed or len(self._idle) >= self._idle_at_most or client.is_closed:
            await client.aclose()
            return
        self._idle.append(client)

    async def aclose(self) -> None:
        """Close every idle client; a client lent now is closed when it comes back."""
        self._closed = True
        idle, self._idle = self._idle, []
        for client in idle:
            await client.aclose()
