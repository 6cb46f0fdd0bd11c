"""The Quart side of the handlers' plumbing: the error envelope and JSON as responses, the body of
the request in hand (under the app's deadline and cap), the caller check.

The parsing itself is ``web``'s (``object_from``, ``admit``): this module only binds it to Quart's
request, so nothing below the HTTP API imports Quart (the CLI's runs do not load it).
"""

from __future__ import annotations

import json
from typing import Any

from quart import Response, current_app, request, websocket
from salvor.protocol import CodedError, ErrorCode

from ..web import (
    HTTP_WORDING,
    MAX_BODY_BYTES,
    Caller,
    FailedTries,
    Logins,
    OperationRefused,
    Session,
    TooManyTries,
    admit,
    object_from,
    peer_of,
    read_body,
)


def error_response(error: CodedError) -> Response:
    response = Response(
        json.dumps(error.to_json(HTTP_WORDING), ensure_ascii=False),
        status=error.status,
        content_type="application/json",
    )
    if error.status == 408:
        # The rest of a stalled body is still unread: the connection cannot carry another request.
        response.headers["Connection"] = "close"
    if isinstance(error, TooManyTries):
        response.headers["Retry-After"] = str(error.retry_after)
    return response


def json_response(body: Any, status: int = 200) -> Response:
    return Response(
        json.dumps(body, ensure_ascii=False), status=status, content_type="application/json"
    )


def request_caller() -> Caller:
    """The Quart request in hand, as the caller check reads it."""
    return Caller.of(
        request.method, request.scheme, request.headers.get, client=peer_of(request.scope)
    )


async def authenticate(
    token: str | None, sessions: Logins, tries: FailedTries | None = None
) -> Session | None:
    """Admit the Quart request in hand by the bearer token or a live session cookie (``web.admit``:
    a cookie's state-changing request also needs its CSRF token and its own Origin); returns the
    session that admitted it, None for the bearer token or a server without one.

    Raises:
        OperationRefused: unauthorized (401), forbidden (403) or too_many_requests (429); nothing
            has been read or recorded.
    """
    return await admit(request_caller(), token, sessions, tries)


async def authenticate_handshake(
    token: str | None, sessions: Logins, tries: FailedTries | None = None
) -> Session | None:
    """``authenticate`` for the WebSocket handshake in hand: by cookie, its Origin must be sent and
    be the daemon's own.

    Raises:
        OperationRefused: unauthorized (401), forbidden (403) or too_many_requests (429); the
            connection is not upgraded.
    """
    caller = Caller.of(
        "GET",
        websocket.scheme,
        websocket.headers.get,
        handshake=True,
        client=peer_of(websocket.scope),
    )
    return await admit(caller, token, sessions, tries)


async def body_bytes(cap: int | None = None, what: str = "") -> bytes:
    """The Quart request's body (``_request_body.read_body``), under the app's ``BODY_TIMEOUT``.

    ``cap``: a route's own bound, below the daemon's cap on every body; its 413 says ``what``
    is bounded (``"an agent definition"``) and the bound.

    Raises:
        OperationRefused: request_timeout (408) or payload_too_large (413).
    """
    limit = current_app.config.get("SALVOR_MAX_PAYLOAD_BYTES", MAX_BODY_BYTES)
    if cap is None or cap >= limit:
        return await read_body(request.body, request.body_timeout, cap=limit)
    try:
        return await read_body(request.body, request.body_timeout, cap=cap)
    except OperationRefused as exc:
        if exc.code is not ErrorCode.PAYLOAD_TOO_LARGE:
            raise
        raise OperationRefused(
            ErrorCode.PAYLOAD_TOO_LARGE, f"{what} may be at most {cap} bytes; this body is over it"
        ) from None


async def json_object(
    *, allowed: set[str], required: set[str] = frozenset(), optional_body: bool = False
) -> dict:
    """The request body as a JSON object with only ``allowed`` keys.

    Raises:
        OperationRefused: unsupported_media_type (415) for a body not sent as JSON;
            bad_request for invalid JSON, a non-object, an unknown field or a missing one.
    """
    return object_from(
        await body_bytes(),
        request.mimetype or "",
        allowed=allowed,
        required=required,
        optional_body=optional_body,
    )
