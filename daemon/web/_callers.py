"""Who may call the daemon: the bearer token, or a live session cookie with its CSRF token.

One rule for every guarded request (each ``/v1`` route, ``/metrics``, the WebSocket handshake and
the append front), whatever answers it:

* Without a server token, every caller is admitted and nothing below is checked.
* An ``Authorization`` header decides alone: the right bearer token admits the request, anything
  else is 401 ``unauthorized`` (a cookie beside a wrong header does not rescue it). A header is
  not ambient, so a bearer request needs no CSRF token.
* Otherwise the ``salvor_session`` cookie must name a live session (else 401). A browser sends a
  cookie with any request to the daemon's host, whoever wrote the page, so a cookie alone proves
  little: a WebSocket handshake must send an ``Origin`` (browsers always do), and a
  state-changing request (POST, PUT, PATCH, DELETE) must carry ``X-Salvor-CSRF`` equal to the
  session's token. Else 403 ``forbidden``.

Whose ``Origin`` and which ``Host`` are the listener's check (``_browsers``), made for every
request, with a token or without, before this one.
* A client that has given too many wrong bearer tokens lately is refused 429 ``too_many_requests``
  before its header is compared (``_throttle``); a cookie is no try of the token and is not counted.

A refusal here happens before anything reads the body or the store: it records nothing. No message
quotes what the caller sent (a mistyped token would otherwise land in a client's logs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from salvor.protocol import ErrorCode

from ._errors import OperationRefused
from ._requests import bearer_matches, unauthorized
from ._sessions import SESSION_COOKIE, Logins, Session
from ._throttle import FailedTries

CSRF_HEADER = "X-Salvor-CSRF"
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# A browser sends one cookie per (name, domain, path); a few more are another page's doing.
_MAX_SESSION_COOKIES = 4


@dataclass(frozen=True, slots=True, kw_only=True)
class Caller:
    """What the caller check reads of a request (each header None when it was not sent)."""

    method: str
    # The ASGI scope's: http, https, ws or wss.
    scheme: str
    authorization: str | None = None
    cookie: str | None = None
    csrf: str | None = None
    origin: str | None = None
    handshake: bool = False
    # The address the request came from (the ASGI scope's client), whose wrong tokens are counted.
    client: str | None = None

    @classmethod
    def of(
        cls,
        method: str,
        scheme: str,
        header: Callable[[str], str | None],
        *,
        handshake: bool = False,
        client: str | None = None,
    ) -> Caller:
        """A caller from a request's method, scheme and a header getter (case-insensitive), and
        the address it came from."""
        return cls(
            method=method.upper(),
            scheme=scheme,
            authorization=header("Authorization"),
            cookie=header("Cookie"),
            csrf=header(CSRF_HEADER),
            origin=header("Origin"),
            handshake=handshake,
            client=client,
        )

    def session_ids(self) -> list[str]:
        """The ``salvor_session`` values of the ``Cookie`` header, at most a few."""
        ids = []
        for part in (self.cookie or "").split(";"):
            name, found, value = part.strip().partition("=")
            if found and name == SESSION_COOKIE and value:
                ids.append(value.strip('"'))
        return ids[:_MAX_SESSION_COOKIES]


def peer_of(scope: dict) -> str | None:
    """The address an ASGI request came from (its scope's ``client``), None when there is none.

    Never the ``Remote-Addr`` header (what Quart's ``remote_addr`` reads): a caller writes that."""
    client = scope.get("client")
    return str(client[0]) if client else None


def forbidden(message: str) -> OperationRefused:
    return OperationRefused(ErrorCode.FORBIDDEN, message)


def _require_origin(caller: Caller, *, required: bool = False) -> None:
    """Refuse a request without an ``Origin`` when ``required`` (a cookie's WebSocket handshake).

    The value of one that was sent is the listener's to judge (``_browsers``), for every caller.

    Raises:
        OperationRefused: forbidden (403).
    """
    if caller.origin is None and required:
        raise forbidden(
            "a WebSocket handshake by the session cookie must send an `Origin` (a browser always "
            "does); the session cookie is only honoured from the daemon's own page"
        )


async def admit(
    caller: Caller, token: str | None, sessions: Logins, tries: FailedTries | None = None
) -> Session | None:
    """Admit the caller or refuse it; returns the session that admitted it (None for the bearer
    token, or when the server has no token). A wrong bearer token is counted in ``tries``.

    Raises:
        OperationRefused: unauthorized (401) without the right token or a live session;
            forbidden (403) for a session's handshake without an Origin or, when it changes
            state, without its CSRF token; too_many_requests (429, ``TooManyTries``) for a bearer
            header from a client that has given too many wrong tokens lately.
    """
    if token is None:
        return None
    if caller.authorization is not None:
        if tries is not None:
            tries.check(caller.client)
        if bearer_matches(caller.authorization, token):
            return None
        if tries is not None:
            tries.failed(caller.client)
        raise unauthorized()
    session = None
    for session_id in caller.session_ids():
        session = await sessions.find(session_id)
        if session is not None:
            break
    if session is None:
        raise unauthorized()
    _require_origin(caller, required=caller.handshake)
    if caller.method in STATE_CHANGING and not session.csrf_matches(caller.csrf):
        raise forbidden(
            f"a request that changes state with the session cookie must carry `{CSRF_HEADER}` "
            "with its session's csrf token (as POST or GET /v1/session answered it); it was "
            "missing or wrong"
        )
    return session
