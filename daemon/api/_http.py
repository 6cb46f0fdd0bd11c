"""The Quart side of the handlers' plumbing: the error envelope and JSON as responses, the body of
the request in hand (under the app's deadline and cap), the bearer check.

The parsing itself is ``web``'s (``object_from``, ``bearer_matches``): this module only binds it to
Quart's request, so nothing below the HTTP API imports Quart (the CLI's runs do not load it).
"""

from __future__ import annotations

import json
from typing import Any

from quart import Response, request
from salvor.protocol import CodedError

from ..web import bearer_matches, object_from, read_body, unauthorized


def error_response(error: CodedError) -> Response:
    response = Response(
        json.dumps(error.to_json(), ensure_ascii=False),
        status=error.status,
        content_type="application/json",
    )
    if error.status == 408:
        # The rest of a stalled body is still unread: the connection cannot carry another request.
        response.headers["Connection"] = "close"
    return response


def json_response(body: Any, status: int = 200) -> Response:
    return Response(
        json.dumps(body, ensure_ascii=False), status=status, content_type="application/json"
    )


def check_bearer(expected: str | None) -> None:
    """Refuse unless the request carries the server's token."""
    if not bearer_matches(request.headers.get("Authorization", ""), expected):
        raise unauthorized()


async def body_bytes() -> bytes:
    """The Quart request's body (``_request_body.read_body``), under the app's ``BODY_TIMEOUT``.

    Raises:
        OperationRefused: request_timeout (408) or payload_too_large (413).
    """
    return await read_body(request.body, request.body_timeout)


async def json_object(
    *, allowed: set[str], required: set[str] = frozenset(), optional_body: bool = False
) -> dict:
    """The request body as a JSON object with only ``allowed`` keys.

    Raises:
        OperationRefused: bad_request for a wrong content type, invalid JSON,
            a non-object, an unknown field or a missing one.
    """
    return object_from(
        await body_bytes(),
        request.mimetype or "",
        allowed=allowed,
        required=required,
        optional_body=optional_body,
    )
