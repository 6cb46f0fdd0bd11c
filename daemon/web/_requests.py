"""A caller's request, read without a framework: strict JSON bodies as objects of known fields,
whole-number parameters, the bearer token.

Used by the Quart handlers (through ``api``) and by the raw ASGI routes below them alike, so both
refuse the same input with the same words. A refusal here records nothing.
"""

from __future__ import annotations

import hmac
import re
from typing import Any

from salvor.protocol import ErrorCode, MalformedJson, excerpt, parse_strict

from ._browsers import json_media_type
from ._errors import OperationRefused, bad_request

# The shortest server token the daemon starts with (issue 29): 128 bits at the least, beyond
# guessing however fast wrong tries are answered.
MIN_TOKEN_BYTES = 16

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
        "this server requires `Authorization: Bearer <token>` or a live session cookie (log in "
        "with POST /v1/session); the token was missing or wrong, or the session has ended",
    )


def bearer_matches(header: str, expected: str | None) -> bool:
    """Whether an ``Authorization`` header carries the server's token (constant-time compare)."""
    if expected is None:
        return True
    scheme, _, presented = header.partition(" ")
    return scheme.lower() == "bearer" and token_matches(presented.strip(), expected)


def token_matches(presented: str, expected: str) -> bool:
    """Whether ``presented`` is the server's token (constant-time compare)."""
    return hmac.compare_digest(presented.encode("utf-8", "surrogateescape"), expected.encode())


def parse_json(data: bytes, *, nul: bool = False) -> Any:
    """A caller's JSON body by the strict, bounded parser (``salvor.protocol.parse_strict``).

    Anything looser would pass here and fail later, where a value is hashed,
    walked or stored (a 500, or a run that crashes every time it is driven).

    Raises:
        OperationRefused: bad_request, naming what is wrong.
    """
    try:
        return parse_strict(data, "the body", nul=nul)
    except MalformedJson as exc:
        raise bad_request(exc.message) from None


def object_from(
    data: bytes,
    mimetype: str,
    *,
    allowed: set[str],
    required: set[str] = frozenset(),
    optional_body: bool = False,
    nul: bool = False,
) -> dict:
    """``json_object`` on a body already read, with its media type (lower case, no parameters).

    An empty body needs no media type; any other must say it is JSON (``_browsers``). ``nul``:
    ``parse_strict``'s, for a caller that checks the strings itself.
    """
    if not data.strip():
        if optional_body:
            return {}
        raise bad_request("the request needs a JSON object body")
    json_media_type(mimetype)
    body = parse_json(data, nul=nul)
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
