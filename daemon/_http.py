"""Request and response plumbing shared by every route: the one error envelope,
strict JSON bodies, bearer-token auth.

A refusal here happens before any route runs, so it records nothing.
"""

from __future__ import annotations

import hmac
import json
import math
from typing import Any

from quart import Response, request
from salvor.protocol import CodedError

from ._errors import OperationRefused, bad_request

MAX_BODY_BYTES = 8 * 1024 * 1024
# How long a request body may take to arrive whole (a client that stops sending mid-body).
BODY_TIMEOUT_SECONDS = 60
_ABSENT: Any = object()


def error_response(error: CodedError) -> Response:
    return Response(
        json.dumps(error.to_json(), ensure_ascii=False),
        status=error.status,
        content_type="application/json",
    )


def json_response(body: Any, status: int = 200) -> Response:
    return Response(json.dumps(body, ensure_ascii=False), status=status, content_type="application/json")


def unauthorized() -> OperationRefused:
    return OperationRefused(
        "unauthorized", 401, "this server requires `Authorization: Bearer <token>`; the token was missing or wrong"
    )


def bearer_matches(header: str, expected: str | None) -> bool:
    """Whether an ``Authorization`` header carries the server's token (constant-time compare)."""
    if expected is None:
        return True
    scheme, _, presented = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(presented.strip().encode(), expected.encode())


def check_bearer(expected: str | None) -> None:
    """Refuse unless the request carries the server's token."""
    if not bearer_matches(request.headers.get("Authorization", ""), expected):
        raise unauthorized()


class CappedBody:
    """Collects a request body, holding at most ``MAX_BODY_BYTES`` of it in memory.

    The rest of an oversized body is still read (and dropped) rather than
    left unread: most clients send their whole body before they read an
    answer, so they would otherwise never see the 413.
    """

    def __init__(self) -> None:
        self._data = bytearray()
        self._over = False

    def add(self, chunk: bytes) -> None:
        if not self._over:
            self._data.extend(chunk)
            if len(self._data) > MAX_BODY_BYTES:
                self._over = True
                self._data.clear()

    def whole(self) -> bytes:
        """The body. Raises OperationRefused(payload_too_large) when it was over the cap."""
        if self._over:
            raise OperationRefused("payload_too_large", 413, f"the body is over the {MAX_BODY_BYTES}-byte cap")
        return bytes(self._data)


async def body_bytes() -> bytes:
    """The request body (see ``CappedBody``)."""
    body = CappedBody()
    async for chunk in request.body:
        body.add(chunk)
    return body.whole()


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text} is out of range")
    return value


def parse_json(data: bytes) -> Any:
    """Strict JSON: no NaN or Infinity, finite numbers, no lone surrogates.

    Anything looser would pass here and fail later, where a value is hashed
    or stored (a 500 instead of a 400).

    Raises:
        OperationRefused: bad_request, naming what is wrong.
    """
    try:
        value = json.loads(data, parse_constant=_no_constant, parse_float=_finite)
        # A lone surrogate escape decodes, but no UTF-8 store or hash can carry it.
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except RecursionError:
        raise bad_request("the body is nested too deeply") from None
    except ValueError as exc:  # includes UnicodeError
        raise bad_request(f"the body is not valid JSON: {exc}") from None
    return value


async def json_object(*, allowed: set[str], required: set[str] = frozenset(), optional_body: bool = False) -> dict:
    """The request body as a JSON object with only ``allowed`` keys.

    Raises:
        OperationRefused: bad_request for a wrong content type, invalid JSON,
            a non-object, an unknown field or a missing one.
    """
    return object_from(await body_bytes(), request.mimetype or "", allowed=allowed, required=required,
                       optional_body=optional_body)


def object_from(data: bytes, mimetype: str, *, allowed: set[str], required: set[str] = frozenset(),
                optional_body: bool = False) -> dict:
    """``json_object`` on a body already read, with its media type (lower case, no parameters)."""
    if not data.strip():
        if optional_body:
            return {}
        raise bad_request("the request needs a JSON object body")
    if mimetype and mimetype != "application/json" and not mimetype.endswith("+json"):
        raise bad_request(f"the body must be application/json, not {mimetype}")
    body = parse_json(data)
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise bad_request(f"unknown field `{unknown[0]}`; this endpoint takes {', '.join(sorted(allowed)) or 'no fields'}")
    missing = sorted(required - set(body))
    if missing:
        raise bad_request(f"the body is missing `{missing[0]}`")
    return body
