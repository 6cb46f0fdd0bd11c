"""The shapes of the page's login over HTTP: the login's body (``POST /v1/session``) and the
session's answer (that route's and ``GET``'s), and the logout's answer (``DELETE``).

Declared once: the handlers read and answer with these, and the OpenAPI document is built from
them. Plain data, built at import.
"""

from __future__ import annotations

from typing import Any

from ..web import CSRF_HEADER, bad_request
from ._answers import Answer
from ._body import Body, Field
from ._schema import INSTANT, JSON


def _token(value: Any) -> str:
    if not isinstance(value, str):
        # Never quotes the value: a token sent in the wrong shape is still a token.
        raise bad_request("`token` must be a string")
    return value


LOGIN = Body(
    "SessionLogin",
    (
        Field(
            name="token",
            required=True,
            schema={"type": "string"},
            check=_token,
            description=(
                "The daemon's token (the value of the variable `salvor serve --auth-token` "
                "names). Sent here and only here: never in a URL."
            ),
        ),
    ),
)
SESSION = Answer(
    "Session",
    (
        Field(
            name="csrf",
            required=True,
            nullable=True,
            schema={"type": "string"},
            description=(
                f"What every state-changing request made with the session cookie sends as "
                f"`{CSRF_HEADER}`; keep it in memory only. Null when the caller needs no session "
                "(the daemon has no --auth-token, or the request came with the bearer token): "
                "nothing to send."
            ),
        ),
        Field(
            name="expires_at",
            required=True,
            nullable=True,
            schema=INSTANT,
            description=(
                "When the session ends (12 hours after the login; a restart of the daemon ends it "
                "sooner). Null when the caller needs no session."
            ),
        ),
    ),
    description="The caller's session.",
)
SESSION_ENDED = Answer(
    "SessionEnded",
    (
        Field(
            name="ended",
            required=True,
            schema={"type": "boolean"},
            description=(
                "Whether a live session was ended (false for a bearer caller, or a daemon with "
                "no --auth-token)."
            ),
        ),
    ),
    description="The logout's answer.",
)

SESSION_ANSWERS = (SESSION, SESSION_ENDED)
SESSION_SCHEMAS: JSON = {LOGIN.name: LOGIN.schema()}
