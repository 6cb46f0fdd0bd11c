"""Reading a request body: one deadline for the whole body and one size cap, for every route.

The Quart routes (``_http.body_bytes``), the append front, the loopback
model proxy and the MCP stand-ins all read their bodies here, so a client
that stops sending mid-body is answered on every route, in each route's own
error format, instead of holding its request open forever.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator

import trio
from salvor.protocol import DEFAULT_MAX_PAYLOAD_BYTES, ErrorCode

from ._errors import OperationRefused, request_timeout

# The control plane's default cap on a request body: the one payload limit, also a stored event's
# (``salvor serve --max-payload-bytes`` sets both; serve hands its value in).
MAX_BODY_BYTES = DEFAULT_MAX_PAYLOAD_BYTES
# How long a request body may take to arrive whole (a client that stops sending mid-body);
# the default of the daemon's ``body_timeout_seconds`` setting.
BODY_TIMEOUT_SECONDS = 60.0


class Disconnected(Exception):
    """The client went away before its body was whole: nobody is left to answer."""


class CappedBody:
    """Collects a request body, holding at most ``cap`` bytes of it in memory.

    The rest of an oversized body is still read (and dropped) rather than
    left unread: most clients send their whole body before they read an
    answer, so they would otherwise never see the 413.
    """

    def __init__(self, cap: int = MAX_BODY_BYTES, *, payload_limit: bool = True) -> None:
        self._cap = cap
        # Whether the cap is the operator's payload limit (the API's), which the refusal names,
        # or a fixed bound of its own (a proxy's).
        self._payload_limit = payload_limit
        self._data = bytearray()
        self._over = False

    def add(self, chunk: bytes) -> None:
        if not self._over:
            self._data.extend(chunk)
            if len(self._data) > self._cap:
                self._over = True
                self._data.clear()

    @property
    def over(self) -> bool:
        """Whether the body has gone past the cap."""
        return self._over

    def whole(self) -> bytes:
        """The body. Raises OperationRefused(payload_too_large) when it was over the cap."""
        if self._over and not self._payload_limit:
            raise OperationRefused(
                ErrorCode.PAYLOAD_TOO_LARGE, f"the body is over the {self._cap}-byte cap"
            )
        if self._over:
            raise OperationRefused(
                ErrorCode.PAYLOAD_TOO_LARGE,
                f"the body is over the limit of {self._cap} bytes per payload "
                "(salvor serve --max-payload-bytes)",
                details={"limit": "max_payload_bytes", "value": self._cap},
            )
        return bytes(self._data)


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


async def read_body(
    chunks: AsyncIterator[bytes],
    deadline_seconds: float | None = BODY_TIMEOUT_SECONDS,
    *,
    cap: int = MAX_BODY_BYTES,
    drain: bool = True,
    payload_limit: bool = True,
) -> bytes:
    """The whole body of a request from its chunks, under one deadline and the size cap.

    With ``drain`` the rest of an oversized body is read and dropped before
    the 413 (see ``CappedBody``); without it reading stops at the cap.
    ``payload_limit``: ``cap`` is the operator's payload limit, and the 413 names it; a proxy's
    own bound passes False.

    Raises:
        OperationRefused: request_timeout (408) when the body did not arrive
            whole within ``deadline_seconds`` (None: no deadline);
            payload_too_large (413) when it is over ``cap``.
            Whatever ``chunks`` raises (``Disconnected``) passes through.
            Either way nothing of the body has been used.
    """
    body = CappedBody(cap, payload_limit=payload_limit)
    with trio.move_on_after(math.inf if deadline_seconds is None else deadline_seconds):
        async for chunk in chunks:
            body.add(chunk)
            if not drain and body.over:
                break
        return body.whole()
    raise request_timeout(deadline_seconds)
