"""An ASGI front that answers the client-driven append itself, ahead of Quart.

``POST /v1/client-runs/{id}/events`` is the hot path of a client-driven run:
one request per event a client's cursor produces. Through Quart it cost
about 0.8 ms of the trio thread per request on a 2-core machine (a task per
request, the body handed between tasks under a timeout, the request
context); answered here, about 0.56 ms behind hypercorn's own connection
handler and about 0.4 ms behind the daemon's listener (``_http_server.py``),
most of it the HTTP stack's (measured with ``tests/bench/bench_client_runs.py``).

It answers exactly as the Quart route would (the listener has held it to the browser rules, its
Host and Origin, as every request): the caller check first (the bearer token, or the page's
session cookie with its CSRF token: ``web.admit``, as the app's hook applies it), then
the run and its drive token, then the body (the same reader, so the same
deadline and 8 MB cap; strict JSON; an object with only ``events``), the
same error envelope, and a bug as the same 500. Every other request passes
through to the app untouched.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from salvor.protocol import CodedError

from ..web import (
    HTTP_WORDING,
    Caller,
    Disconnected,
    TooManyTries,
    admit,
    asgi_chunks,
    internal,
    media_type,
    peer_of,
    read_body,
)
from ._client_run_bodies import APPEND_EVENTS
from ._state import ServerState

log = logging.getLogger("salvor.api")


def append_target(scope: dict) -> str | None:
    """The run id segment when the request is ``POST /v1/client-runs/{id}/events``, else None."""
    if scope["type"] != "http" or scope["method"] != "POST":
        return None
    parts = scope["path"].split("/")
    if (
        len(parts) == 5
        and parts[:3] == ["", "v1", "client-runs"]
        and parts[4] == "events"
        and parts[3]
    ):
        return parts[3]
    return None


class AppendFront:
    """The ASGI app ``salvor serve`` runs: the append path here, the rest to ``app``."""

    def __init__(self, app: Any, state: ServerState) -> None:
        self._app = app
        self._state = state

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        run_id = append_target(scope)
        if run_id is None:
            await self._app(scope, receive, send)
            return
        retry_after = None
        try:
            status, body = 200, await self._append(scope, receive, run_id)
        except Disconnected:
            return
        except TooManyTries as error:
            status, body = error.status, error.to_json(HTTP_WORDING)
            retry_after = error.retry_after
        except CodedError as error:
            status, body = error.status, error.to_json(HTTP_WORDING)
        except Exception:
            log.exception("unexpected error on POST %s", scope["path"])
            error = internal()
            status, body = error.status, error.to_json()
        payload = json.dumps(body, ensure_ascii=False).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
        ]
        if status == 408:
            # The rest of a stalled body is still unread: the
            # connection cannot carry another request.
            headers.append((b"connection", b"close"))
        if retry_after is not None:
            headers.append((b"retry-after", str(retry_after).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    async def _append(self, scope: dict, receive: Any, run_id: str) -> dict:
        headers: dict[bytes, bytes] = {}
        for name, value in scope["headers"]:
            headers.setdefault(name.lower(), value)
        if self._state.auth_token is not None:

            def header(name: str) -> str | None:
                value = headers.get(name.lower().encode("latin-1"))
                return None if value is None else value.decode("latin-1")

            caller = Caller.of("POST", scope.get("scheme", "http"), header, client=peer_of(scope))
            await admit(
                caller, self._state.auth_token, self._state.sessions, self._state.failed_tries
            )
        client_runs = self._state.client_runs
        token = headers.get(b"x-drive-token")
        run_id = await client_runs.driving(
            run_id, None if token is None else token.decode("latin-1")
        )
        data = await read_body(
            asgi_chunks(receive),
            self._state.body_timeout_seconds,
            cap=self._state.max_payload_bytes,
        )
        mimetype = media_type(headers.get(b"content-type", b"").decode("latin-1"))
        return await client_runs.append(run_id, APPEND_EVENTS.from_bytes(data, mimetype))
