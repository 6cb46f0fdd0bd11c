"""The page's login: ``POST /v1/session`` (the token in, a session cookie and its CSRF token out),
``GET /v1/session`` (a reloaded page gets its CSRF token back) and ``DELETE /v1/session`` (the
logout).

The cookie is ``HttpOnly`` (no script reads it), ``SameSite=Strict``, ``Path=/``, with the
session's lifetime as ``Max-Age``, and ``Secure`` when the request came over TLS. The token is
compared and forgotten: it is in no answer, log line, message or store. A refused login opens no
session and sets no cookie. A wrong token counts against the client's tries (``web._throttle``);
once they are spent, a login is 429 before its token is compared.

Without ``--auth-token`` there is nothing to log in to and the page works directly: the three routes
answer as for a caller that needs no session (``csrf`` and ``expires_at`` null, no cookie), so the
page's code is the same either way. The login still reads its body strictly (a malformed one is the
same 400). A bearer caller, who needs no session either, gets the same nulls from ``GET``.
"""

from __future__ import annotations

from quart import Response, g, request
from quart_trio import QuartTrio
from salvor.protocol import ErrorCode

from ..web import SESSION_COOKIE, OperationRefused, Session, bad_request, peer_of, token_matches
from ._http import request_caller
from ._operation import Operation, error, parameter, route
from ._session_schemas import LOGIN, SESSION, SESSION_ENDED
from ._state import ServerState

LOGIN_PATH = "/v1/session"

_NO_SESSION = error(
    "The daemon has a token and the request carries neither the bearer token nor a live session "
    "cookie (none, ended, or expired).",
    "unauthorized",
)
LOG_IN = Operation(
    method="post",
    rule=LOGIN_PATH,
    operation_id="logIn",
    tag="session",
    summary="Log in with the daemon's token: a session cookie and its csrf token",
    description=(
        f"The token goes in the body, never in the URL (any query string is a 400). The answer "
        f"sets `{SESSION_COOKIE}` (HttpOnly, SameSite=Strict, Path=/, Max-Age of 12 hours, Secure "
        "over TLS); a session cookie the request still carried is ended. Sessions live in the "
        "store (every daemon over it honours them; a restart ends none), at most 1,024 (a login "
        "past that ends the oldest). Needs no authentication, but an `Origin`, if sent, must be "
        "the daemon's own (or one given with --allow-origin). "
        "Without --auth-token there is no session: any token answers nulls and no cookie. "
        "A wrong token counts against the client's tries (429 `too_many_requests` once they "
        "are spent)."
    ),
    open=True,
    body=LOGIN,
    answers={"200": ("The session (and `Set-Cookie`).", SESSION)},
    refusals=("BadRequest", "PayloadTooLarge"),
    responses={
        "401": error("That is not the daemon's token. No session, no cookie.", "unauthorized"),
        "403": error(
            "Sent from a page of another origin (an `Origin` that is not the daemon's own), or "
            "naming another host in `Host`. No session, no cookie.",
            "forbidden",
        ),
    },
)
READ_SESSION = Operation(
    method="get",
    rule=LOGIN_PATH,
    operation_id="getSession",
    tag="session",
    summary="The session the cookie names, so a reloaded page gets its csrf token back",
    description=(
        "A bearer caller (or any caller of a daemon without --auth-token) needs no session: it is "
        "answered nulls."
    ),
    answers={"200": ("The session.", SESSION)},
    responses={"401": _NO_SESSION},
)
LOG_OUT = Operation(
    method="delete",
    rule=LOGIN_PATH,
    operation_id="logOut",
    tag="session",
    summary="End the session the cookie names, and clear the cookie",
    parameters=(parameter("Csrf"),),
    answers={"200": ("Whether a session was ended.", SESSION_ENDED)},
    responses={"401": _NO_SESSION},
)
OPERATIONS = (LOG_IN, READ_SESSION, LOG_OUT)


def add_session_routes(app: QuartTrio, state: ServerState) -> None:
    def answer(session: Session | None) -> Response:
        if session is None:
            response = SESSION.respond(csrf=None, expires_at=None)
        else:
            response = SESSION.respond(csrf=session.csrf, expires_at=session.expires_at())
        # The csrf token is for this page's memory, not for a cache between it and the daemon.
        response.headers["Cache-Control"] = "no-store"
        return response

    def cookie(response: Response, value: str, max_age: int) -> None:
        response.set_cookie(
            SESSION_COOKIE,
            value,
            max_age=max_age,
            path="/",
            httponly=True,
            samesite="Strict",
            secure=request.scheme == "https",
        )

    @route(app, LOG_IN)
    async def log_in():
        if request.query_string:
            # A URL is written down by proxies, logs and histories: the token has no place there.
            raise bad_request(
                "POST /v1/session takes the token in its JSON body and nothing in its URL"
            )
        body = await LOGIN.read()
        if state.auth_token is None:
            return answer(None)
        client = peer_of(request.scope)
        state.failed_tries.check(client)
        if not token_matches(body["token"], state.auth_token):
            state.failed_tries.failed(client)
            raise OperationRefused(
                ErrorCode.UNAUTHORIZED, "that is not this daemon's token; no session was opened"
            )
        # A login from a browser that still holds a session replaces it rather than piling up.
        for session_id in request_caller().session_ids():
            await state.sessions.end(session_id)
        session = await state.sessions.open()
        response = answer(session)
        cookie(response, session.id, int(state.sessions.seconds))
        return response

    @route(app, READ_SESSION)
    async def current_session():
        # Admitted already (the caller check): by its cookie, or by the bearer token, which needs
        # no session and no csrf token (the nulls).
        return answer(g.get("session"))

    @route(app, LOG_OUT)
    async def log_out():
        session = g.get("session")
        ended = session is not None and await state.sessions.end(session.id)
        response = SESSION_ENDED.respond(ended=ended)
        if session is not None:
            cookie(response, "", 0)
        return response
