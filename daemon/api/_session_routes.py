"""The page's login: ``POST /v1/session`` (the token in, a session cookie and its CSRF token out),
``GET /v1/session`` (a reloaded page gets its CSRF token back) and ``DELETE /v1/session`` (the
logout).

The cookie is ``HttpOnly`` (no script reads it), ``SameSite=Strict``, ``Path=/``, with the
session's lifetime as ``Max-Age``, and ``Secure`` when the request came over TLS. The token is
compared and forgotten: it is in no answer, log line, message or store. A refused login opens no
session and sets no cookie.

Without ``--auth-token`` there is nothing to log in to and the page works directly: the three routes
answer as for a caller that needs no session (``csrf`` and ``expires_at`` null, no cookie), so the
page's code is the same either way. The login still reads its body strictly (a malformed one is the
same 400). A bearer caller, who needs no session either, gets the same nulls from ``GET``.
"""

from __future__ import annotations

from quart import Response, g, request
from quart_trio import QuartTrio
from salvor.protocol import ErrorCode

from ..web import SESSION_COOKIE, OperationRefused, Session, bad_request, token_matches
from ._http import request_caller
from ._session_schemas import LOGIN, SESSION, SESSION_ENDED
from ._state import ServerState

LOGIN_PATH = "/v1/session"


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

    @app.post(LOGIN_PATH)
    async def log_in():
        if request.query_string:
            # A URL is written down by proxies, logs and histories: the token has no place there.
            raise bad_request(
                "POST /v1/session takes the token in its JSON body and nothing in its URL"
            )
        body = await LOGIN.read()
        if state.auth_token is None:
            return answer(None)
        if not token_matches(body["token"], state.auth_token):
            raise OperationRefused(
                ErrorCode.UNAUTHORIZED, "that is not this daemon's token; no session was opened"
            )
        # A login from a browser that still holds a session replaces it rather than piling up.
        for session_id in request_caller().session_ids():
            state.sessions.end(session_id)
        session = state.sessions.open()
        response = answer(session)
        cookie(response, session.id, int(state.sessions.seconds))
        return response

    @app.get(LOGIN_PATH)
    async def current_session():
        # Admitted already (the caller check): by its cookie, or by the bearer token, which needs
        # no session and no csrf token (the nulls).
        return answer(g.get("session"))

    @app.delete(LOGIN_PATH)
    async def log_out():
        session = g.get("session")
        ended = session is not None and state.sessions.end(session.id)
        response = SESSION_ENDED.respond(ended=ended)
        if session is not None:
            cookie(response, "", 0)
        return response
