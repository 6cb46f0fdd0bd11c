"""Request and response plumbing shared by every route: the one error envelope,
bodies read under a deadline and a cap, strict JSON, bearer-token auth.

A refusal here happens before any route runs, so it records nothing.
"""

from __future__ import annotations

import hmac
import json
import re
from typing import Any

from quart import Response, request
from salvor.protocol import CodedError, ErrorCode, MalformedJson, excerpt, parse_strict

from ._errors import OperationRefused, bad_request
from ._request_body import read_body

_ABSENT: Any = object()


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


# ASCII digits only, and few enough for the store's 64-bit integers: int() alone would take
# "+5", " 5", "5_000" and other scripts' digits ("١٢").
_WHOLE_NUMBER = re.compile(r"[0-9]{1,18}")


def whole_number(text: str) -> int | None:
    """A query parameter or header as a non-negative integer; None when it is
    not ASCII digits (at most 18)."""
    return int(text) if _WHOLE_NUMBER.fullmatch(text) else None


def unauthorized() -> OperationRefused:
    return OperationRefused(
        ErrorCode.UNAUTHORIZED,
        "this server requires `Authorization: Bearer <token>`; the token was missing or wrong",
    )


def bearer_matches(header: str, expected: str | None) -> bool:
    """Whether an ``Authorization`` header carries the server's token (constant-time compare)."""
    if expected is None:
        return True
    scheme, _, presented = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        presented.strip().encode(), expected.encode()
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


def parse_json(data: bytes) -> Any:
    """A caller's JSON body by the strict, bounded parser (``salvor.protocol.parse_strict``).

    Anything looser would pass here and fail later, where a value is hashed,
    walked or stored (a 500, or a run that crashes every time it is driven).

    Raises:
        OperationRefused: bad_request, naming what is wrong.
    """
    try:
        return parse_strict(data, "the body")
    except MalformedJson as exc:
        raise bad_request(exc.message) from None


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


def object_from(
    data: bytes,
    mimetype: str,
    *,
    allowed: set[str],
    required: set[str] = frozenset(),
    optional_body: bool = False,
) -> dict:
    """``json_object`` on a body already read, with its media type (lower case, no parameters)."""
    if not data.strip():
        if optional_body:
            return {}
        raise bad_request("the request needs a JSON object body")
    if mimetype and mimetype != "application/json" and not mimetype.endswith("+json"):
        raise bad_request(f"the body must be application/json, not {excerpt(mimetype)}")
    body = parse_json(data)
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise bad_request(
            f"unknown field `{excerpt(unknown[0])}`; this endpoint takes "
            f"{', '.join(sorted(allowed)) or 'no fields'}"
        )
    missing = sorted(required - set(body))
    if missing:
        raise bad_request(f"the body is missing `{missing[0]}`")
    return body
